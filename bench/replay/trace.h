// Mooncake-format request traces (../shared/data/README.md): one JSON object per line with
// timestamp (ms), input_length, output_length (tokens) and hash_ids, the prefix block hashes of
// the request, one per 512-token block.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpool::bench {

struct TraceRequest {
  uint64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

struct Trace {
  std::vector<TraceRequest> requests;
  uint64_t total_blocks = 0;
  uint64_t distinct_blocks = 0;
};

// Reads a trace file. Throws std::runtime_error naming the file, line and field on bad input.
Trace load_trace(const std::string& path);

}  // namespace kvpool::bench

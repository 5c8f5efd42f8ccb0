// Mooncake-format request traces (../shared/data/README.md): one JSON object per line with
// timestamp (ms), input_length, output_length (tokens) and hash_ids, the prefix block hashes of
// the request, one per 512-token block.
//
// Optional client hints per request (kvpool's generated traces set them; kvpool-replay passes
// them to the pool for policies named NAME+hints):
//   "priority": "none" | "one_off" | "conversation" | "system"   for the request's blocks,
//   "system_blocks": k        the first k blocks are a shared system prompt (Priority::system),
//   "pin_ttl_ms": ms          pin the request's blocks this long after it was served.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/types.h"

namespace kvpool::bench {

struct TraceRequest {
  uint64_t timestamp_ms = 0;
  uint64_t input_length = 0;
  uint64_t output_length = 0;
  std::vector<uint64_t> hash_ids;
  Priority priority = Priority::none;
  uint32_t system_blocks = 0;
  uint32_t pin_ttl_ms = 0;
};

struct Trace {
  std::vector<TraceRequest> requests;
  uint64_t total_blocks = 0;
  uint64_t distinct_blocks = 0;
  bool has_hints = false;  // some request carries a hint
};

// Parses a priority class name; false when unknown.
bool parse_priority(std::string_view name, Priority& out);

// Reads a trace file. Throws std::runtime_error naming the file, line and field on bad input.
Trace load_trace(const std::string& path);

}  // namespace kvpool::bench

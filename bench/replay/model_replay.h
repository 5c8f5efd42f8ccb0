// Replay of a trace through a running kvpoold serving a hybrid model (pools[].groups), or a
// plain pool as the all-full baseline, by one worker in trace order (ModelConnection); with
// several daemons (a fleet, each its own node), the requests go round-robin over them:
//   1. lookup_groups of the request's chain: the hit every group can serve (hit_rate);
//   2. in every group, one page for each block past the hit, allocated and published (a block
//      another request published meanwhile is answered with that page);
//   3. what the sequence holds while it decodes, as an engine's SequenceCache would keep it: a
//      full group every block, a sliding or chunked group only its window's (the blocks before
//      are published and released as the sequence passes them, so they stay cached for others);
//      then everything released, tail first.
// It reports the hit rate, and the bytes a sequence holds at its end against what every layer
// keeping every block would take: the concurrency a budget holds is budget / those bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/replay.h"
#include "bench/replay/trace.h"

namespace kvpool::bench {

struct ModelReplayResult {
  std::string model;
  std::vector<std::string> groups;  // "local: sliding 128, 1 KiB pages", ...
  uint64_t budget_bytes = 0;  // every group's pool memory now, all daemons (elastic: capacity)
  uint64_t requests = 0;
  uint64_t blocks = 0;          // pages asked for, all requests (one per page_tokens tokens)
  uint64_t hit_blocks = 0;      // of those, the hybrid hits
  uint64_t held_bytes = 0;      // what the sequences held at their ends, all together
  uint64_t all_full_bytes = 0;  // the same sequences with every group keeping every block
  uint64_t alloc_failures = 0;  // pages no group could give (the request went on without)
  uint64_t remote_bytes = 0;    // bytes of the pages hits answered from the remote tier
  uint64_t remote_blocks = 0;   // hit blocks for which a group's page came from it
  double seconds = 0;
  double hit_rate() const { return blocks == 0 ? 0.0 : double(hit_blocks) / double(blocks); }
};

// Throws std::runtime_error naming the cause (daemon unreachable, a call failed). With
// pace_us_per_page, each request is followed by that long a wait per page it computed (its
// prefill, during which the daemons' background work runs); 0: none.
ModelReplayResult replay_model(const Trace& trace, const std::vector<std::string>& sockets,
                               uint32_t page_tokens, uint32_t pace_us_per_page = 0);

}  // namespace kvpool::bench

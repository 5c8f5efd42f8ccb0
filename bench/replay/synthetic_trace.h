// A generated request trace with client hints, to measure what hints are worth: the shared
// Mooncake trace carries none. Three kinds of request arrive as one Poisson stream:
//   assistant     one of a few shared system prompts (Zipf-popular) + a short one-off question;
//                 hints: system_blocks = the prompt's blocks, priority one_off for the rest;
//   conversation  a turn of a multi-turn chat: the previous turn's blocks + a few new ones; a
//                 chat has a geometric number of turns separated by exponential think times;
//                 hints: priority conversation, pinned for the mean think time;
//   document      a long one-off prompt (a scan that LRU lets flush the cache);
//                 hints: priority one_off.
// Deterministic for a seed. Block ids are unique per distinct prefix, as in Mooncake's format.
#pragma once

#include <cstdint>

#include "bench/replay/trace.h"

namespace kvpool::bench {

struct SyntheticTraceOptions {
  uint32_t requests = 4000;
  uint64_t seed = 1;
  double requests_per_second = 4.0;
  uint32_t system_prompts = 8;
  uint32_t system_prompt_blocks = 8;
  double assistant_share = 0.4;
  double conversation_share = 0.35;  // the rest are documents
  double mean_turns = 6.0;
  double mean_think_seconds = 60.0;
};

Trace synthetic_trace(const SyntheticTraceOptions& options);

}  // namespace kvpool::bench

// Replay of a trace through a running kvpoold by N worker processes (libkvpool connections),
// with the same per-request steps as replay.h: lookup of the chain, one-hash lookup or alloc +
// publish for each remaining page, release last page first.
//
// Ordered mode (the default) passes a token around the workers so that requests run one at a
// time in trace order, each in the worker whose turn it is: the pool sees exactly the sequence
// of operations of the in-process replay, so the hit rate must be equal. Concurrent mode lets the
// workers run freely (each takes every N-th request): a throughput figure, with a hit rate close
// to but not exactly the sequential one.
//
// The pool must start empty and be the daemon's default pool; its page count divided by
// 512 / page_tokens is the capacity in blocks (the first daemon's, with several).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/replay.h"

namespace kvpool::bench {

struct LatencySummary {
  uint64_t calls = 0;
  double p50_us = 0;
  double p99_us = 0;
  // A bare Unix-socket ping-pong of the same message sizes, measured after the replay.
  uint32_t request_bytes = 0;
  uint32_t reply_bytes = 0;
  double baseline_p50_us = 0;
  double baseline_p99_us = 0;
};

struct DaemonReplayResult {
  ReplayResult replay;  // hit rate, counts, seconds (wall clock of the whole replay)
  uint32_t workers = 0;
  bool ordered = true;
  LatencySummary alloc, release, lookup;  // round trips as the workers saw them
  // A pool that converts its evictions into an 8-bit pool (convert_evictions_to): its counters
  // after the replay (lookups then find blocks there too, so the hit rate is no longer the
  // in-process replay's).
  uint64_t converted_pages = 0;
  uint64_t converted_back_pages = 0;
  // The pools' remote tiers (remote_tier), all daemons together, after the replay.
  uint64_t remote_hit_pages = 0;
  uint64_t remote_stored_pages = 0;
  uint32_t daemons = 1;
};

struct DaemonReplayOptions {
  // The daemons: worker w attaches to sockets[w % sockets.size()], so with a worker count that is
  // a multiple of theirs the requests go round-robin over the daemons (a fleet of nodes, each its
  // own kvpoold; with a shared remote tier, a prefix one computed is found by the others).
  std::vector<std::string> sockets;
  uint32_t workers = 4;
  bool ordered = true;
  uint32_t page_tokens = kTraceBlockTokens;
};

// The ping-pong sizes: alloc of one page, release of the mean pages per request, lookup of one
// hash (the replay's most frequent lookup). Throws std::runtime_error naming the cause (daemon
// unreachable, pool not empty, a worker failed).
DaemonReplayResult replay_through_daemon(const Trace& trace, const DaemonReplayOptions& options);

}  // namespace kvpool::bench

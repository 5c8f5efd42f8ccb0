// Sequential replay of a request trace through the pool core (PagePool), as
// ../shared/data/README.md defines it. For each request, in trace order:
//   1. lookup of the whole chain: the longest cached prefix is retained; those pages are hits;
//   2. for each remaining page, in order: if its hash is cached anywhere (a one-hash lookup finds
//      it), retain it; otherwise alloc one page (evicting by the policy when no page is free) and
//      publish the hash on it;
//   3. release every page of the request, last first.
// hit rate = hit pages / requested pages. With page_tokens = 512 one page is one trace block;
// with a smaller page each block becomes 512/page_tokens pages with their own chained hashes, and
// capacities (given in blocks) scale by the same factor.
// With hints (policy NAME+hints), step 1 looks up the system prompt's pages with
// Priority::system and the rest with the request's hints, and step 2 allocates with them; the
// pool's clock, which pins run on, is the request's timestamp.
// With a host tier (host_blocks > 0), every page the device tier evicts is demoted into it
// (core::HostTier, LRU), and wherever steps 1 and 2 miss in the device tier they ask the host
// tier next: a run of consecutive host hits is promoted (device pages allocated, the hashes
// published on them, the slots freed) and counted as hits (step 1) or reuses (step 2), as the
// daemon's lookup does. Only bookkeeping is replayed; no bytes move.
// With a sliding window (window_tokens > 0), step 1 is one lookup of the whole chain,
// PagePool::lookup_window, which needs only the pages the window covers at the hit point (the
// pages before it are hits that hold nothing), or the plain prefix lookup (window_lookup false,
// the baseline); step 3 releases the pages wholly before the window first (tail first among
// them, as SequenceCache lets them go while the sequence grows), then the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "bench/replay/trace.h"

namespace kvpool::bench {

inline constexpr uint32_t kTraceBlockTokens = 512;

// The hash of page j of trace block `block_id` (trace ids already name prefixes, so a page of a
// block stands for a distinct prefix too): the in-process and the daemon replays use the same.
BlockHash trace_page_hash(uint64_t block_id, uint32_t j);

struct ReplayOptions {
  uint32_t capacity_blocks = 0;
  // A core policy (lru, s3fifo, prefix) or an offline bound (belady, reuse-oracle); NAME+hints
  // passes the trace's hints (priority, system blocks, pin TTL) to the pool.
  std::string policy = "lru";
  // Pages one replay may keep pinned at once (the daemon's limits.max_pinned_pages_per_tenant);
  // a pin past it is dropped from the call, as a worker would on pin_limit_exceeded.
  uint32_t pin_limit_pages = UINT32_MAX;
  uint32_t page_tokens = kTraceBlockTokens;
  // Blocks of a host tier below the pool (0 = none); scaled to pages like the capacity.
  uint32_t host_blocks = 0;
  // Called every few hundred requests with (requests done, total); may be empty.
  std::function<void(size_t, size_t)> progress;
  // PoolOptions::expensive_checks for the replay's pool (KVPOOL_EXPENSIVE_CHECKS builds only).
  bool expensive_checks = true;
  // A sliding-window model's window in tokens (0: full attention; file comment).
  uint32_t window_tokens = 0;
  bool window_lookup = true;  // with a window: lookup_window (false: the plain prefix lookup)
};

struct ReplayResult {
  uint32_t capacity_blocks = 0;
  uint32_t capacity_pages = 0;
  std::string policy;
  uint32_t page_tokens = 0;
  uint64_t requests = 0;
  uint64_t pages = 0;            // pages requested (= blocks when page_tokens is 512)
  uint64_t hit_pages = 0;        // step 1 hits
  uint64_t reused_pages = 0;     // step 2: cached elsewhere in the pool, retained
  uint64_t allocated_pages = 0;  // step 2: allocated and published
  uint64_t evicted_pages = 0;
  uint64_t alloc_failures = 0;  // pages a request could not get (capacity below its length)
  uint64_t page_ops = 0;        // page-level core operations performed
  uint64_t pins_refused = 0;    // allocs whose pin passed pin_limit_pages
  uint32_t host_blocks = 0;
  uint64_t host_hit_pages = 0;        // of hit_pages, served by the host tier (promoted)
  uint64_t host_reused_pages = 0;     // of reused_pages, served by the host tier
  uint64_t demoted_pages = 0;         // pages the device tier evicted into the host tier
  uint64_t window_skipped_pages = 0;  // of hit_pages, before a window hit's window: no page
  double seconds = 0;
  double hit_rate() const { return pages == 0 ? 0.0 : double(hit_pages) / double(pages); }
};

// Throws std::invalid_argument for an unknown policy, a zero capacity or a page size that does
// not divide 512; std::runtime_error if the pool core reports an unexpected error.
ReplayResult replay(const Trace& trace, const ReplayOptions& options);

}  // namespace kvpool::bench

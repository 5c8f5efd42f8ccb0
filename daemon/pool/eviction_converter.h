// EvictionConverter: precision before eviction (pools[].convert_evictions_to). The cached pages a
// 16-bit pool evicts are re-encoded into pages of an 8-bit pool of the same shape and published
// there under the same (namespace, hash), instead of being lost: two 8-bit pages fit where one
// bf16 page was, so under pressure the daemon keeps twice the cold blocks at a quantiser's error
// (docs/ARCHITECTURE.md, "Mixed precision"). Workers find them with a lookup in the 8-bit pool
// (MixedSequence looks there first), exactly as a worker's own conversion leaves them.
//
// It runs the host tier's three steps (daemon/memory/host_tier_store.h), with a conversion for
// the byte copy:
//   1. plan(), on the loop after a call: the evictions the source pool reported mid-call (the
//      converter is its IndexObserver, forwarding every call) that the target does not hold
//      yet get pages of the target, allocated under the converter's owner there (evicting the
//      target's coldest cached pages: its own host tier, if any, takes those down at once,
//      before anything writes them). No room (pins, held pages): the batch is halved down to
//      one page; what does not fit is lost, as without a converter, and counted as skipped.
//   2. run(), on any thread: convert_pages from the source pool's memory into the target's, on
//      the source's copier (its CUDA stream, or the CPU).
//   3. finish(), on the loop: the target pages are published under the evicted keys and
//      released, so they are CACHED there; a hash the target gained meanwhile keeps its page and
//      ours goes back FREE; a failed conversion publishes nothing.
// Until step 3 nothing can read a converted page (unpublished, held by the converter), and the
// evicted source pages are not written: each belongs to the caller whose reply waits for the
// conversion, or (an operator's evict) to the converter's owner in the source pool.
//
// Invariants: pending evictions are planned in the call that made them (or dropped, by a shrink
// whose tail is unmapped right after): a page evicted in one call is never read in another. The
// target is never itself a converting pool, and the source has no host tier (config checks).
//
// Thread-safety: the event loop, but run() (one job of the source pool at a time). Error policy:
// a failed conversion is counted and logged, never reported to the client whose call evicted.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/core/index_observer.h"
#include "daemon/core/page_pool.h"
#include "daemon/memory/host_tier_store.h"

namespace kvpool::daemon {

class PoolRuntime;

struct ConvertStats {
  uint64_t converted = 0;   // evicted blocks now held in 8 bits by the target
  uint64_t duplicates = 0;  // evicted blocks the target had (or gained meanwhile): not converted
  uint64_t skipped = 0;     // evicted blocks lost: no target page to be had, or a target job busy
  uint64_t failures = 0;    // conversions that failed (their blocks lost)
  uint64_t ns = 0;          // time spent converting, in all
};

class EvictionConverter final : public core::IndexObserver {
 public:
  // Puts itself in front of `from`'s index observer `next`; `to` is the 8-bit pool.
  EvictionConverter(PoolRuntime& from, PoolRuntime& to, core::IndexObserver* next);
  // Gives `from` its observer back. The target's owner is not closed: the pools go together.
  ~EvictionConverter() override;
  EvictionConverter(const EvictionConverter&) = delete;
  EvictionConverter& operator=(const EvictionConverter&) = delete;

  void stored(Namespace ns, const BlockHash& hash, PageId page) override;
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override;

  // Step 1: the conversions of the evictions since the last plan, into `c`.
  void plan(TierCopy& c);
  // An operator's evict of up to n cached pages, held until their conversion is done; how many.
  uint32_t plan_evict(uint32_t n, TierCopy& c);
  // Step 2: any thread.
  void run(TierCopy& c) const;
  // Step 3.
  void finish(TierCopy& c);
  // Forgets the evictions not planned yet (a shrink: their pages are about to be unmapped).
  void drop_pending();

  PoolRuntime& target() const { return to_; }
  const ConvertStats& stats() const { return stats_; }

 private:
  struct Eviction {
    Namespace ns = 0;
    BlockHash hash;
    PageId page = kNoPage;
  };
  PoolRuntime& from_;
  PoolRuntime& to_;
  core::IndexObserver* next_;
  core::OwnerId from_owner_;  // holds the pages an operator's evict took, until converted
  core::OwnerId to_owner_;    // holds the target pages until they are published
  std::vector<Eviction> pending_;
  ConvertStats stats_;
};

}  // namespace kvpool::daemon

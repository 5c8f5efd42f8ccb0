// EvictionConverter: precision before eviction (pools[].convert_evictions_to). The cached pages a
// 16-bit pool evicts are re-encoded into pages of an 8-bit pool of the same shape and published
// there under the same (namespace, hash), instead of being lost: two 8-bit pages fit where one
// bf16 page was, so under pressure the daemon keeps about twice the cold blocks, at a quantiser's
// error (docs/ARCHITECTURE.md, "Mixed precision"). The 8-bit pool is a tier below the 16-bit one:
// a lookup of the 16-bit pool that misses continues its chain there and converts the run it finds
// back into new 16-bit pages (reply tier kTierConverted: their values carry 8-bit precision), so
// a plain worker needs no mixed kernel; a MixedSequence worker looks the 8-bit pool up itself.
//
// It runs the host tier's three steps (daemon/memory/host_tier_store.h), with conversions for the
// byte copies:
//   1. plan(), on the loop after a call: the evictions the 16-bit pool reported mid-call (the
//      converter is its IndexObserver, forwarding every call) that the 8-bit pool does not hold
//      yet get pages there, allocated under the converter's owner (evicting the 8-bit pool's
//      coldest cached pages: its own host tier, if any, takes those down at once, before anything
//      writes them). No room (pins, held pages): the batch is halved down to one page, the
//      warmest evictions kept; the rest is lost, as without a converter, and counted as skipped.
//      plan_back(), in a lookup: the 8-bit pool's run at the start of the missing chain is
//      retained by the converter (where its device tier ends, the run goes on in its host tier:
//      promoted into 8-bit pages at once, PoolRuntime::promote_now) and as many 16-bit pages
//      allocated for the caller (whose evictions plan() then takes, so they are converted down
//      before the pages are written).
//   2. run(), on any thread: convert_pages down (16 → 8 bits), then back (8 → 16), on the 16-bit
//      pool's copier (its CUDA stream, or the CPU), in that order.
//   3. finish(), on the loop: the 8-bit pages are published under the evicted keys and released,
//      so they are CACHED there (a hash the 8-bit pool gained meanwhile keeps its page and ours
//      goes back FREE); a failed conversion publishes nothing. finish_back() publishes the
//      converted-back pages for the caller (or answers a hash published meanwhile with its page)
//      and drops the 8-bit copies nobody else holds: the tiers are exclusive, as the host tier's
//      are, so the two pools hold about the sum of their pages in blocks.
// Each block keeps what its worker published it with (parent, token ids, adapter) across both
// conversions, so the KV events of the 8-bit pool, and of the 16-bit pool once converted back,
// carry it as a publish's would (PoolIndexEvents::carry).
// Until step 3 nothing can read a converted page (unpublished, held), and the evicted 16-bit pages
// are not written but by the conversion back planned after them: each belongs to the caller
// whose reply waits, or (an operator's evict) to the converter's owner in the 16-bit pool.
//
// Invariants: pending evictions are planned in the call that made them (or dropped, by a shrink
// whose tail is unmapped right after): a page evicted in one call is never read in another. The
// 8-bit pool never converts itself, and the 16-bit pool has no host tier (config checks).
//
// Thread-safety: the event loop, but run() (one job of the 16-bit pool at a time). Error policy:
// a failed conversion is counted and logged, never reported to the client as an error (a lookup
// answers its other hits).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/core/index_observer.h"
#include "daemon/core/page_pool.h"
#include "daemon/memory/host_tier_store.h"
#include "daemon/telemetry/index_events.h"

namespace kvpool::daemon {

class PoolRuntime;

struct ConvertStats {
  uint64_t converted = 0;   // evicted blocks now held in 8 bits by the 8-bit pool
  uint64_t duplicates = 0;  // evicted blocks it held already (or gained meanwhile)
  uint64_t skipped = 0;     // evicted blocks lost: no 8-bit page to be had, its host tier busy, a
                            // shrink or a flush meanwhile, or the page gone FREE
  uint64_t failures = 0;    // conversion batches (either way) that failed; their blocks not served
  uint64_t back = 0;        // blocks a lookup found there and got converted back
  uint64_t ns = 0;          // time spent converting, in all
};

class EvictionConverter final : public core::IndexObserver {
 public:
  // Puts itself in front of `from`'s index observer `next`; `to` is the 8-bit pool.
  EvictionConverter(PoolRuntime& from, PoolRuntime& to, core::IndexObserver* next);
  // Gives `from` its observer back. The 8-bit pool's owner is not closed: the pools go together.
  ~EvictionConverter() override;
  EvictionConverter(const EvictionConverter&) = delete;
  EvictionConverter& operator=(const EvictionConverter&) = delete;

  void stored(Namespace ns, const BlockHash& hash, PageId page) override;
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override;

  // Step 1: the conversions of the evictions since the last plan, appended to `c`.
  void plan(TierCopy& c);
  // An operator's evict of up to n cached pages, held until their conversion is done; how many.
  uint32_t plan_evict(uint32_t n, TierCopy& c);
  // A lookup that missed at missing[0]: the 8-bit pool's run there (at most `max` blocks, fewer
  // when the 16-bit pool cannot give that many pages to `owner` with `hints`) is planned back
  // into `c`, with the conversions of what that allocation evicted. False: nothing to convert
  // back (c may still hold conversions down).
  bool plan_back(core::OwnerId owner, Namespace ns, std::span<const BlockHash> missing,
                 uint32_t max, const core::CallHints& hints, TierCopy& c);
  // Step 2: any thread.
  void run(TierCopy& c) const;
  // Step 3. finish_back also finishes the conversions down; it writes the pages `owner` now holds
  // for chain[0..n) to out[0..n) and returns n (0 when the conversion back failed).
  void finish(TierCopy& c);
  uint32_t finish_back(TierCopy& c, core::OwnerId owner, Namespace ns,
                       std::span<const BlockHash> chain, std::span<PageId> out);
  // Forgets the evictions not planned yet (a shrink: their pages are about to be unmapped).
  void drop_pending();
  // The 16-bit pool was flushed (PoolRuntime::flush flushes the 8-bit pool with it): conversions
  // planned before it publish nothing when they finish.
  void flushed() { ++flushes_; }

  PoolRuntime& target() const { return to_; }
  const ConvertStats& stats() const { return stats_; }

 private:
  struct Eviction {
    Namespace ns = 0;
    BlockHash hash;
    PageId page = kNoPage;
  };
  // Points c's two argument blocks at its lists and the pools as they are now.
  void describe(TierCopy& c) const;

  PoolRuntime& from_;
  PoolRuntime& to_;
  core::IndexObserver* next_;
  core::OwnerId from_owner_;  // holds the pages an operator's evict took, until converted
  core::OwnerId to_owner_;    // holds 8-bit pages until published, or while converted back
  std::vector<Eviction> pending_;
  // What the blocks being converted down were published with (the 16-bit pool forgets it at
  // the eviction's turn), for their BlockStored in the 8-bit pool; until finish().
  std::unordered_map<PoolIndexEvents::Key, PoolIndexEvents::Described, PoolIndexEvents::KeyHash>
      chains_;
  uint64_t flushes_ = 0;
  ConvertStats stats_;
};

}  // namespace kvpool::daemon

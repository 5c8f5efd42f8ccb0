// PoolHostTier: a pool's host tier inside kvpoold: the bookkeeping (core::HostTier under a
// core::TierMover, daemon/core/tier_mover.h) and the memory its slots live in (TierMemory), with
// the copies that move blocks between the tiers.
//
// A slot holds one page packed: the page's runs in the pool memory (page_chunks: one run in
// page_major, kv_planes · layers in layer_major) back to back, then its scales (8-bit pools), so
// slot_bytes = page_data_bytes + page_scale_bytes whatever the layout. Demotion copies a page's
// runs into its slot; promotion copies them back into a newly allocated page; bytes and scales
// come back exactly as they went.
//
// PoolRuntime and the Service drive it (daemon/pool/, daemon/service/) in three steps, so that
// large copies can leave the event loop (DESIGN §7):
//   1. plan, on the loop: plan_demote() takes the device tier's recent evictions (evict() first
//      takes up to n cached pages itself, held by the tier's own owner so nothing reuses them
//      before their bytes are down); plan_promote() claims the host tier's run at the start of a
//      lookup's missing chain and allocates its pages (demotions that allocation caused come
//      first in the same batch). The bookkeeping is done; the bytes are described in a TierCopy.
//   2. run(), on any thread: the copies, demotions first (a promoted page may be one just
//      evicted). One TierCopy of a pool runs at a time, in planning order: the Service runs a
//      batch inline only when no other job of its pool is in flight, else queues it behind.
//   3. finish_demote() / finish_promote(), on the loop: a failed demotion's slots are discarded
//      (never promoted), a failed promotion cancelled (its pages released unpublished), and the
//      held pages released; promoted hashes are published only now.
// Until step 3 no worker can see a page whose bytes are moving: evicted pages belong to the
// caller whose reply waits for the copy, or to the tier's owner; promoted pages carry no hash.
// A promotion planned while an earlier batch's demotion was still queued is cancelled when that
// demotion fails (it may have claimed the slot the failed copy left half written).
//
// Thread-safety: run() touches only the tier memory and its TierCopy; everything else belongs to
// the event loop. Error policy: create() returns an Error naming the cause; copy failures are
// reported through the counters and the log, never to a client as an error (the lookup answers
// the device hits alone).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/host_tier.h"
#include "daemon/core/tier_mover.h"
#include "daemon/memory/tier_memory.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

// The runs that copy page `page` of `kv` to or from `packed` (page_data_bytes + page_scale_bytes:
// its chunks back to back, then its scales), appended to `out`; `to_packed`: page → packed. The
// host tier's slots and the remote tier's values hold pages packed so.
void append_page_runs(const kernels::PagedKv& kv, PageId page, std::byte* packed, bool to_packed,
                      std::vector<ByteRun>& out);

struct HostTierCopyStats {
  uint64_t demote_copies = 0;   // pages copied down
  uint64_t promote_copies = 0;  // pages copied up
  uint64_t demote_ns = 0;       // time spent copying down, in all
  uint64_t promote_ns = 0;      // time spent copying up, in all
  uint64_t copy_failures = 0;
};

// One batch of copies between a pool's tiers (see above): demotions, then at most one
// promotion's, as planned on the event loop; or, for a pool that converts its evictions into an
// 8-bit pool instead (daemon/pool/eviction_converter.h), that batch's conversions.
struct TierCopy {
  std::vector<core::TierMover::Move> demoted;   // page → slot
  std::vector<core::TierMover::Move> promoted;  // slot → page
  std::vector<ByteRun> runs;                    // the demotions' runs first, then the promotion's
  size_t demote_runs = 0;
  std::vector<PageId> held;  // evicted pages the tier's owner holds until the copy is done
  uint64_t failures_at_plan = 0;
  // Conversions: evicted page convert_src[i] → 8-bit page convert_dst[i], to be published there
  // under convert_keys[i] (namespace, hash); `convert` points into the two id lists.
  std::vector<PageId> convert_src, convert_dst;
  std::vector<std::pair<Namespace, BlockHash>> convert_keys;
  kernels::ConvertPagesArgs convert{};
  // A lookup's run found in the 8-bit pool: its pages there (held by the converter) converted
  // back into new pages of the pool (held by the caller); `convert_back` points into the lists.
  std::vector<PageId> back_src, back_dst;
  kernels::ConvertPagesArgs convert_back{};
  // A lookup's run fetched from the remote tier: its staged values → the new pages (after every
  // other copy of the batch: a new page may be one the batch demotes first).
  std::vector<ByteRun> remote_runs;
  // Evictions the remote tier writes (write: on_demote): each evicted page → a staging slot,
  // before every other copy of the batch (a page promoted into may be one of them). remote_down
  // names the tier's record of them (0: none); remote_held, pages an operator's evict gave the
  // tier's owner until their copy is done.
  std::vector<ByteRun> remote_down_runs;
  uint64_t remote_down = 0;
  std::vector<PageId> remote_held;
  uint32_t pages16 = 0, pages8 = 0;  // the two pools' page counts at the plan (id bounds)
  uint64_t flushes = 0;              // the converter's flush count at the plan
  uint64_t convert_bytes = 0;        // both directions' 16-bit pages' bytes
  // Set by run().
  std::string demote_error, promote_error, convert_error, convert_back_error, remote_error,
      remote_down_error;
  uint64_t demote_ns = 0, promote_ns = 0, convert_ns = 0;

  uint64_t bytes() const;
  bool empty() const {
    return runs.empty() && held.empty() && convert_src.empty() && back_src.empty() &&
           remote_runs.empty() && remote_down == 0 && remote_held.empty();
  }
};

class PoolHostTier {
 public:
  // A tier of `slots` pages for the pool `label` whose memory lies on CUDA device `device` (−1:
  // host memory), observing `pool` and forwarding its index changes to `next`.
  static wire::Result<std::unique_ptr<PoolHostTier>> create(core::PagePool& pool,
                                                            core::IndexObserver* next,
                                                            const Geometry& geometry,
                                                            uint32_t slots, int device,
                                                            const std::string& label);
  ~PoolHostTier();

  // Step 1. kv: the pool's memory as it is now.
  // Appends the copies of the device tier's evictions since the last plan.
  void plan_demote(const kernels::PagedKv& kv, TierCopy& c);
  // Evicts up to n cached pages of the pool (the operator's evict), holding them for the copy,
  // and plans their demotion; returns how many were evicted.
  uint32_t plan_evict(const kernels::PagedKv& kv, uint32_t n, TierCopy& c);
  // Plans the promotion of the host tier's run at the start of `chain` (at most `max` blocks)
  // into pages held by `owner`; false when nothing is promoted (c then holds only demotions).
  bool plan_promote(const kernels::PagedKv& kv, core::OwnerId owner, Namespace ns,
                    std::span<const BlockHash> chain, uint32_t max, const core::CallHints& hints,
                    TierCopy& c);
  // Step 2: any thread.
  void run(TierCopy& c) const;
  // Step 3. finish_promote also finishes the batch's demotions; it writes the pages `owner` now
  // holds for chain[0..n) to out[0..n) and returns n (0 when the promotion failed).
  void finish_demote(TierCopy& c);
  uint32_t finish_promote(TierCopy& c, core::OwnerId owner, Namespace ns,
                          std::span<const BlockHash> chain, std::span<PageId> out);

  // The three steps at once, on the loop (shrinks, whose tail is unmapped right after).
  void demote(const kernels::PagedKv& kv);

  const core::HostTier& tier() const { return tier_; }
  const HostTierCopyStats& copy_stats() const { return stats_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t bytes() const { return memory_->bytes(); }
  // Drops every block; returns how many.
  uint32_t flush() { return tier_.flush(); }
  // TierMover::drop_pending.
  void drop_pending() { mover_.drop_pending(); }
  // Drops the block (ns, hash) if held here (HostTier::drop); whether it was.
  bool drop(Namespace ns, const BlockHash& hash) { return tier_.drop(ns, hash); }

 private:
  PoolHostTier(core::PagePool& pool, core::IndexObserver* next, uint32_t slots, uint64_t slot_bytes,
               std::unique_ptr<TierMemory> memory);
  // Appends the runs of page ↔ slot copies to c.runs; `down`: page → slot.
  void plan(const kernels::PagedKv& kv, std::span<const core::TierMover::Move> moves, bool down,
            TierCopy& c) const;

  core::PagePool& pool_;
  core::OwnerId owner_;  // holds the pages plan_evict() took until their copy is done
  core::HostTier tier_;
  core::TierMover mover_;
  uint64_t slot_bytes_;
  std::unique_ptr<TierMemory> memory_;
  HostTierCopyStats stats_;
  uint64_t failed_demotions_ = 0;  // batches whose demotion failed, as finished so far
};

}  // namespace kvpool::daemon

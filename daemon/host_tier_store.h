// PoolHostTier: a pool's host tier inside kvpoold: the bookkeeping (core::HostTier under a
// core::TierMover, daemon/core/tier_mover.h) and the memory its slots live in (TierMemory), with
// the copies that move blocks between the tiers.
//
// A slot holds one page packed: the page's runs in the pool memory (page_chunks: one run in
// page_major, 2 · layers in layer_major) back to back, then its scales (8-bit pools), so
// slot_bytes = page_data_bytes + page_scale_bytes whatever the layout. Demotion copies a page's
// runs into its slot; promotion copies them back into a newly allocated page; bytes and scales
// come back exactly as they went.
//
// The Service drives it (service.cpp): after every call that may evict it runs demote(); a
// lookup that misses in the device tier asks promote_into() for the host tier's run. Both copy
// synchronously on the event loop before the reply is sent, so no worker can see a page whose
// bytes are still moving; a copy that fails leaves nothing half done in the index (a demoted
// slot is discarded, a promotion cancelled) and is logged.
//
// Thread-safety: none (the event loop). Error policy: create() returns an Error naming the cause;
// copy failures are reported through the counters and the log, never to a client as an error (the
// lookup answers the device hits alone).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "daemon/core/host_tier.h"
#include "daemon/core/tier_mover.h"
#include "daemon/tier_memory.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

struct HostTierCopyStats {
  uint64_t demote_copies = 0;   // pages copied down
  uint64_t promote_copies = 0;  // pages copied up
  uint64_t demote_ns = 0;       // time spent copying down, in all
  uint64_t promote_ns = 0;      // time spent copying up, in all
  uint64_t copy_failures = 0;
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

  // Copies the device tier's recent evictions down (kv: the pool's memory as it is now).
  void demote(const kernels::PagedKv& kv);
  // Promotes the host tier's run at the start of `chain` (at most `max` blocks) into pages held
  // by `owner`, written to out[0..n); returns n (0 when nothing was promoted).
  uint32_t promote_into(const kernels::PagedKv& kv, core::OwnerId owner, Namespace ns,
                        std::span<const BlockHash> chain, uint32_t max,
                        const core::CallHints& hints, std::span<PageId> out);

  const core::HostTier& tier() const { return tier_; }
  const HostTierCopyStats& copy_stats() const { return stats_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t bytes() const { return memory_->bytes(); }
  // Drops every block; returns how many.
  uint32_t flush() { return tier_.flush(); }

 private:
  PoolHostTier(core::PagePool& pool, core::IndexObserver* next, uint32_t slots, uint64_t slot_bytes,
               std::unique_ptr<TierMemory> memory);
  // Fills runs_ for page ↔ slot copies; `down`: page → slot.
  void plan(const kernels::PagedKv& kv, std::span<const core::TierMover::Move> moves, bool down);
  // Copies runs_; "" or the error, which is logged under `what`.
  std::string run(const char* what, uint64_t& ns_total);

  core::HostTier tier_;
  core::TierMover mover_;
  uint64_t slot_bytes_;
  std::unique_ptr<TierMemory> memory_;
  std::vector<ByteRun> runs_;
  HostTierCopyStats stats_;
};

}  // namespace kvpool::daemon

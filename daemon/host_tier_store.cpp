#include "daemon/host_tier_store.h"

#include "daemon/latency.h"
#include "daemon/log.h"

namespace kvpool::daemon {

wire::Result<std::unique_ptr<PoolHostTier>> PoolHostTier::create(core::PagePool& pool,
                                                                 core::IndexObserver* next,
                                                                 const Geometry& geometry,
                                                                 uint32_t slots, int device,
                                                                 const std::string& label) {
  const uint64_t slot_bytes = page_data_bytes(geometry) + page_scale_bytes(geometry);
  auto memory = make_tier_memory(device, uint64_t{slots} * slot_bytes, label);
  if (!memory.ok()) return memory.error();
  return std::unique_ptr<PoolHostTier>(
      new PoolHostTier(pool, next, slots, slot_bytes, std::move(memory.value())));
}

PoolHostTier::PoolHostTier(core::PagePool& pool, core::IndexObserver* next, uint32_t slots,
                           uint64_t slot_bytes, std::unique_ptr<TierMemory> memory)
    : tier_(slots, 0),
      mover_(pool, tier_, next),
      slot_bytes_(slot_bytes),
      memory_(std::move(memory)) {}

void PoolHostTier::plan(const kernels::PagedKv& kv, std::span<const core::TierMover::Move> moves,
                        bool down) {
  const kernels::PageChunks c = kernels::page_chunks(kv);
  const uint64_t scale_bytes = page_scale_bytes(kv.geometry);
  auto* base = static_cast<std::byte*>(kv.base);
  auto* scales = reinterpret_cast<std::byte*>(kv.scales);
  runs_.clear();
  for (const core::TierMover::Move& m : moves) {
    std::byte* slot = memory_->base() + uint64_t{m.slot} * slot_bytes_;
    auto add = [&](std::byte* pool_at, std::byte* slot_at, uint64_t bytes) {
      runs_.push_back(down ? ByteRun{slot_at, pool_at, bytes} : ByteRun{pool_at, slot_at, bytes});
    };
    for (uint32_t k = 0; k < c.chunks; ++k)
      add(base + uint64_t{m.page} * c.page + k * c.chunk, slot + k * c.chunk_bytes, c.chunk_bytes);
    if (scale_bytes != 0) {
      add(scales + uint64_t{m.page} * scale_bytes, slot + uint64_t{c.chunks} * c.chunk_bytes,
          scale_bytes);
    }
  }
}

std::string PoolHostTier::run(const char* what, uint64_t& ns_total) {
  const uint64_t t0 = LatencyRecorder::now_ns();
  std::string err = memory_->copy(runs_);
  ns_total += LatencyRecorder::now_ns() - t0;
  if (!err.empty()) {
    ++stats_.copy_failures;
    log_event(LogLevel::error, "host_tier_copy_failed", {kv("copy", what), kv("error", err)});
  }
  return err;
}

void PoolHostTier::demote(const kernels::PagedKv& kv) {
  const auto moves = mover_.admit_pending();
  if (moves.empty()) return;
  plan(kv, moves, true);
  if (!run("demote", stats_.demote_ns).empty()) {
    // The slots may hold partial bytes: they must never be promoted.
    for (const core::TierMover::Move& m : moves)
      mover_.discard(m.slot);
    return;
  }
  stats_.demote_copies += moves.size();
}

uint32_t PoolHostTier::promote_into(const kernels::PagedKv& kv, core::OwnerId owner, Namespace ns,
                                    std::span<const BlockHash> chain, uint32_t max,
                                    const core::CallHints& hints, std::span<PageId> out) {
  const auto promos = mover_.start_promotion(owner, ns, chain, max, hints);
  if (promos.empty()) return 0;
  // The allocation may have evicted pages: their bytes go down before the promoted ones come up,
  // since a promoted page may be one of them.
  demote(kv);
  plan(kv, promos, false);
  if (!run("promote", stats_.promote_ns).empty()) {
    mover_.cancel_promotion(owner);
    return 0;
  }
  stats_.promote_copies += promos.size();
  return mover_.finish_promotion(owner, ns, chain, out);
}

}  // namespace kvpool::daemon

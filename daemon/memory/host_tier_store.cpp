#include "daemon/memory/host_tier_store.h"

#include "daemon/core/check.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

uint64_t TierCopy::bytes() const {
  uint64_t n = convert_bytes;
  for (const ByteRun& r : runs)
    n += r.bytes;
  for (const ByteRun& r : remote_runs)
    n += r.bytes;
  for (const ByteRun& r : remote_down_runs)
    n += r.bytes;
  return n;
}

void append_page_runs(const kernels::PagedKv& kv, PageId page, std::byte* packed, bool to_packed,
                      std::vector<ByteRun>& out) {
  const kernels::PageChunks chunks = kernels::page_chunks(kv);
  const uint64_t scale_bytes = page_scale_bytes(kv.geometry);
  auto* base = static_cast<std::byte*>(kv.base);
  auto* scales = reinterpret_cast<std::byte*>(kv.scales);
  auto add = [&](std::byte* pool_at, std::byte* packed_at, uint64_t bytes) {
    out.push_back(to_packed ? ByteRun{packed_at, pool_at, bytes}
                            : ByteRun{pool_at, packed_at, bytes});
  };
  for (uint32_t k = 0; k < chunks.chunks; ++k) {
    add(base + chunks.at(page) + k * chunks.chunk, packed + k * chunks.chunk_bytes,
        chunks.chunk_bytes);
  }
  if (scale_bytes != 0) {
    add(scales + uint64_t{page} * scale_bytes,
        packed + uint64_t{chunks.chunks} * chunks.chunk_bytes, scale_bytes);
  }
}

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
    : pool_(pool),
      owner_(pool.open_owner()),
      tier_(slots, 0),
      mover_(pool, tier_, next),
      slot_bytes_(slot_bytes),
      memory_(std::move(memory)) {}

PoolHostTier::~PoolHostTier() {
  (void)pool_.close_owner(owner_);
}

void PoolHostTier::plan(const kernels::PagedKv& kv, std::span<const core::TierMover::Move> moves,
                        bool down, TierCopy& c) const {
  for (const core::TierMover::Move& m : moves)
    append_page_runs(kv, m.page, memory_->base() + uint64_t{m.slot} * slot_bytes_, down, c.runs);
}

void PoolHostTier::plan_demote(const kernels::PagedKv& kv, TierCopy& c) {
  const auto moves = mover_.admit_pending();
  if (moves.empty()) return;
  // Demotions stay ahead of any promotion in the batch.
  KVPOOL_CHECK(c.promoted.empty() && c.runs.size() == c.demote_runs);
  c.demoted.insert(c.demoted.end(), moves.begin(), moves.end());
  plan(kv, moves, true, c);
  c.demote_runs = c.runs.size();
}

uint32_t PoolHostTier::plan_evict(const kernels::PagedKv& kv, uint32_t n, TierCopy& c) {
  const uint32_t evicted = pool_.evict_into(owner_, n, c.held);
  plan_demote(kv, c);
  return evicted;
}

bool PoolHostTier::plan_promote(const kernels::PagedKv& kv, core::OwnerId owner, Namespace ns,
                                std::span<const BlockHash> chain, uint32_t max,
                                const core::CallHints& hints, TierCopy& c) {
  const auto promos = mover_.start_promotion(owner, ns, chain, max, hints);
  // The allocation may have evicted pages: their bytes go down before the promoted ones come up,
  // since a promoted page may be one of them.
  plan_demote(kv, c);
  if (promos.empty()) return false;
  c.failures_at_plan = failed_demotions_;
  c.promoted.assign(promos.begin(), promos.end());
  plan(kv, promos, false, c);
  return true;
}

void PoolHostTier::run(TierCopy& c) const {
  const std::span<const ByteRun> runs(c.runs);
  const uint64_t t0 = LatencyRecorder::now_ns();
  if (c.demote_runs != 0) c.demote_error = memory_->copy(runs.first(c.demote_runs));
  const uint64_t t1 = LatencyRecorder::now_ns();
  if (runs.size() > c.demote_runs) c.promote_error = memory_->copy(runs.subspan(c.demote_runs));
  c.demote_ns = t1 - t0;
  c.promote_ns = LatencyRecorder::now_ns() - t1;
}

void PoolHostTier::finish_demote(TierCopy& c) {
  stats_.demote_ns += c.demote_ns;
  if (!c.demote_error.empty()) {
    ++stats_.copy_failures;
    ++failed_demotions_;
    log_event(LogLevel::error, "host_tier_copy_failed",
              {kv("copy", "demote"), kv("error", c.demote_error)});
    // The slots may hold partial bytes: they must never be promoted.
    for (const core::TierMover::Move& m : c.demoted)
      mover_.discard(m.slot);
  } else {
    stats_.demote_copies += c.demoted.size();
  }
  if (!c.held.empty()) KVPOOL_CHECK(pool_.release(owner_, c.held).ok());
  c.demoted.clear();
  c.held.clear();
}

uint32_t PoolHostTier::finish_promote(TierCopy& c, core::OwnerId owner, Namespace ns,
                                      std::span<const BlockHash> chain, std::span<PageId> out) {
  finish_demote(c);
  if (c.promoted.empty()) return 0;
  stats_.promote_ns += c.promote_ns;
  const bool poisoned = failed_demotions_ != c.failures_at_plan;
  if (!c.promote_error.empty() || poisoned) {
    ++stats_.copy_failures;
    log_event(LogLevel::error, "host_tier_copy_failed",
              {kv("copy", "promote"),
               kv("error", poisoned ? "a demotion queued before it failed" : c.promote_error)});
    // A poisoned slot may hold a failed demotion's partial bytes: it must not come back.
    mover_.cancel_promotion(owner, !poisoned);
    return 0;
  }
  stats_.promote_copies += c.promoted.size();
  return mover_.finish_promotion(owner, ns, chain, out);
}

void PoolHostTier::demote(const kernels::PagedKv& kv) {
  TierCopy c;
  plan_demote(kv, c);
  if (c.empty()) return;
  run(c);
  finish_demote(c);
}

}  // namespace kvpool::daemon

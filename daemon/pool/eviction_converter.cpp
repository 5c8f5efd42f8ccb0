#include "daemon/pool/eviction_converter.h"

#include <algorithm>

#include "daemon/core/check.h"
#include "daemon/pool/pool_runtime.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

EvictionConverter::EvictionConverter(PoolRuntime& from, PoolRuntime& to, core::IndexObserver* next)
    : from_(from),
      to_(to),
      next_(next),
      from_owner_(from.pages().open_owner()),
      to_owner_(to.pages().open_owner()) {
  from_.pages().set_observer(this);
}

EvictionConverter::~EvictionConverter() {
  from_.pages().set_observer(next_);
  (void)from_.pages().close_owner(from_owner_);
}

void EvictionConverter::stored(Namespace ns, const BlockHash& hash, PageId page) {
  next_->stored(ns, hash, page);
}

void EvictionConverter::removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) {
  next_->removed(ns, hash, page, why);
  if (why == Removal::evicted) pending_.push_back({ns, hash, page});
}

void EvictionConverter::drop_pending() {
  stats_.skipped += pending_.size();
  pending_.clear();
}

void EvictionConverter::plan(TierCopy& c) {
  if (pending_.empty()) return;
  std::vector<Eviction> todo;
  todo.reserve(pending_.size());
  for (const Eviction& e : pending_) {
    if (to_.pages().find(e.ns, e.hash) != kNoPage) {
      // The 8-bit pool's device tier has it. One in its host tier is converted again: the
      // fresh copy replaces the host tier's, and a later lookup needs no promotion for it.
      ++stats_.duplicates;
    } else {
      todo.push_back(e);
    }
  }
  pending_.clear();
  if (todo.empty()) return;
  // The 8-bit pool's host tier takes what our allocation evicts there at once, on the loop; with
  // one of its jobs in flight that copy could race it (one tier job per pool at a time), so the
  // batch is lost as plain evictions would be.
  if (to_.has_host_tier() && to_.copies_in_flight() != 0) {
    stats_.skipped += todo.size();
    return;
  }
  // Evictions come coldest first: when the 8-bit pool cannot take them all, the warmest are kept.
  size_t n = todo.size();
  std::vector<PageId> dst(n);
  while (n > 0 && !to_.pages().alloc(to_owner_, std::span<PageId>(dst.data(), n)).ok())
    n /= 2;
  stats_.skipped += todo.size() - n;
  if (n == 0) return;
  to_.demote_now();
  for (size_t i = todo.size() - n, k = 0; i < todo.size(); ++i, ++k) {
    c.convert_src.push_back(todo[i].page);
    c.convert_dst.push_back(dst[k]);
    c.convert_keys.emplace_back(todo[i].ns, todo[i].hash);
    if (const auto* d = from_.index_events().described_block(todo[i].ns, todo[i].hash)) {
      chains_[PoolIndexEvents::Key{todo[i].ns, todo[i].hash}] = *d;
    }
  }
  describe(c);
}

bool EvictionConverter::plan_back(core::OwnerId owner, Namespace ns,
                                  std::span<const BlockHash> missing, uint32_t max,
                                  const core::CallHints& hints, TierCopy& c) {
  KVPOOL_CHECK(c.back_src.empty());  // one lookup per call
  const auto want = static_cast<uint32_t>(std::min<size_t>(missing.size(), max));
  if (want == 0) return false;
  // The 8-bit pool's run, retained so that nothing evicts it while it is read; where its device
  // tier ends, the run goes on in its host tier, promoted into 8-bit pages first (on the loop).
  std::vector<PageId> found(want);
  uint32_t hits = 0;
  if (!to_.pages().lookup(to_owner_, ns, missing.first(want), found, hits).ok()) return false;
  if (hits < want) {
    hits += to_.promote_now(to_owner_, ns, missing.subspan(hits, want - hits),
                            std::span(found).subspan(hits));
  }
  if (hits == 0) return false;
  // As many 16-bit pages for the caller, fewer when the pool cannot give that many now.
  std::vector<PageId> pages(hits);
  uint32_t n = hits;
  while (n > 0 && !from_.pages().alloc(owner, std::span<PageId>(pages.data(), n), hints).ok())
    n /= 2;
  if (n < hits) {
    KVPOOL_CHECK(to_.pages().release(to_owner_, std::span(found).subspan(n, hits - n)).ok());
  }
  if (n == 0) return false;
  // The allocation's evictions go down before these pages are written.
  plan(c);
  c.back_src.assign(found.begin(), found.begin() + n);
  c.back_dst.assign(pages.begin(), pages.begin() + n);
  describe(c);
  return true;
}

void EvictionConverter::describe(TierCopy& c) const {
  const kernels::PagedKv kv16 = from_.paged_kv();
  const kernels::PagedKv kv8 = to_.paged_kv();
  c.convert = {kv16, kv8, static_cast<uint32_t>(c.convert_src.size()), c.convert_src.data(),
               c.convert_dst.data()};
  c.convert_back = {kv8, kv16, static_cast<uint32_t>(c.back_src.size()), c.back_src.data(),
                    c.back_dst.data()};
  c.flushes = flushes_;
  c.pages16 = from_.pages().num_pages();
  c.pages8 = to_.pages().num_pages();
  c.convert_bytes =
      (c.convert_src.size() + c.back_src.size()) * page_data_bytes(from_.info().geometry);
}

uint32_t EvictionConverter::plan_evict(uint32_t n, TierCopy& c) {
  const uint32_t evicted = from_.pages().evict_into(from_owner_, n, c.held);
  plan(c);
  return evicted;
}

void EvictionConverter::run(TierCopy& c) const {
  if (c.convert_src.empty() && c.back_src.empty()) return;
  const uint64_t t0 = LatencyRecorder::now_ns();
  // Down first: a page converted back into may be one this call evicted.
  PoolMemory& memory = from_.memory();
  if (!c.convert_src.empty())
    c.convert_error = memory.convert_pages(c.convert, c.pages16, c.pages8);
  if (!c.back_src.empty()) {
    c.convert_back_error = memory.convert_pages(c.convert_back, c.pages8, c.pages16);
  }
  c.convert_ns = LatencyRecorder::now_ns() - t0;
}

void EvictionConverter::finish(TierCopy& c) {
  core::PagePool& older = to_.pages();
  stats_.ns += c.convert_ns;
  c.convert_ns = 0;
  if (!c.convert_dst.empty()) {
    std::vector<PageId> release = c.convert_dst;
    if (c.flushes != flushes_) {
      // A flush came while the conversion ran: its blocks are not to be found again.
      stats_.skipped += c.convert_dst.size();
    } else if (!c.convert_error.empty()) {
      ++stats_.failures;
      log_event(LogLevel::error, "eviction_convert_failed",
                {kv("pool", from_.name()), kv("into", to_.name()),
                 kv("blocks", c.convert_dst.size()), kv("error", c.convert_error)});
    } else {
      // Namespaces differ from block to block: one publish each; duplicates keep their page.
      PublishResult result;
      for (size_t i = 0; i < c.convert_dst.size(); ++i) {
        const auto& [ns, hash] = c.convert_keys[i];
        if (const auto it = chains_.find(PoolIndexEvents::Key{ns, hash}); it != chains_.end()) {
          to_.index_events().carry(ns, hash, it->second);
        }
        const PublishItem item{c.convert_dst[i], hash};
        KVPOOL_CHECK(older.publish(to_owner_, ns, std::span(&item, 1), std::span(&result, 1)).ok());
        if (result.kind == PublishResult::Kind::duplicate) {
          ++stats_.duplicates;
          release.push_back(result.page);
        } else {
          ++stats_.converted;
        }
      }
    }
    // Published pages become CACHED, the others FREE.
    KVPOOL_CHECK(older.release(to_owner_, release).ok());
  }
  if (!c.held.empty()) KVPOOL_CHECK(from_.pages().release(from_owner_, c.held).ok());
  for (const auto& [ns, hash] : c.convert_keys)
    chains_.erase(PoolIndexEvents::Key{ns, hash});
  c.convert_dst.clear();
  c.convert_src.clear();
  c.convert_keys.clear();
  c.held.clear();
}

uint32_t EvictionConverter::finish_back(TierCopy& c, core::OwnerId owner, Namespace ns,
                                        std::span<const BlockHash> chain, std::span<PageId> out) {
  finish(c);
  const auto n = static_cast<uint32_t>(c.back_dst.size());
  if (n == 0) return 0;
  core::PagePool& pool = from_.pages();
  uint32_t served = 0;
  if (c.flushes != flushes_) {
    // A flush came while the conversion ran: nothing of the cache before it is served.
    KVPOOL_CHECK(pool.release(owner, c.back_dst).ok());
  } else if (!c.convert_back_error.empty()) {
    ++stats_.failures;
    log_event(LogLevel::error, "eviction_convert_failed",
              {kv("pool", to_.name()), kv("into", from_.name()), kv("blocks", n),
               kv("error", c.convert_back_error)});
    // Never published: the pages go back FREE.
    KVPOOL_CHECK(pool.release(owner, c.back_dst).ok());
  } else {
    std::vector<PublishItem> items(n);
    for (uint32_t i = 0; i < n; ++i) {
      items[i] = {c.back_dst[i], chain[i]};
      // Its chain, as the 8-bit pool kept it, for its BlockStored back in 16 bits.
      if (const auto* d = to_.index_events().described_block(ns, chain[i])) {
        from_.index_events().carry(ns, chain[i], *d);
      }
    }
    std::vector<PublishResult> results(n);
    KVPOOL_CHECK(pool.publish(owner, ns, items, results).ok());
    std::vector<PageId> spare;
    for (uint32_t i = 0; i < n; ++i) {
      // A hash the pool gained meanwhile: that page is retained for the owner, ours goes.
      out[i] = results[i].page;
      if (results[i].kind == PublishResult::Kind::duplicate) spare.push_back(c.back_dst[i]);
    }
    if (!spare.empty()) KVPOOL_CHECK(pool.release(owner, spare).ok());
    stats_.back += n;
    served = n;
  }
  KVPOOL_CHECK(to_.pages().release(to_owner_, c.back_src).ok());
  // Exclusive tiers: a block back in 16 bits leaves the 8-bit pool (unless someone else holds
  // it there), so that the pools hold about the sum of their pages in blocks; its next eviction
  // converts it again. Kept in both, the blocks a lookup brings back, the hottest, would take
  // 8-bit pages twice (measured: bench/RESULTS.md, "Precision before eviction").
  for (uint32_t i = 0; i < served; ++i)
    (void)to_.pages().drop_cached(ns, chain[i]);
  c.back_src.clear();
  c.back_dst.clear();
  return served;
}

}  // namespace kvpool::daemon

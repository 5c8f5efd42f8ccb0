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
  // One conversion batch per call: the Service plans after every call that may evict.
  KVPOOL_CHECK(c.convert_src.empty());
  std::vector<Eviction> todo;
  todo.reserve(pending_.size());
  for (const Eviction& e : pending_) {
    if (to_.holds_block(e.ns, e.hash)) {
      ++stats_.duplicates;
    } else {
      todo.push_back(e);
    }
  }
  pending_.clear();
  if (todo.empty()) return;
  // The target's host tier takes what our allocation evicts there at once, on the loop; with
  // one of its jobs in flight that copy could race it (one tier job per pool at a time), so the
  // batch is lost as plain evictions would be.
  if (to_.has_host_tier() && to_.copies_in_flight() != 0) {
    stats_.skipped += todo.size();
    return;
  }
  // Evictions come coldest first: when the target cannot take them all, the warmest are kept.
  size_t n = todo.size();
  std::vector<PageId> dst(n);
  core::PagePool& target = to_.pages();
  while (n > 0 && !target.alloc(to_owner_, std::span<PageId>(dst.data(), n)).ok())
    n /= 2;
  stats_.skipped += todo.size() - n;
  if (n == 0) return;
  to_.demote_now();
  const size_t first = todo.size() - n;
  c.convert_src.reserve(n);
  c.convert_keys.reserve(n);
  for (size_t i = first; i < todo.size(); ++i) {
    c.convert_src.push_back(todo[i].page);
    c.convert_keys.emplace_back(todo[i].ns, todo[i].hash);
  }
  dst.resize(n);
  c.convert_dst = std::move(dst);
  c.convert.src = from_.paged_kv();
  c.convert.dst = to_.paged_kv();
  c.convert.num_pairs = static_cast<uint32_t>(n);
  c.convert.src_pages = c.convert_src.data();
  c.convert.dst_pages = c.convert_dst.data();
  c.convert_src_pages = from_.pages().num_pages();
  c.convert_dst_pages = target.num_pages();
  c.convert_bytes = n * page_data_bytes(from_.info().geometry);
}

uint32_t EvictionConverter::plan_evict(uint32_t n, TierCopy& c) {
  const uint32_t evicted = from_.pages().evict_into(from_owner_, n, c.held);
  plan(c);
  return evicted;
}

void EvictionConverter::run(TierCopy& c) const {
  if (c.convert_src.empty()) return;
  const uint64_t t0 = LatencyRecorder::now_ns();
  c.convert_error =
      from_.memory().convert_pages(c.convert, c.convert_src_pages, c.convert_dst_pages);
  c.convert_ns = LatencyRecorder::now_ns() - t0;
}

void EvictionConverter::finish(TierCopy& c) {
  core::PagePool& target = to_.pages();
  if (!c.convert_dst.empty()) {
    stats_.ns += c.convert_ns;
    std::vector<PageId> release = c.convert_dst;
    if (!c.convert_error.empty()) {
      ++stats_.failures;
      log_event(LogLevel::error, "eviction_convert_failed",
                {kv("pool", from_.name()), kv("into", to_.name()),
                 kv("blocks", c.convert_dst.size()), kv("error", c.convert_error)});
    } else {
      // One publish per namespace, in eviction order; duplicates keep the target's page.
      PublishResult result;
      for (size_t i = 0; i < c.convert_dst.size(); ++i) {
        const auto& [ns, hash] = c.convert_keys[i];
        const PublishItem item{c.convert_dst[i], hash};
        KVPOOL_CHECK(
            target.publish(to_owner_, ns, std::span(&item, 1), std::span(&result, 1)).ok());
        if (result.kind == PublishResult::Kind::duplicate) {
          ++stats_.duplicates;
          release.push_back(result.page);
        } else {
          ++stats_.converted;
        }
      }
    }
    // Published pages become CACHED, the others FREE.
    KVPOOL_CHECK(target.release(to_owner_, release).ok());
  }
  if (!c.held.empty()) KVPOOL_CHECK(from_.pages().release(from_owner_, c.held).ok());
  c.convert_dst.clear();
  c.convert_src.clear();
  c.convert_keys.clear();
  c.held.clear();
}

}  // namespace kvpool::daemon

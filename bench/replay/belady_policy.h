// Offline policies, for trace replay only: they need the future, which only a replay knows, so
// the replay tells each page its next-use key before releasing it (set_next_use). The key packs
// (index of the next request that asks for the block) << 24 | depth in its chain; kNeverKey's
// request part means "never asked for again".
//
// BeladyPolicy: Belady's optimum; the CACHED page whose next use lies farthest in the future goes
// first. Ties (same next request) go to the page deeper in its chain, so that a shared head
// outlives its tails. A std::set ordered by key: O(log n) per call, fine for an offline bound.
//
// ReuseOraclePolicy: LRU that knows which pages will never be asked for again and drops those
// first. It bounds what any policy can win by telling dead blocks from live ones, without
// knowing when the live ones come back.
#pragma once

#include <set>
#include <utility>
#include <vector>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/page_lists.h"

namespace kvpool::bench {

class OfflinePolicy : public core::EvictionPolicy {
 public:
  static constexpr uint64_t kNeverRequest = 0xFFFFFFFF;
  // Larger key = used later.
  virtual void set_next_use(core::PageId page, uint64_t key) = 0;
};

class BeladyPolicy final : public OfflinePolicy {
 public:
  void set_next_use(core::PageId page, uint64_t key) override { key_[page] = key; }

  std::string_view name() const override { return "belady"; }
  void attach(uint32_t num_pages) override {
    key_.assign(num_pages, 0);
    queued_key_.assign(num_pages, 0);
    queue_.clear();
  }
  void resize(uint32_t num_pages) override {
    key_.resize(num_pages, 0);
    queued_key_.resize(num_pages, 0);
  }
  void on_cached(core::PageId page, const core::PageFacts&) override {
    queued_key_[page] = key_[page];
    queue_.emplace(key_[page], page);
  }
  void on_reuse(core::PageId page) override { queue_.erase({queued_key_[page], page}); }
  core::PageId victim() override {
    if (queue_.empty()) return core::kNoPage;
    const auto last = std::prev(queue_.end());
    const core::PageId page = last->second;
    queue_.erase(last);
    return page;
  }
  void for_each_queued(const std::function<void(core::PageId)>& fn) const override {
    for (const auto& [key, page] : queue_)
      fn(page);
  }

 private:
  std::vector<uint64_t> key_;         // next-use key set by the replay
  std::vector<uint64_t> queued_key_;  // key the page was queued under
  std::set<std::pair<uint64_t, core::PageId>> queue_;
};

class ReuseOraclePolicy final : public OfflinePolicy {
 public:
  void set_next_use(core::PageId page, uint64_t key) override {
    dead_[page] = (key >> 24) == kNeverRequest;
  }

  std::string_view name() const override { return "reuse-oracle"; }
  void attach(uint32_t num_pages) override {
    lists_.reset(num_pages);
    dead_.assign(num_pages, false);
  }
  void resize(uint32_t num_pages) override {
    lists_.resize(num_pages);
    dead_.resize(num_pages, false);
  }
  void on_cached(core::PageId page, const core::PageFacts&) override {
    lists_.push_back(dead_[page] ? kDead : kLive, page);
  }
  void on_reuse(core::PageId page) override { lists_.unlink(page); }
  core::PageId victim() override {
    const core::PageId page = lists_.pop_front(kDead);
    return page != core::kNoPage ? page : lists_.pop_front(kLive);
  }
  void for_each_queued(const std::function<void(core::PageId)>& fn) const override {
    lists_.for_each(kDead, fn);
    lists_.for_each(kLive, fn);
  }

 private:
  enum : uint8_t { kDead = 0, kLive = 1 };
  core::PageLists<2> lists_;
  std::vector<bool> dead_;
};

}  // namespace kvpool::bench

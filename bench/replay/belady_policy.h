// Belady's offline-optimal eviction, for trace replay only: the CACHED page whose next use lies
// farthest in the future goes first. It needs the future, which only a replay knows, so the replay
// tells it each page's next-use key before releasing the page (set_next_use). Ties (same next
// request) go to the page deeper in its chain, so that a shared head outlives its tails.
//
// A std::set ordered by key: O(log n) per call, fine for an offline bound.
#pragma once

#include <set>
#include <utility>
#include <vector>

#include "daemon/core/eviction_policy.h"

namespace kvpool::bench {

class BeladyPolicy final : public core::EvictionPolicy {
 public:
  // Larger key = evicted sooner. The replay packs (next request index, depth in chain).
  void set_next_use(core::PageId page, uint64_t key) { key_[page] = key; }

  std::string_view name() const override { return "belady"; }
  void attach(uint32_t num_pages) override {
    key_.assign(num_pages, 0);
    queued_key_.assign(num_pages, 0);
    queue_.clear();
  }
  void on_cached(core::PageId page) override {
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

}  // namespace kvpool::bench

// LRU eviction: the least recently released CACHED page goes first.
//
// One FIFO list of CACHED pages in release order (PageLists): on_cached appends, on_reuse
// unlinks, victim pops the oldest; each O(1) with no allocation after attach(). It ignores the
// page facts: it is the baseline the other policies are measured against.
//
// Tails before heads: a worker releases a sequence tail first (DESIGN §4), so a chain's last block
// enters the queue before its first one and is evicted before it. A chain's head, which more
// requests share, stays cached longest, and a lookup never finds a cached tail behind an evicted
// head that it can no longer reach.
#pragma once

#include "daemon/core/eviction_policy.h"
#include "daemon/core/page_lists.h"

namespace kvpool::core {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void attach(uint32_t num_pages) override { queue_.reset(num_pages); }
  void resize(uint32_t num_pages) override { queue_.resize(num_pages); }
  void on_cached(PageId page, const PageFacts&) override { queue_.push_back(0, page); }
  void on_reuse(PageId page) override { queue_.unlink(page); }
  PageId victim() override { return queue_.pop_front(0); }
  void for_each_queued(const std::function<void(PageId)>& fn) const override {
    queue_.for_each(0, fn);
  }

 private:
  PageLists<1> queue_;
};

}  // namespace kvpool::core

// LRU eviction: the least recently released CACHED page goes first.
//
// One doubly-linked list threaded through two arrays indexed by page id (prev/next), head = least
// recently released, tail = most recently released. on_cached appends at the tail, on_reuse
// unlinks, victim pops the head: each O(1) with no allocation after attach().
//
// Tails before heads: a worker releases a sequence tail first (DESIGN §4), so a chain's last block
// enters the queue before its first one and is evicted before it. A chain's head, which more
// requests share, stays cached longest, and a lookup never finds a cached tail behind an evicted
// head that it can no longer reach.
//
// Invariant: a page is linked iff linked_[page]; the list holds exactly the linked pages.
#pragma once

#include <vector>

#include "daemon/core/eviction_policy.h"

namespace kvpool::core {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void attach(uint32_t num_pages) override;
  void on_cached(PageId page) override;
  void on_reuse(PageId page) override;
  PageId victim() override;
  void for_each_queued(const std::function<void(PageId)>& fn) const override;

 private:
  void unlink(PageId page);

  std::vector<PageId> prev_;
  std::vector<PageId> next_;
  std::vector<bool> linked_;
  PageId head_ = kNoPage;
  PageId tail_ = kNoPage;
};

}  // namespace kvpool::core

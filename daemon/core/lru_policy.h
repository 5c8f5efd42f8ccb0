// LRU eviction: the least recently released CACHED page goes first.
//
// One doubly-linked list threaded through an array of links indexed by page id, head = least
// recently released, tail = most recently released. on_cached appends at the tail, on_reuse
// unlinks, victim pops the head: each O(1) with no allocation after attach().
//
// Tails before heads: a worker releases a sequence tail first (DESIGN §4), so a chain's last block
// enters the queue before its first one and is evicted before it. A chain's head, which more
// requests share, stays cached longest, and a lookup never finds a cached tail behind an evicted
// head that it can no longer reach.
//
// Invariant: a page is in the list iff links_[page].prev != kUnlinked.
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

  // prev and next of one page share a cache line; kUnlinked in prev marks "not queued".
  static constexpr PageId kUnlinked = kNoPage - 1;
  struct Link {
    PageId prev = kUnlinked;
    PageId next = kNoPage;
  };
  std::vector<Link> links_;
  PageId head_ = kNoPage;
  PageId tail_ = kNoPage;
};

}  // namespace kvpool::core

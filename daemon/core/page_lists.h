// PageLists: N doubly-linked FIFO lists of page ids threaded through one array of links indexed
// by page id, for eviction policies that keep their CACHED pages in a few queues.
//
// A page is in at most one list at a time. push_back, unlink and pop_front are O(1) and allocate
// nothing after the constructor; a list keeps the order pages were pushed in (front = oldest).
//
// Invariant: a page is in list k iff list_of(page) == k; then its links chain it between its
// neighbours of list k, and sizes_[k] counts the pages of list k.
//
// Thread-safety: none (a policy's state). Error policy: pushing a page that is already listed or
// unlinking one that is not is a policy bug, caught by KVPOOL_DCHECK.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "daemon/core/check.h"
#include "daemon/core/types.h"

namespace kvpool::core {

template <uint8_t N>
class PageLists {
 public:
  static_assert(N >= 1 && N < 255);
  static constexpr uint8_t kNone = 255;

  void reset(uint32_t num_pages) {
    links_.assign(num_pages, Link{});
    heads_.fill(kNoPage);
    tails_.fill(kNoPage);
    sizes_.fill(0);
  }

  // Room for `num_pages` pages; those listed keep their places. Shrinking drops the links of
  // pages at or past `num_pages`, which must not be listed.
  void resize(uint32_t num_pages) {
    for (PageId p = num_pages; p < links_.size(); ++p)
      KVPOOL_DCHECK(links_[p].list == kNone);
    links_.resize(num_pages, Link{});
  }

  uint8_t list_of(PageId page) const { return links_[page].list; }
  uint32_t size(uint8_t list) const { return sizes_[list]; }
  bool empty(uint8_t list) const { return sizes_[list] == 0; }

  void push_back(uint8_t list, PageId page) {
    Link& l = links_[page];
    KVPOOL_DCHECK(l.list == kNone && list < N);
    l = Link{tails_[list], kNoPage, list};
    if (tails_[list] != kNoPage) {
      links_[tails_[list]].next = page;
    } else {
      heads_[list] = page;
    }
    tails_[list] = page;
    ++sizes_[list];
  }

  void unlink(PageId page) {
    const Link l = links_[page];
    KVPOOL_DCHECK(l.list != kNone);
    if (l.prev != kNoPage) {
      links_[l.prev].next = l.next;
    } else {
      heads_[l.list] = l.next;
    }
    if (l.next != kNoPage) {
      links_[l.next].prev = l.prev;
    } else {
      tails_[l.list] = l.prev;
    }
    --sizes_[l.list];
    links_[page] = Link{};
  }

  // The oldest page of `list`, left in it; kNoPage when the list is empty.
  PageId front(uint8_t list) const { return heads_[list]; }
  // The oldest page of `list`, unlinked; kNoPage when the list is empty.
  PageId pop_front(uint8_t list) {
    const PageId page = heads_[list];
    if (page != kNoPage) unlink(page);
    return page;
  }

  void for_each(uint8_t list, const std::function<void(PageId)>& fn) const {
    for (PageId p = heads_[list]; p != kNoPage; p = links_[p].next)
      fn(p);
  }

 private:
  // prev, next and the list id of one page share 12 bytes, so one cache line holds five pages.
  struct Link {
    PageId prev = kNoPage;
    PageId next = kNoPage;
    uint8_t list = kNone;
  };
  std::vector<Link> links_;
  std::array<PageId, N> heads_{};
  std::array<PageId, N> tails_{};
  std::array<uint32_t, N> sizes_{};
};

}  // namespace kvpool::core

// PrefixStats: how often each indexed block of a pool is hit, for `kvpoolctl prefixes`.
//
// Sixteen bytes per page, beside the pool core rather than in it (the core's page metadata stays
// one cache line's worth of what every operation needs): hits, the block's depth in the chains
// that hit it, when it was published and when it was last hit. stored() resets a page's counters
// when a (new) hash is published on it; hit() counts a lookup hit at a depth. A page that leaves
// the index keeps stale counters until its next publish, and they are never shown because only
// pages that carry a hash are listed. Counters saturate instead of wrapping.
//
// top() ranks the indexed pages a caller may see by hits, then depth (deeper first: among
// blocks hit equally often, the deepest names the longest prefix reused that often), then page
// id; O(pages + k log k) for k visible pages, run only for the admin query.
//
// Times are whole seconds since the daemon started, plus one (0 = never).
// Thread-safety: none; the event loop owns it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"
#include "daemon/core/page_pool.h"

namespace kvpool::daemon {

class PrefixStats {
 public:
  static constexpr uint32_t kUnknownDepth = UINT32_MAX;

  struct Counters {
    uint32_t hits = 0;
    uint32_t depth = kUnknownDepth;
    uint32_t published = 0;  // seconds since start + 1
    uint32_t last_hit = 0;   // seconds since start + 1; 0 = never hit
  };

  explicit PrefixStats(uint32_t pages) : pages_(pages) {}

  void stored(PageId page, uint32_t now) { pages_[page] = Counters{0, kUnknownDepth, now, 0}; }
  // The pages a lookup hit, in chain order: page i is at depth i.
  void hit(std::span<const PageId> chain_hits, uint32_t now);
  const Counters& of(PageId page) const { return pages_[page]; }
  // An elastic pool's new page count; a page an elastic shrink moved keeps its counters.
  void resize(uint32_t pages) { pages_.resize(pages); }
  void move(PageId from, PageId to) { pages_[to] = pages_[from]; }

  // Up to `limit` indexed pages of `pool` that `visible(ns)` allows, best first; `indexed`
  // receives how many indexed pages were visible.
  template <typename Visible>
  std::vector<PageId> top(const core::PagePool& pool, uint32_t limit, Visible&& visible,
                          uint32_t& indexed) const {
    std::vector<PageId> pages;
    Namespace ns = 0;
    BlockHash hash;
    for (PageId p = 0; p < pool.num_pages(); ++p) {
      if (pool.indexed_key(p, ns, hash) && visible(ns)) pages.push_back(p);
    }
    indexed = static_cast<uint32_t>(pages.size());
    rank(pages, limit);
    return pages;
  }

 private:
  // Keeps the best `limit` of `pages`, sorted.
  void rank(std::vector<PageId>& pages, uint32_t limit) const;

  std::vector<Counters> pages_;
};

}  // namespace kvpool::daemon

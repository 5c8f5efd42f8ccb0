// PagePool::lookup_window: prefix hits on a pool whose queries see only a window of keys
// (page_pool.h; the rule is first_needed_block in common/geometry.h).
//
// Algorithm: one pass over the chain probes the index for each block without changing anything,
// keeping the length of the run of usable blocks (cached, count not saturated, not named twice)
// that ends at the block. A hit of n blocks is usable when that run, ending at block n − 1,
// reaches back to first_needed_block(n); the pass keeps the largest such n and the contiguous
// prefix's length. Only when the window's n beats the prefix are its blocks [f, n) retained, by
// lookup() itself on that sub-chain, so quota, pins, hints and saturation have one
// implementation. The pre-scan checks what would make lookup() stop early (a saturated count, a
// page named twice, the quota), so the sub-chain lookup takes all of [f, n) or the pool is
// unchanged.
#include "daemon/core/page_pool.h"

#include <algorithm>

#include "daemon/core/check.h"

namespace kvpool::core {

Status PagePool::lookup_window(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                               const Geometry& geometry, std::span<PageId> out, uint32_t& hits,
                               uint32_t new_pages_allowed, const CallHints& hints) {
  const bool windowed =
      geometry.kind == AttentionKind::sliding || geometry.kind == AttentionKind::chunked;
  if (!windowed || chain.empty()) {
    return lookup(owner, ns, chain, out, hits, new_pages_allowed, hints);
  }
  hits = 0;
  const Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < chain.size()) return {Errc::invalid_argument, kNoItem, out.size()};

  ++epoch_;             // marks the pages seen, so a page named twice ends a run
  uint64_t prefix = 0;  // usable blocks from block 0
  uint64_t best = 0;    // the longest usable window hit
  uint64_t run = 0;     // usable blocks ending at block i
  for (uint64_t i = 0; i < chain.size(); ++i) {
    const PageId page = find_cached(ns, chain[i]);
    const bool usable =
        page != kNoPage && (pages_[page].word & kRefMask) != kRefMask && mark_[page] != epoch_;
    if (page != kNoPage) mark_[page] = epoch_;
    run = usable ? run + 1 : 0;
    const uint64_t n = i + 1;
    if (run == n) prefix = n;
    if (run != 0 && n - first_needed_block(geometry, n) <= run) best = n;
  }
  if (best <= prefix) return lookup(owner, ns, chain, out, hits, new_pages_allowed, hints);

  const uint64_t first = first_needed_block(geometry, best);
  const auto window = chain.subspan(first, best - first);
  if (new_pages_allowed != kUnlimited) {
    // Distinct pages (the run has none twice) that the owner does not hold yet.
    uint64_t fresh = 0;
    for (const BlockHash& h : window)
      fresh += l->find(find_cached(ns, h)) == nullptr ? 1u : 0u;
    if (fresh > new_pages_allowed) {
      return lookup(owner, ns, chain, out, hits, new_pages_allowed, hints);
    }
  }
  uint32_t taken = 0;
  if (Status s = lookup(owner, ns, window, out.subspan(first), taken, new_pages_allowed, hints);
      !s.ok()) {
    return s;
  }
  // The pre-scan saw every reason lookup() stops early, and nothing ran in between.
  KVPOOL_CHECK(taken == window.size());
  std::fill(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(first), kNoPage);
  counters_.lookup_blocks += chain.size() - window.size();  // lookup() counted the window's
  hits = static_cast<uint32_t>(best);
  return {};
}

}  // namespace kvpool::core

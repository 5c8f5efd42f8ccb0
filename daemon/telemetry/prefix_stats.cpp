#include "daemon/telemetry/prefix_stats.h"

#include <algorithm>

namespace kvpool::daemon {

void PrefixStats::hit(std::span<const PageId> chain_hits, uint32_t now) {
  for (size_t i = 0; i < chain_hits.size(); ++i) {
    if (chain_hits[i] == kNoPage) continue;  // a block before a sliding window's hit
    Counters& c = pages_[chain_hits[i]];
    if (c.hits != UINT32_MAX) ++c.hits;
    c.depth = static_cast<uint32_t>(std::min<size_t>(i, kUnknownDepth - 1));
    c.last_hit = now;
  }
}

void PrefixStats::rank(std::vector<PageId>& pages, uint32_t limit) const {
  auto better = [&](PageId a, PageId b) {
    const Counters& x = pages_[a];
    const Counters& y = pages_[b];
    if (x.hits != y.hits) return x.hits > y.hits;
    // Unknown depth (never hit) ranks after every known one.
    const uint64_t dx = x.depth == kUnknownDepth ? 0 : uint64_t{x.depth} + 1;
    const uint64_t dy = y.depth == kUnknownDepth ? 0 : uint64_t{y.depth} + 1;
    if (dx != dy) return dx > dy;
    return a < b;
  };
  const size_t keep = std::min<size_t>(limit, pages.size());
  std::partial_sort(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(keep), pages.end(),
                    better);
  pages.resize(keep);
}

}  // namespace kvpool::daemon

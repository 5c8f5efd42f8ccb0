// S3-FIFO eviction (Yang et al., SOSP'23), the scan-resistant classic kvpool compares against.
//
// Three queues: a small FIFO S (target 10% of the pool), a main FIFO M, and a ghost set G of the
// keys recently evicted from S (as many as M's target, 90% of the pool). Each page has a 2-bit
// frequency, raised by the hits it gets.
//   - A page cached for the first time with its contents goes to M when its key is in G (it was
//     evicted from S and asked for again), else to S.
//   - victim(): when S holds at least its target (or M is empty), take S's oldest until one is
//     the victim: with a frequency above 0 it moves to M (frequency reset), else it is the
//     victim and its key goes to G. Otherwise (or when all of S moved) take M's oldest: with a
//     frequency above 0 it goes back to M's tail with one less, else it is the victim. The
//     queue is chosen once per call, as in the paper: a page just moved to M is not evicted by
//     the call that moved it while S holds an unhit page. Each page moves at most 4 times per
//     pass: O(1) amortized.
// Adaptation to a pool: the pool takes a page out of the queues while it is in use (it must not
// be a victim), so a page released again re-enters at the tail of the queue it was in, adding the
// hits it got meanwhile; the original leaves a hit object in place. Tails still go before heads:
// a released chain enters a queue tail first.
//
// Invariant: a queued page is in S or M (PageLists), its freq_ ≤ 3.
#pragma once

#include <vector>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/ghost_set.h"
#include "daemon/core/page_lists.h"

namespace kvpool::core {

class S3FifoPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "s3fifo"; }
  void attach(uint32_t num_pages) override;
  // Keeps S, M and G; the targets follow the new size. G is rebuilt, forgetting what it held,
  // only when the pool grows past the size it was made for.
  void resize(uint32_t num_pages) override;
  void on_cached(PageId page, const PageFacts& facts) override;
  void on_reuse(PageId page) override { queues_.unlink(page); }
  PageId victim() override;
  void for_each_queued(const std::function<void(PageId)>& fn) const override;

 private:
  enum : uint8_t { kSmall = 0, kMain = 1 };
  struct PageState {
    uint64_t key = 0;
    uint8_t hits = 0;  // facts.hits when last queued, to add only the hits since
    uint8_t freq = 0;  // 0..3
    uint8_t queue = kSmall;
  };
  PageLists<2> queues_;
  std::vector<PageState> state_;
  GhostSet ghost_;
  uint32_t small_target_ = 1;
  uint64_t ghost_capacity_ = 0;
};

}  // namespace kvpool::core

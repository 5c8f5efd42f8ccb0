#include "daemon/core/s3fifo_policy.h"

#include <algorithm>

#include "daemon/core/check.h"

namespace kvpool::core {

void S3FifoPolicy::attach(uint32_t num_pages) {
  queues_.reset(num_pages);
  state_.assign(num_pages, PageState{});
  small_target_ = std::max<uint32_t>(1, num_pages / 10);
  ghost_capacity_ = num_pages - num_pages / 10;
  ghost_ = GhostSet(ghost_capacity_);
}

void S3FifoPolicy::resize(uint32_t num_pages) {
  queues_.resize(num_pages);
  state_.resize(num_pages, PageState{});
  small_target_ = std::max<uint32_t>(1, num_pages / 10);
  if (num_pages - num_pages / 10 > ghost_capacity_) {
    ghost_capacity_ = num_pages - num_pages / 10;
    ghost_ = GhostSet(ghost_capacity_);
  }
}

void S3FifoPolicy::on_cached(PageId page, const PageFacts& facts) {
  PageState& s = state_[page];
  if (facts.first) {
    s = PageState{facts.key, 0, 0, ghost_.take(facts.key) ? kMain : kSmall};
  }
  KVPOOL_DCHECK(facts.hits >= s.hits);  // hits only grow while a page keeps its contents
  const uint32_t gained = facts.hits - s.hits;
  s.hits = facts.hits;
  s.freq = static_cast<uint8_t>(std::min<uint32_t>(3, s.freq + gained));
  queues_.push_back(s.queue, page);
}

PageId S3FifoPolicy::victim() {
  // The queue is chosen once per call, as the paper's evictS does: a hit page that moves from S
  // to M must not turn this call to M, where (M being empty or short) it may be the head and go
  // at once while S keeps its unhit pages.
  if (!queues_.empty(kSmall) && (queues_.size(kSmall) >= small_target_ || queues_.empty(kMain))) {
    for (PageId page = queues_.pop_front(kSmall); page != kNoPage;
         page = queues_.pop_front(kSmall)) {
      PageState& s = state_[page];
      if (s.freq == 0) {
        ghost_.insert(s.key);
        return page;
      }
      s.freq = 0;
      s.queue = kMain;
      queues_.push_back(kMain, page);
    }
  }
  for (;;) {
    const PageId page = queues_.pop_front(kMain);
    if (page == kNoPage) return kNoPage;
    PageState& s = state_[page];
    if (s.freq == 0) return page;
    --s.freq;
    queues_.push_back(kMain, page);
  }
}

void S3FifoPolicy::for_each_queued(const std::function<void(PageId)>& fn) const {
  queues_.for_each(kSmall, fn);
  queues_.for_each(kMain, fn);
}

}  // namespace kvpool::core

#include "daemon/core/prefix_policy.h"

#include <algorithm>

namespace kvpool::core {

void PrefixPolicy::attach(uint32_t num_pages) {
  lists_.reset(num_pages);
  state_.assign(num_pages, 0);
  ghost_capacity_ = uint64_t{num_pages} * 2;
  ghost_ = GhostSet(ghost_capacity_);
  set_caps(num_pages);
}

void PrefixPolicy::resize(uint32_t num_pages) {
  lists_.resize(num_pages);
  state_.resize(num_pages, 0);
  if (uint64_t{num_pages} * 2 > ghost_capacity_) {
    ghost_capacity_ = uint64_t{num_pages} * 2;
    ghost_ = GhostSet(ghost_capacity_);
  }
  set_caps(num_pages);
}

void PrefixPolicy::set_caps(uint32_t num_pages) {
  protected_cap_ = std::max<uint32_t>(1, num_pages - num_pages / 10);
  system_cap_ = std::max<uint32_t>(1, num_pages / 2);
}

void PrefixPolicy::on_cached(PageId page, const PageFacts& facts) {
  uint64_t& s = state_[page];
  if (facts.first) {
    const uint64_t key = facts.key & ~kCameBack;
    s = ghost_.take(key) ? key | kCameBack : key;
  }

  Segment segment = kProbation;
  if (facts.priority == Priority::system) {
    segment = kSystem;
  } else if (facts.hits > 0 || (s & kCameBack) != 0 || facts.priority == Priority::conversation) {
    segment = kProtected;
  } else if (facts.priority == Priority::one_off) {
    segment = kOneOff;
  }
  // A head is worth no less than its tail: within one release, a page goes at least where the
  // page released just before it (its child, tail first) went, system excepted.
  if (facts.run > 0) segment = std::max(segment, std::min(last_segment_, kProtected));
  last_segment_ = segment;
  lists_.push_back(segment, page);

  if (lists_.size(kSystem) > system_cap_) lists_.push_back(kProtected, lists_.pop_front(kSystem));
  if (lists_.size(kProtected) > protected_cap_) {
    lists_.push_back(kProbation, lists_.pop_front(kProtected));
  }
}

PageId PrefixPolicy::victim() {
  for (uint8_t segment = 0; segment < kSegments; ++segment) {
    const PageId page = lists_.pop_front(segment);
    if (page != kNoPage) {
      ghost_.insert(state_[page] & ~kCameBack);
      return page;
    }
  }
  return kNoPage;
}

void PrefixPolicy::for_each_queued(const std::function<void(PageId)>& fn) const {
  for (uint8_t segment = 0; segment < kSegments; ++segment)
    lists_.for_each(segment, fn);
}

}  // namespace kvpool::core

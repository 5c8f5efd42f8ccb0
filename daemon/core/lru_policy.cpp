#include "daemon/core/lru_policy.h"

#include "daemon/core/check.h"

namespace kvpool::core {

void LruPolicy::attach(uint32_t num_pages) {
  prev_.assign(num_pages, kNoPage);
  next_.assign(num_pages, kNoPage);
  linked_.assign(num_pages, false);
  head_ = tail_ = kNoPage;
}

void LruPolicy::on_cached(PageId page) {
  KVPOOL_DCHECK(!linked_[page]);
  linked_[page] = true;
  prev_[page] = tail_;
  next_[page] = kNoPage;
  if (tail_ != kNoPage) {
    next_[tail_] = page;
  } else {
    head_ = page;
  }
  tail_ = page;
}

void LruPolicy::unlink(PageId page) {
  KVPOOL_DCHECK(linked_[page]);
  const PageId p = prev_[page];
  const PageId n = next_[page];
  if (p != kNoPage) {
    next_[p] = n;
  } else {
    head_ = n;
  }
  if (n != kNoPage) {
    prev_[n] = p;
  } else {
    tail_ = p;
  }
  linked_[page] = false;
}

void LruPolicy::on_reuse(PageId page) { unlink(page); }

PageId LruPolicy::victim() {
  const PageId page = head_;
  if (page != kNoPage) unlink(page);
  return page;
}

void LruPolicy::for_each_queued(const std::function<void(PageId)>& fn) const {
  for (PageId p = head_; p != kNoPage; p = next_[p]) fn(p);
}

}  // namespace kvpool::core

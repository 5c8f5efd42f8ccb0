#include "daemon/core/lru_policy.h"

#include "daemon/core/check.h"

namespace kvpool::core {

void LruPolicy::attach(uint32_t num_pages) {
  links_.assign(num_pages, Link{});
  head_ = tail_ = kNoPage;
}

void LruPolicy::on_cached(PageId page) {
  KVPOOL_DCHECK(links_[page].prev == kUnlinked);
  links_[page] = Link{tail_, kNoPage};
  if (tail_ != kNoPage) {
    links_[tail_].next = page;
  } else {
    head_ = page;
  }
  tail_ = page;
}

void LruPolicy::unlink(PageId page) {
  const Link l = links_[page];
  KVPOOL_DCHECK(l.prev != kUnlinked);
  if (l.prev != kNoPage) {
    links_[l.prev].next = l.next;
  } else {
    head_ = l.next;
  }
  if (l.next != kNoPage) {
    links_[l.next].prev = l.prev;
  } else {
    tail_ = l.prev;
  }
  links_[page] = Link{};
}

void LruPolicy::on_reuse(PageId page) {
  unlink(page);
}

PageId LruPolicy::victim() {
  const PageId page = head_;
  if (page != kNoPage) unlink(page);
  return page;
}

void LruPolicy::for_each_queued(const std::function<void(PageId)>& fn) const {
  for (PageId p = head_; p != kNoPage; p = links_[p].next)
    fn(p);
}

}  // namespace kvpool::core

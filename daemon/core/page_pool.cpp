#include "daemon/core/page_pool.h"

#include <random>
#include <stdexcept>

#include "daemon/core/check.h"
#include "daemon/core/lru_policy.h"

namespace kvpool::core {

namespace {

uint64_t random_seed() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

uint32_t checked_pages(uint32_t n) {
  if (n == 0) throw std::invalid_argument("a page pool needs at least one page");
  if (n > kMaxPages) throw std::invalid_argument("a page pool holds at most 2^31-1 pages");
  return n;
}

}  // namespace

PagePool::PagePool(PoolOptions options)
    : words_(checked_pages(options.num_pages), 0),
      keys_(options.num_pages),
      index_(options.num_pages, options.index_seed != 0 ? options.index_seed : random_seed()),
      policy_(options.policy ? std::move(options.policy) : std::make_unique<LruPolicy>()),
      mark_(options.num_pages, 0) {
  policy_->attach(options.num_pages);
  // Lowest ids on top, so a fresh pool hands out 0, 1, 2, ...
  free_.reserve(options.num_pages);
  for (uint32_t p = options.num_pages; p-- > 0;) free_.push_back(p);
}

PagePool::~PagePool() = default;

Ledger* PagePool::ledger(OwnerId owner) {
  return owner < owners_.size() ? owners_[owner].get() : nullptr;
}
const Ledger* PagePool::ledger(OwnerId owner) const {
  return owner < owners_.size() ? owners_[owner].get() : nullptr;
}

OwnerId PagePool::open_owner() {
  if (!free_owner_ids_.empty()) {
    const OwnerId id = free_owner_ids_.back();
    free_owner_ids_.pop_back();
    owners_[id] = std::make_unique<Ledger>();
    return id;
  }
  owners_.push_back(std::make_unique<Ledger>());
  return static_cast<OwnerId>(owners_.size() - 1);
}

Status PagePool::close_owner(OwnerId owner) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  for (const Ledger::Entry& e : l->entries_newest_first()) {
    for (uint32_t i = 0; i < e.count; ++i) unref_page(e.page);
  }
  counters_.released += l->references();
  owners_[owner].reset();
  free_owner_ids_.push_back(owner);
  return {};
}

void PagePool::ref_page(PageId page) {
  const uint32_t w = words_[page];
  if ((w & kRefMask) == 0) {
    // Only a CACHED page can gain its first reference here; FREE pages go through alloc.
    KVPOOL_DCHECK(w == kHashed);
    --cached_;
    ++in_use_;
    policy_->on_reuse(page);
  }
  words_[page] = w + 1;
}

void PagePool::unref_page(PageId page) {
  KVPOOL_DCHECK((words_[page] & kRefMask) != 0);
  const uint32_t w = --words_[page];
  if ((w & kRefMask) != 0) return;
  --in_use_;
  if (w & kHashed) {
    ++cached_;
    policy_->on_cached(page);
  } else {
    free_.push_back(page);
  }
}

void PagePool::uncache(PageId page) {
  KVPOOL_CHECK(words_[page] == kHashed);
  const PageKey& key = keys_[page];
  KVPOOL_CHECK(index_.erase(key.ns, key.hash));
  words_[page] = 0;
  --cached_;
}

PageId PagePool::take_page() {
  if (!free_.empty()) {
    const PageId page = free_.back();
    free_.pop_back();
    return page;
  }
  const PageId page = policy_->victim();
  KVPOOL_CHECK(page != kNoPage);
  uncache(page);
  ++counters_.evicted;
  return page;
}

Status PagePool::alloc(OwnerId owner, std::span<PageId> out) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  const uint64_t n = out.size();
  if (n > words_.size()) return {Errc::exceeds_capacity, kNoItem, n};
  if (n > free_.size() + cached_) return {Errc::out_of_pages, kNoItem, n};
  for (PageId& slot : out) {
    const PageId page = take_page();
    words_[page] = 1;
    l->add(page);
    slot = page;
  }
  in_use_ += static_cast<uint32_t>(n);
  counters_.allocated += n;
  return {};
}

Status PagePool::retain(OwnerId owner, std::span<const PageId> pages) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[i];
    const auto item = static_cast<uint32_t>(i);
    if (!valid_page(page)) return {Errc::invalid_page, item, page};
    if (l->find(page) == nullptr) return {Errc::not_held, item, page};
    if ((words_[page] & kRefMask) > kRefMask - pages.size()) {
      return {Errc::refcount_overflow, item, page};
    }
  }
  // Held pages are IN_USE, so no state changes: only counts move.
  for (const PageId page : pages) {
    l->add(page);
    ++words_[page];
  }
  return {};
}

Status PagePool::release(OwnerId owner, std::span<const PageId> pages) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  // Pass 1 takes the references out of the ledger, remembering how to put them back, so that a
  // page listed more often than it is held is caught before any page changes state.
  undo_.clear();
  for (size_t i = 0; i < pages.size(); ++i) {
    const PageId page = pages[i];
    Ledger::Entry* e = valid_page(page) ? l->find(page) : nullptr;
    if (e == nullptr) {
      for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) {
        if (it->count == 0) {
          l->add(it->page);  // entry still there: one reference back
        } else {
          l->restore(it->page, it->count, it->stamp);
        }
      }
      const auto item = static_cast<uint32_t>(i);
      return {valid_page(page) ? Errc::not_held : Errc::invalid_page, item, page};
    }
    // count 1 means "entry erased, restore it"; count 0 means "entry kept, add one back".
    undo_.push_back(Ledger::Entry{page, e->count == 1 ? 1u : 0u, e->stamp});
    l->remove_one(e);
  }
  // Pass 2 moves the pages, in the order given.
  for (const PageId page : pages) unref_page(page);
  counters_.released += pages.size();
  return {};
}

Status PagePool::lookup(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                        std::span<PageId> out, uint32_t& hits) {
  hits = 0;
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < chain.size()) return {Errc::invalid_argument, kNoItem, out.size()};
  uint32_t k = 0;
  for (const BlockHash& h : chain) {
    const PageId page = index_.find(ns, h);
    if (page == kNoPage || (words_[page] & kRefMask) == kRefMask) break;
    ref_page(page);
    l->add(page);
    out[k++] = page;
  }
  hits = k;
  ++counters_.lookups;
  counters_.lookup_blocks += chain.size();
  counters_.hit_blocks += k;
  return {};
}

Status PagePool::publish(OwnerId owner, Namespace ns, std::span<const PublishItem> items,
                         std::span<PublishResult> out) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < items.size()) return {Errc::invalid_argument, kNoItem, out.size()};
  ++epoch_;
  for (size_t i = 0; i < items.size(); ++i) {
    const PageId page = items[i].page;
    const auto item = static_cast<uint32_t>(i);
    if (!valid_page(page)) return {Errc::invalid_page, item, page};
    if (l->find(page) == nullptr) return {Errc::not_held, item, page};
    if (mark_[page] == epoch_) return {Errc::duplicate_item, item, page};
    mark_[page] = epoch_;
    if (words_[page] & kHashed) {
      const PageKey& key = keys_[page];
      if (key.ns != ns || key.hash != items[i].hash) return {Errc::already_published, item, page};
      continue;
    }
    const PageId existing = index_.find(ns, items[i].hash);
    if (existing != kNoPage && (words_[existing] & kRefMask) == kRefMask) {
      return {Errc::refcount_overflow, item, existing};
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const PageId page = items[i].page;
    if (words_[page] & kHashed) {
      out[i] = {PublishResult::Kind::stored, page};
      continue;
    }
    const PageId existing = index_.find(ns, items[i].hash);
    if (existing != kNoPage) {
      ref_page(existing);
      l->add(existing);
      out[i] = {PublishResult::Kind::duplicate, existing};
      ++counters_.duplicates;
      continue;
    }
    index_.insert(ns, items[i].hash, page);
    keys_[page] = PageKey{items[i].hash, ns};
    words_[page] |= kHashed;
    out[i] = {PublishResult::Kind::stored, page};
    ++counters_.published;
  }
  return {};
}

uint32_t PagePool::drop_victims(uint32_t n) {
  uint32_t dropped = 0;
  while (dropped < n) {
    const PageId page = policy_->victim();
    if (page == kNoPage) break;
    uncache(page);
    free_.push_back(page);
    ++dropped;
  }
  return dropped;
}

uint32_t PagePool::evict(uint32_t n) {
  const uint32_t dropped = drop_victims(n);
  counters_.evicted += dropped;
  return dropped;
}

uint32_t PagePool::flush() {
  const uint32_t dropped = drop_victims(cached_);
  KVPOOL_CHECK(cached_ == 0);
  counters_.flushed += dropped;
  return dropped;
}

PoolStats PagePool::stats() const {
  PoolStats s;
  s.total = num_pages();
  s.free = static_cast<uint32_t>(free_.size());
  s.in_use = in_use_;
  s.cached = cached_;
  s.owners = static_cast<uint32_t>(owners_.size() - free_owner_ids_.size());
  s.counters = counters_;
  return s;
}

PageState PagePool::state(PageId page) const {
  const uint32_t w = words_[page];
  if ((w & kRefMask) != 0) return PageState::in_use;
  return w == kHashed ? PageState::cached : PageState::free;
}

uint32_t PagePool::refcount(PageId page) const { return words_[page] & kRefMask; }

uint32_t PagePool::held(OwnerId owner, PageId page) const {
  const Ledger* l = ledger(owner);
  return l == nullptr || !valid_page(page) ? 0 : l->count(page);
}

}  // namespace kvpool::core

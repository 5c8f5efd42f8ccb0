#include "daemon/core/page_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string_view>

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
    : pages_(checked_pages(options.num_pages)),
      index_(options.num_pages, options.index_seed != 0 ? options.index_seed : random_seed()),
      policy_(options.policy ? std::move(options.policy) : std::make_unique<LruPolicy>()),
      expensive_checks_(options.expensive_checks),
      mark_(options.num_pages, 0) {
  policy_->attach(options.num_pages);
  // Lowest ids on top, so a fresh pool hands out 0, 1, 2, ...
  free_.reserve(options.num_pages);
  for (uint32_t p = options.num_pages; p-- > 0;)
    free_.push_back(p);
}

PagePool::~PagePool() = default;

Ledger* PagePool::ledger(OwnerId owner) {
  const auto slot = static_cast<uint32_t>(owner);
  if (slot >= owners_.size()) return nullptr;
  OwnerSlot& s = owners_[slot];
  return s.generation == static_cast<uint32_t>(owner >> 32) ? s.ledger.get() : nullptr;
}
const Ledger* PagePool::ledger(OwnerId owner) const {
  const auto slot = static_cast<uint32_t>(owner);
  if (slot >= owners_.size()) return nullptr;
  const OwnerSlot& s = owners_[slot];
  return s.generation == static_cast<uint32_t>(owner >> 32) ? s.ledger.get() : nullptr;
}

OwnerId PagePool::open_owner() {
  uint32_t slot = 0;
  if (!free_owner_slots_.empty()) {
    slot = free_owner_slots_.back();
    free_owner_slots_.pop_back();
  } else {
    KVPOOL_CHECK(owners_.size() < UINT32_MAX);
    slot = static_cast<uint32_t>(owners_.size());
    owners_.emplace_back();
  }
  owners_[slot].ledger = std::make_unique<Ledger>();
  ++open_owners_;
  return (OwnerId{owners_[slot].generation} << 32) | slot;
}

Status PagePool::close_owner(OwnerId owner) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  // One step per distinct page, not per reference: a ledger may hold 2^31 references to a page.
  for (const Ledger::Entry& e : l->entries_newest_first())
    unref_page(e.page, e.count);
  counters_.released += l->references();
  const auto slot = static_cast<uint32_t>(owner);
  owners_[slot].ledger.reset();
  // A slot whose generation would wrap is retired instead of reused.
  if (++owners_[slot].generation != 0) free_owner_slots_.push_back(slot);
  --open_owners_;
  checked("close_owner");
  return {};
}

PageId PagePool::find_cached(Namespace ns, const BlockHash& hash) const {
  return index_.find(ns, hash, [&](PageId p) {
    const PageMeta& m = pages_[p];
    return m.hash == hash && m.ns == ns;
  });
}

void PagePool::ref_page(PageId page) {
  const uint32_t w = pages_[page].word;
  if ((w & kRefMask) == 0) {
    // Only a CACHED page can gain its first reference here; FREE pages go through alloc.
    KVPOOL_DCHECK(w == kHashed);
    --cached_;
    ++in_use_;
    policy_->on_reuse(page);
  }
  pages_[page].word = w + 1;
}

void PagePool::unref_page(PageId page, uint32_t n) {
  KVPOOL_DCHECK((pages_[page].word & kRefMask) >= n);
  const uint32_t w = pages_[page].word -= n;
  if ((w & kRefMask) != 0) return;
  --in_use_;
  if (w & kHashed) {
    ++cached_;
    policy_->on_cached(page);
  } else {
    free_.push_back(page);
  }
}

void PagePool::uncache(PageId page, IndexObserver::Removal why) {
  PageMeta& m = pages_[page];
  KVPOOL_CHECK(m.word == kHashed);
  KVPOOL_CHECK(index_.erase(m.ns, m.hash, page));
  if (observer_ != nullptr) observer_->removed(m.ns, m.hash, page, why);
  m.word = 0;
  --cached_;
}

Status PagePool::alloc(OwnerId owner, std::span<PageId> out) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  const size_t n = out.size();
  if (n > pages_.size()) return {Errc::exceeds_capacity, kNoItem, n};
  if (n > free_.size() + cached_) return {Errc::out_of_pages, kNoItem, n};

  // FREE pages first (top of the stack first), then victims in the policy's order.
  const size_t from_free = std::min(n, free_.size());
  const auto rest = free_.end() - static_cast<std::ptrdiff_t>(from_free);
  std::reverse_copy(rest, free_.end(), out.begin());
  free_.erase(rest, free_.end());
  for (size_t k = from_free; k < n; ++k) {
    const PageId page = policy_->victim();
    KVPOOL_CHECK(page != kNoPage);
    uncache(page, IndexObserver::Removal::evicted);
    out[k] = page;
  }
  counters_.evicted += n - from_free;

  for (const PageId page : out) {
    pages_[page].word = 1;
    l->add(page);
  }
  in_use_ += static_cast<uint32_t>(n);
  counters_.allocated += n;
  checked("alloc");
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
    if ((pages_[page].word & kRefMask) > kRefMask - pages.size()) {
      return {Errc::refcount_overflow, item, page};
    }
  }
  // Held pages are IN_USE, so no state changes: only counts move.
  for (const PageId page : pages) {
    l->add(page);
    ++pages_[page].word;
  }
  checked("retain");
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
  for (const PageId page : pages)
    unref_page(page);
  counters_.released += pages.size();
  checked("release");
  return {};
}

Status PagePool::lookup(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                        std::span<PageId> out, uint32_t& hits, uint32_t new_pages_allowed) {
  hits = 0;
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < chain.size()) return {Errc::invalid_argument, kNoItem, out.size()};
  uint32_t k = 0;
  for (const BlockHash& h : chain) {
    const PageId page = find_cached(ns, h);
    if (page == kNoPage || (pages_[page].word & kRefMask) == kRefMask) break;
    // A page new to the owner counts against its quota; past it the prefix ends here. (Without
    // a quota the ledger probe that tells is skipped: l->add probes anyway.)
    if (new_pages_allowed != kUnlimited && l->find(page) == nullptr) {
      if (new_pages_allowed == 0) break;
      --new_pages_allowed;
    }
    ref_page(page);
    l->add(page);
    out[k++] = page;
  }
  hits = k;
  ++counters_.lookups;
  counters_.lookup_blocks += chain.size();
  counters_.hit_blocks += k;
  checked("lookup");
  return {};
}

Status PagePool::publish(OwnerId owner, Namespace ns, std::span<const PublishItem> items,
                         std::span<PublishResult> out, uint32_t new_pages_allowed) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < items.size()) return {Errc::invalid_argument, kNoItem, out.size()};
  ++epoch_;
  uint32_t new_pages = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const PageId page = items[i].page;
    const auto item = static_cast<uint32_t>(i);
    if (!valid_page(page)) return {Errc::invalid_page, item, page};
    if (l->find(page) == nullptr) return {Errc::not_held, item, page};
    if (mark_[page] == epoch_) return {Errc::duplicate_item, item, page};
    mark_[page] = epoch_;
    const PageMeta& m = pages_[page];
    if (m.word & kHashed) {
      if (m.ns != ns || m.hash != items[i].hash) return {Errc::already_published, item, page};
      continue;
    }
    // Conservative: every item of the batch might duplicate this same page.
    const PageId existing = find_cached(ns, items[i].hash);
    if (existing == kNoPage) continue;
    if ((pages_[existing].word & kRefMask) > kRefMask - items.size()) {
      return {Errc::refcount_overflow, item, existing};
    }
    // A duplicate hands the owner the existing page; one it does not hold counts against its
    // quota, once however many items name it. Marking it with this epoch cannot collide with
    // the item marks: a page the owner does not hold is refused as an item (not_held) first.
    if (l->find(existing) == nullptr && mark_[existing] != epoch_) {
      if (new_pages == new_pages_allowed) return {Errc::quota_exceeded, item, existing};
      mark_[existing] = epoch_;
      ++new_pages;
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const PageId page = items[i].page;
    PageMeta& m = pages_[page];
    if (m.word & kHashed) {
      out[i] = {PublishResult::Kind::stored, page};
      continue;
    }
    const PageId existing = find_cached(ns, items[i].hash);
    if (existing != kNoPage) {
      ref_page(existing);
      l->add(existing);
      out[i] = {PublishResult::Kind::duplicate, existing};
      ++counters_.duplicates;
      continue;
    }
    index_.insert(ns, items[i].hash, page);
    m.ns = ns;
    m.hash = items[i].hash;
    m.word |= kHashed;
    if (observer_ != nullptr) observer_->stored(ns, m.hash, page);
    out[i] = {PublishResult::Kind::stored, page};
    ++counters_.published;
  }
  checked("publish");
  return {};
}

uint32_t PagePool::drop_victims(uint32_t n, IndexObserver::Removal why) {
  uint32_t dropped = 0;
  while (dropped < n) {
    const PageId page = policy_->victim();
    if (page == kNoPage) break;
    uncache(page, why);
    free_.push_back(page);
    ++dropped;
  }
  return dropped;
}

uint32_t PagePool::evict(uint32_t n) {
  const uint32_t dropped = drop_victims(n, IndexObserver::Removal::evicted);
  counters_.evicted += dropped;
  checked("evict");
  return dropped;
}

uint32_t PagePool::flush() {
  const uint32_t dropped = drop_victims(cached_, IndexObserver::Removal::flushed);
  KVPOOL_CHECK(cached_ == 0);
  counters_.flushed += dropped;
  checked("flush");
  return dropped;
}

void PagePool::checked([[maybe_unused]] const char* op) const {
#ifdef KVPOOL_EXPENSIVE_CHECKS
  static const bool enabled = [] {
    const char* e = std::getenv("KVPOOL_EXPENSIVE_CHECKS");
    return e == nullptr || std::string_view(e) != "0";
  }();
  if (!enabled || !expensive_checks_) return;
  const std::string broken = check_invariants();
  if (!broken.empty()) {
    std::fprintf(stderr, "kvpool: pool invariant broken after %s: %s\n", op, broken.c_str());
    std::abort();
  }
#endif
}

PoolStats PagePool::stats() const {
  PoolStats s;
  s.total = num_pages();
  s.free = static_cast<uint32_t>(free_.size());
  s.in_use = in_use_;
  s.cached = cached_;
  s.owners = open_owners_;
  s.counters = counters_;
  return s;
}

PageState PagePool::state(PageId page) const {
  const uint32_t w = pages_[page].word;
  if ((w & kRefMask) != 0) return PageState::in_use;
  return w == kHashed ? PageState::cached : PageState::free;
}

bool PagePool::indexed_key(PageId page, Namespace& ns, BlockHash& hash) const {
  const PageMeta& m = pages_[page];
  if ((m.word & kHashed) == 0) return false;
  ns = m.ns;
  hash = m.hash;
  return true;
}

uint32_t PagePool::refcount(PageId page) const {
  return pages_[page].word & kRefMask;
}

uint32_t PagePool::held(OwnerId owner, PageId page) const {
  const Ledger* l = ledger(owner);
  return l == nullptr || !valid_page(page) ? 0 : l->count(page);
}

uint32_t PagePool::owner_pages(OwnerId owner) const {
  const Ledger* l = ledger(owner);
  return l == nullptr ? 0 : l->size();
}

}  // namespace kvpool::core

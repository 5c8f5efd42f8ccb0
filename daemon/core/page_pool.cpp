#include "daemon/core/page_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "daemon/core/check.h"

namespace kvpool::core {

namespace {

uint32_t checked_pages(uint32_t n) {
  if (n == 0) throw std::invalid_argument("a page pool needs at least one page");
  if (n > kMaxPages) throw std::invalid_argument("a page pool holds at most 2^31-1 pages");
  return n;
}

}  // namespace

PagePool::PagePool(PoolOptions options)
    : pages_(checked_pages(options.num_pages)),
      index_(options.num_pages,
             options.index_seed != 0 ? options.index_seed : PrefixIndex::secret_seed()),
      pin_(options.num_pages),
      clock_ms_(std::move(options.clock_ms)),
      policy_(options.policy ? std::move(options.policy) : make_policy("lru")),
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
  run_ = 0;
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
  PageMeta& m = pages_[page];
  const uint32_t w = m.word;
  if ((w & kRefMask) == 0) {
    // Only a CACHED page can gain its first reference here; FREE pages go through alloc.
    KVPOOL_DCHECK(w == kHashed);
    --cached_;
    ++in_use_;
    if (m.pinned) {
      --pinned_cached_;
    } else {
      policy_->on_reuse(page);
    }
  }
  if (m.hits != UINT8_MAX) ++m.hits;
  m.word = w + 1;
}

void PagePool::cache(PageId page) {
  ++cached_;
  PageMeta& m = pages_[page];
  if (m.pinned) {
    ++pinned_cached_;
    return;
  }
  policy_->on_cached(page,
                     PageFacts{contents_key(m.ns, m.hash), m.hits, m.priority, m.first, run_++});
  m.first = false;
}

void PagePool::set_policy(std::unique_ptr<EvictionPolicy> next) {
  KVPOOL_CHECK(next != nullptr);
  std::vector<PageId> order;
  order.reserve(cached_ - pinned_cached_);
  policy_->for_each_queued([&](PageId p) { order.push_back(p); });
  next->attach(num_pages());
  run_ = 0;
  for (const PageId page : order) {
    const PageMeta& m = pages_[page];
    next->on_cached(page, PageFacts{contents_key(m.ns, m.hash), m.hits, m.priority, true, 0});
  }
  policy_ = std::move(next);
  checked("set_policy");
}

void PagePool::resize_page_state(uint32_t n) {
  pages_.resize(n);
  pin_.resize(n);
  mark_.resize(n, 0);
  index_.reserve(n);
  policy_->resize(n);
}

Status PagePool::grow(uint32_t new_total) {
  const uint32_t old = num_pages();
  if (new_total <= old || new_total > kMaxPages)
    return {Errc::invalid_argument, kNoItem, new_total};
  resize_page_state(new_total);
  // Under the FREE pages already there, lowest new id nearest them: alloc keeps taking low pages
  // first, which leaves the tail free for a later shrink.
  std::vector<PageId> added;
  added.reserve(new_total - old);
  for (PageId p = new_total; p-- > old;)
    added.push_back(p);
  free_.insert(free_.begin(), added.begin(), added.end());
  checked("grow");
  return {};
}

void PagePool::relocate(PageId from, PageId to) {
  PageMeta& src = pages_[from];
  KVPOOL_CHECK(src.word == kHashed && pages_[to].word == 0 && !pages_[to].pinned);
  if (!src.pinned) policy_->on_reuse(from);
  KVPOOL_CHECK(index_.erase(src.ns, src.hash, from));
  PageMeta& dst = pages_[to];
  dst = src;
  src = PageMeta{};
  index_.insert(dst.ns, dst.hash, to);
  if (dst.pinned) {
    const Pin pin = pin_[from];
    KVPOOL_CHECK(pins_.erase({pin.until, from}) == 1);
    pins_.emplace(pin.until, to);
    pin_[to] = pin;
    pin_[from] = Pin{};
  } else {
    // A first caching for the policy, with what the pool knows: its state for `from` (ghost
    // bits, frequencies) does not follow the page, so it must not expect any for `to`.
    policy_->on_cached(to,
                       PageFacts{contents_key(dst.ns, dst.hash), dst.hits, dst.priority, true, 0});
  }
}

Status PagePool::shrink(uint32_t new_total, std::vector<PageMove>& moves) {
  const uint32_t old = num_pages();
  if (new_total == 0 || new_total >= old) return {Errc::invalid_argument, kNoItem, new_total};
  uint32_t held = 0;
  PageId first_held = kNoPage;
  for (PageId p = new_total; p < old; ++p) {
    if ((pages_[p].word & kRefMask) != 0 && held++ == 0) first_held = p;
  }
  if (held != 0) return {Errc::pages_in_use, held, first_held};

  expire_pins();
  std::erase_if(free_, [&](PageId p) { return p >= new_total; });
  // The tail's CACHED pages, those to evict first first: unpinned ones in the policy's order
  // (so the moved ones also re-enter it in the order they left it: a chain's tail still goes
  // before its head), then pinned ones, whose pin promised they would stay.
  std::vector<PageId> tail;
  uint32_t tail_unpinned = 0;
  for (PageId p = new_total; p < old; ++p) {
    if (pages_[p].word == kHashed && !pages_[p].pinned) ++tail_unpinned;
  }
  if (tail_unpinned != 0) {
    policy_->for_each_queued([&](PageId p) {
      if (p >= new_total) tail.push_back(p);
    });
    KVPOOL_CHECK(tail.size() == tail_unpinned);
  }
  for (PageId p = new_total; p < old; ++p) {
    if (pages_[p].word == kHashed && pages_[p].pinned) tail.push_back(p);
  }

  const size_t evicting = tail.size() > free_.size() ? tail.size() - free_.size() : 0;
  for (size_t i = 0; i < tail.size(); ++i) {
    const PageId from = tail[i];
    if (i < evicting) {
      if (!pages_[from].pinned) policy_->on_reuse(from);  // out of its queue, as victim() would
      uncache(from, IndexObserver::Removal::evicted);
      continue;
    }
    // From the top of the stack, as alloc takes them.
    const PageId to = free_.back();
    free_.pop_back();
    relocate(from, to);
    moves.push_back(PageMove{from, to});
  }
  counters_.evicted += evicting;
  resize_page_state(new_total);
  checked("shrink");
  return {};
}

uint64_t PagePool::now_ms() const {
  if (clock_ms_) return clock_ms_();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void PagePool::unpin(PageId page) {
  Pin& pin = pin_[page];
  KVPOOL_CHECK(pages_[page].pinned && pins_.erase({pin.until, page}) == 1);
  --pinned_per_account_[pin.account];
  pin = Pin{};
  pages_[page].pinned = false;
}

void PagePool::expire_due_pins() {
  const uint64_t now = now_ms();
  run_ = 0;
  while (!pins_.empty() && pins_.begin()->first <= now) {
    const PageId page = pins_.begin()->second;
    unpin(page);
    ++counters_.pins_expired;
    if (state(page) == PageState::cached) {
      --pinned_cached_;
      --cached_;  // cache() counts it again
      cache(page);
    }
  }
}

uint32_t PagePool::pinned_by(uint32_t account) const {
  return account < pinned_per_account_.size() ? pinned_per_account_[account] : 0;
}

Status PagePool::check_pin_limit(const CallHints& hints, uint64_t adding) const {
  if (hints.hints.pin_ttl_ms == 0 || adding == 0) return {};
  const uint64_t after = uint64_t{pinned_by(hints.pin_account)} + adding;
  if (after > hints.pin_limit) return {Errc::pin_limit_exceeded, kNoItem, after};
  const uint64_t pool_after = pins_.size() + adding;
  if (pool_after > hints.pool_pin_limit) {
    return {Errc::pin_limit_exceeded, kPoolPinItem, pool_after};
  }
  return {};
}

uint64_t PagePool::new_pins(const CallHints& hints, std::span<const PageId> pages, uint64_t now) {
  if (hints.hints.pin_ttl_ms == 0) return 0;
  const uint64_t until = now + hints.hints.pin_ttl_ms;
  ++epoch_;
  uint64_t n = 0;
  for (const PageId page : pages) {
    if (mark_[page] == epoch_) continue;
    mark_[page] = epoch_;
    const PageMeta& m = pages_[page];
    if (!m.pinned || (pin_[page].account != hints.pin_account && until > pin_[page].until)) ++n;
  }
  return n;
}

void PagePool::apply_hints(PageId page, const CallHints& hints, uint64_t now) {
  PageMeta& m = pages_[page];
  KVPOOL_DCHECK((m.word & kRefMask) != 0);
  m.priority = std::max(m.priority, hints.hints.priority);
  if (hints.hints.pin_ttl_ms == 0) return;
  const uint64_t until = now + hints.hints.pin_ttl_ms;
  if (m.pinned && until <= pin_[page].until) return;
  if (m.pinned) unpin(page);
  m.pinned = true;
  pin_[page] = Pin{until, hints.pin_account};
  if (pinned_per_account_.size() <= hints.pin_account) {
    pinned_per_account_.resize(size_t{hints.pin_account} + 1, 0);
  }
  ++pinned_per_account_[hints.pin_account];
  pins_.emplace(until, page);
  ++counters_.pins;
}

void PagePool::unref_page(PageId page, uint32_t n) {
  KVPOOL_DCHECK((pages_[page].word & kRefMask) >= n);
  const uint32_t w = pages_[page].word -= n;
  if ((w & kRefMask) != 0) return;
  --in_use_;
  if (w & kHashed) {
    cache(page);
  } else {
    // An unpublished page has nothing worth keeping: its pin and class go with it.
    PageMeta& m = pages_[page];
    if (m.pinned) unpin(page);
    m.forget_facts();
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
  if (m.pinned) {
    unpin(page);
    --pinned_cached_;
  }
  m.forget_facts();
}

Status PagePool::admit_alloc(size_t n, const CallHints& hints, size_t max_pages, size_t growable) {
  if (n > std::max(max_pages, pages_.size())) return {Errc::exceeds_capacity, kNoItem, n};
  expire_pins();
  if (n > free_.size() + cached_ - pinned_cached_ + growable) {
    return {Errc::out_of_pages, kNoItem, n};
  }
  return check_pin_limit(hints, n);
}

Status PagePool::alloc(OwnerId owner, std::span<PageId> out, const CallHints& hints) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  const size_t n = out.size();
  if (Status s = admit_alloc(n, hints, pages_.size(), 0); !s.ok()) return s;

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

  const bool hinted = !hints.hints.empty();
  const uint64_t now = hints.hints.pin_ttl_ms != 0 ? now_ms() : 0;
  for (const PageId page : out) {
    pages_[page].word = 1;
    l->add(page);
    if (hinted) apply_hints(page, hints, now);
  }
  in_use_ += static_cast<uint32_t>(n);
  counters_.allocated += n;
  checked("alloc");
  return {};
}

Status PagePool::retain(OwnerId owner, std::span<const PageId> pages, const CallHints& hints) {
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
  uint64_t now = 0;
  if (!hints.hints.empty()) {
    expire_pins();
    if (hints.hints.pin_ttl_ms != 0) now = now_ms();
    if (Status s = check_pin_limit(hints, new_pins(hints, pages, now)); !s.ok()) return s;
  }
  // Held pages are IN_USE, so no state changes: only counts move.
  for (const PageId page : pages) {
    l->add(page);
    ++pages_[page].word;
    if (!hints.hints.empty()) apply_hints(page, hints, now);
  }
  checked("retain");
  return {};
}

Status PagePool::share(OwnerId owner, PageId page) {
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (!valid_page(page)) return {Errc::invalid_page, 0, page};
  const uint64_t refs = pages_[page].word & kRefMask;
  if (refs == 0) return {Errc::not_held, 0, page};
  if (refs == kRefMask) return {Errc::refcount_overflow, 0, page};
  // Held pages are IN_USE, so no state changes: only counts move.
  l->add(page);
  ++pages_[page].word;
  checked("share");
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
  run_ = 0;
  for (const PageId page : pages)
    unref_page(page);
  counters_.released += pages.size();
  checked("release");
  return {};
}

uint32_t PagePool::walk_prefix(Namespace ns, std::span<const BlockHash> chain, const Ledger& l,
                               uint32_t new_pages_allowed, std::span<PageId> out) {
  ++epoch_;  // marks the pages counted against the quota once
  uint32_t k = 0;
  for (const BlockHash& h : chain) {
    const PageId page = find_cached(ns, h);
    if (page == kNoPage || (pages_[page].word & kRefMask) == kRefMask) break;
    // A page new to the owner counts against its quota; past it the prefix ends here. (Without
    // a quota the ledger probe that tells is skipped.)
    if (new_pages_allowed != kUnlimited && mark_[page] != epoch_ && l.find(page) == nullptr) {
      if (new_pages_allowed == 0) break;
      --new_pages_allowed;
    }
    mark_[page] = epoch_;
    out[k++] = page;
  }
  return k;
}

Status PagePool::lookup(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                        std::span<PageId> out, uint32_t& hits, uint32_t new_pages_allowed,
                        const CallHints& hints) {
  hits = 0;
  Ledger* l = ledger(owner);
  if (l == nullptr) return {Errc::invalid_owner, kNoItem, owner};
  if (out.size() < chain.size()) return {Errc::invalid_argument, kNoItem, out.size()};
  if (hints.hints.pin_ttl_ms != 0) expire_pins();
  const uint32_t found = walk_prefix(ns, chain, *l, new_pages_allowed, out);
  const uint64_t now = hints.hints.pin_ttl_ms != 0 ? now_ms() : 0;
  if (hints.hints.pin_ttl_ms != 0) {
    const uint64_t adding = new_pins(hints, out.first(found), now);
    if (Status s = check_pin_limit(hints, adding); !s.ok()) return s;
  }
  // References for the pages found. A page named twice in the chain whose count the first
  // reference saturates ends the prefix there, as it would have in one pass.
  uint32_t k = 0;
  for (; k < found; ++k) {
    const PageId page = out[k];
    if ((pages_[page].word & kRefMask) == kRefMask) break;
    ref_page(page);
    l->add(page);
  }
  hits = k;
  if (!hints.hints.empty()) {
    for (uint32_t i = 0; i < k; ++i)
      apply_hints(out[i], hints, now);
  }
  ++counters_.lookups;
  counters_.lookup_blocks += chain.size();
  counters_.hit_blocks += k;
  checked("lookup");
  return {};
}

Status PagePool::publish(OwnerId owner, Namespace ns, std::span<const PublishItem> items,
                         std::span<PublishResult> out, uint32_t new_pages_allowed,
                         const CallHints& hints) {
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
  uint64_t now = 0;
  if (hints.hints.pin_ttl_ms != 0) {
    // The pages the caller will end up with: its own, the page already carrying the hash, or
    // the page an earlier item of the batch stores it on.
    expire_pins();
    now = now_ms();
    pin_scratch_.clear();
    for (const PublishItem& item : items) {
      const PageId existing =
          (pages_[item.page].word & kHashed) ? kNoPage : find_cached(ns, item.hash);
      pin_scratch_.push_back(existing != kNoPage ? existing : item.page);
    }
    // An item whose hash an earlier item of the batch stores ends up with that item's page (a
    // duplicate): sorted by (hash, item), each such item takes the page of its group's first.
    item_scratch_.clear();
    for (size_t i = 0; i < items.size(); ++i) {
      if (pin_scratch_[i] == items[i].page && (pages_[items[i].page].word & kHashed) == 0) {
        item_scratch_.push_back(static_cast<uint32_t>(i));
      }
    }
    std::sort(item_scratch_.begin(), item_scratch_.end(), [&](uint32_t a, uint32_t b) {
      const BlockHash& x = items[a].hash;
      const BlockHash& y = items[b].hash;
      if (x.lo != y.lo) return x.lo < y.lo;
      if (x.hi != y.hi) return x.hi < y.hi;
      return a < b;
    });
    for (size_t j = 1; j < item_scratch_.size(); ++j) {
      if (items[item_scratch_[j]].hash == items[item_scratch_[j - 1]].hash) {
        pin_scratch_[item_scratch_[j]] = pin_scratch_[item_scratch_[j - 1]];
      }
    }
    if (Status s = check_pin_limit(hints, new_pins(hints, pin_scratch_, now)); !s.ok()) return s;
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
    m.first = true;
    if (observer_ != nullptr) observer_->stored(ns, m.hash, page);
    out[i] = {PublishResult::Kind::stored, page};
    ++counters_.published;
  }
  if (!hints.hints.empty()) {
    for (size_t i = 0; i < items.size(); ++i)
      apply_hints(out[i].page, hints, now);
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
  expire_pins();
  const uint32_t dropped = drop_victims(n, IndexObserver::Removal::evicted);
  counters_.evicted += dropped;
  checked("evict");
  return dropped;
}

Status PagePool::check_hints(std::span<const PageId> pages, const CallHints& hints) {
  if (hints.hints.empty()) return {};
  expire_pins();
  const uint64_t now = hints.hints.pin_ttl_ms != 0 ? now_ms() : 0;
  return check_pin_limit(hints, new_pins(hints, pages, now));
}

bool PagePool::drop_cached(Namespace ns, const BlockHash& hash) {
  const PageId page = find_cached(ns, hash);
  if (page == kNoPage || pages_[page].word != kHashed || pages_[page].pinned) return false;
  policy_->on_reuse(page);  // out of its queue, as victim() would take it
  uncache(page, IndexObserver::Removal::dropped);
  free_.push_back(page);
  ++counters_.evicted;
  checked("drop_cached");
  return true;
}

uint32_t PagePool::evict_into(OwnerId owner, uint32_t n, std::vector<PageId>& out) {
  Ledger* l = ledger(owner);
  KVPOOL_CHECK(l != nullptr);
  expire_pins();
  const size_t before = free_.size();
  const uint32_t dropped = drop_victims(n, IndexObserver::Removal::evicted);
  counters_.evicted += dropped;
  // drop_victims pushed exactly the victims on top of the free stack: take them back off.
  KVPOOL_CHECK(free_.size() == before + dropped);
  for (size_t i = before; i < free_.size(); ++i) {
    const PageId page = free_[i];
    pages_[page].word = 1;
    l->add(page);
    out.push_back(page);
  }
  free_.resize(before);
  in_use_ += dropped;
  counters_.allocated += dropped;  // handed out, to the owner: its release is counted too
  checked("evict_into");
  return dropped;
}

uint32_t PagePool::flush() {
  expire_pins();
  uint32_t dropped = drop_victims(cached_, IndexObserver::Removal::flushed);
  // What is left is pinned: flush is the operator's override.
  pin_scratch_.clear();
  for (const auto& [until, page] : pins_) {
    if (state(page) == PageState::cached) pin_scratch_.push_back(page);
  }
  for (const PageId page : pin_scratch_) {
    uncache(page, IndexObserver::Removal::flushed);
    free_.push_back(page);
    ++dropped;
  }
  KVPOOL_CHECK(cached_ == 0 && pinned_cached_ == 0);
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
  s.pinned = static_cast<uint32_t>(pins_.size());
  s.pinned_cached = pinned_cached_;
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

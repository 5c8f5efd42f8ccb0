#include "daemon/core/tier_mover.h"

#include <algorithm>

#include "daemon/core/check.h"

namespace kvpool::core {

TierMover::TierMover(PagePool& pool, HostTier& host, IndexObserver* next)
    : pool_(pool), host_(host), next_(next) {
  pool_.set_observer(this);
  host_.set_observer(next_);
}

TierMover::~TierMover() {
  pool_.set_observer(next_);
  host_.set_observer(nullptr);
}

void TierMover::stored(Namespace ns, const BlockHash& hash, PageId page) {
  if (next_ != nullptr) next_->stored(ns, hash, page);
  // A block computed afresh while a copy waited below: the device tier's is the one to keep.
  if (host_.held() != 0) host_.erase(ns, hash);
}

void TierMover::removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) {
  if (next_ != nullptr) next_->removed(ns, hash, page, why);
  if (why == Removal::evicted && host_.capacity() > 0) pending_.push_back({ns, hash, page});
}

std::span<const TierMover::Move> TierMover::admit_pending() {
  demotions_.clear();
  bool reused = false;
  for (const Eviction& e : pending_) {
    const HostTier::Admission a = host_.admit(e.ns, e.hash);
    if (a.slot != kNoSlot && a.copy) demotions_.push_back({e.page, a.slot});
    reused |= a.dropped;
  }
  pending_.clear();
  if (reused && demotions_.size() > 1) {
    // More evictions than the tier has room for: a slot admitted early in the batch was given
    // again to a later block. Only its last block's copy counts, so that each slot is written
    // (or discarded) once.
    std::vector<bool> seen(host_.capacity(), false);
    size_t keep = demotions_.size();
    for (size_t i = demotions_.size(); i-- > 0;) {
      if (seen[demotions_[i].slot]) continue;
      seen[demotions_[i].slot] = true;
      demotions_[--keep] = demotions_[i];
    }
    demotions_.erase(demotions_.begin(), demotions_.begin() + static_cast<std::ptrdiff_t>(keep));
  }
  return demotions_;
}

std::span<const TierMover::Move> TierMover::start_promotion(OwnerId owner, Namespace ns,
                                                            std::span<const BlockHash> chain,
                                                            uint32_t max, const CallHints& hints) {
  KVPOOL_CHECK(promotions_.count(owner) == 0);
  if (host_.held() == 0 || max == 0) return {};
  // Only as many as the device tier can hand out now, so that the allocation cannot fail for
  // want of pages: free ones and unpinned cached ones.
  pool_.expire_pins();
  const PoolStats st = pool_.stats();
  const uint64_t room = uint64_t{st.free} + st.cached - st.pinned_cached;
  const size_t limit = std::min<uint64_t>({chain.size(), max, room});
  std::vector<Move> promos;
  for (size_t i = 0; i < limit; ++i) {
    const SlotId slot = host_.find(ns, chain[i]);
    if (slot == kNoSlot) break;
    host_.begin_promote(slot);
    promos.push_back({kNoPage, slot});
  }
  if (promos.empty()) return {};
  pages_.resize(promos.size());
  Status s = pool_.alloc(owner, pages_, hints);
  if (s.code() == Errc::pin_limit_exceeded) {
    // The pin is the caller's wish for the pages it asked for; promoted pages go without it.
    CallHints unpinned = hints;
    unpinned.hints.pin_ttl_ms = 0;
    s = pool_.alloc(owner, pages_, unpinned);
  }
  if (!s.ok()) {
    for (const Move& m : promos)
      host_.cancel_promote(m.slot);
    return {};
  }
  for (size_t i = 0; i < promos.size(); ++i)
    promos[i].page = pages_[i];
  // Node-based map: the vector, and the span into it, stay put while other owners come and go.
  return promotions_[owner] = std::move(promos);
}

uint32_t TierMover::finish_promotion(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                                     std::span<PageId> out) {
  const auto open = promotions_.find(owner);
  KVPOOL_CHECK(open != promotions_.end());
  const std::vector<Move> promos = std::move(open->second);
  promotions_.erase(open);
  const size_t n = promos.size();
  KVPOOL_CHECK(chain.size() >= n && out.size() >= n);
  items_.resize(n);
  results_.resize(n);
  for (size_t i = 0; i < n; ++i)
    items_[i] = PublishItem{promos[i].page, chain[i]};
  const Status s = pool_.publish(owner, ns, items_, results_);
  // The owner holds every page and each hash appears once: nothing can refuse this publish.
  KVPOOL_CHECK(s.ok());
  pages_.clear();
  for (size_t i = 0; i < n; ++i) {
    out[i] = results_[i].page;
    if (results_[i].kind == PublishResult::Kind::duplicate) pages_.push_back(promos[i].page);
    host_.end_promote(promos[i].slot);
  }
  if (!pages_.empty()) KVPOOL_CHECK(pool_.release(owner, pages_).ok());
  return static_cast<uint32_t>(n);
}

void TierMover::cancel_promotion(OwnerId owner, bool keep_slots) {
  const auto open = promotions_.find(owner);
  if (open == promotions_.end()) return;
  pages_.clear();
  for (const Move& m : open->second) {
    pages_.push_back(m.page);
    if (keep_slots) {
      host_.cancel_promote(m.slot);
    } else {
      host_.drop_promote(m.slot);
    }
  }
  promotions_.erase(open);
  if (!pages_.empty()) KVPOOL_CHECK(pool_.release(owner, pages_).ok());
}

}  // namespace kvpool::core

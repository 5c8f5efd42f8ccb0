#include "daemon/core/host_tier.h"

#include "daemon/core/check.h"

namespace kvpool::core {

HostTier::HostTier(uint32_t slots, uint64_t index_seed)
    : keys_(slots), index_(slots, index_seed != 0 ? index_seed : PrefixIndex::secret_seed()) {
  KVPOOL_CHECK(slots <= kMaxPages);
  lru_.reset(slots);
  free_.reserve(slots);
  // Slot 0 comes out first: the stack's top is its end.
  for (uint32_t s = slots; s-- > 0;)
    free_.push_back(s);
}

SlotId HostTier::find(Namespace ns, const BlockHash& hash) const {
  return index_.find(ns, hash, [&](PageId slot) {
    const Key& k = keys_[slot];
    return k.state == SlotState::held && k.ns == ns && k.hash == hash;
  });
}

void HostTier::make_held(SlotId slot, Namespace ns, const BlockHash& hash) {
  keys_[slot] = Key{ns, hash, SlotState::held};
  index_.insert(ns, hash, slot);
  lru_.push_back(0, slot);
  if (observer_ != nullptr) observer_->host_stored(ns, hash);
}

void HostTier::unhold(SlotId slot, SlotState next) {
  Key& k = keys_[slot];
  KVPOOL_CHECK(k.state == SlotState::held);
  KVPOOL_CHECK(index_.erase(k.ns, k.hash, slot));
  lru_.unlink(slot);
  k.state = next;
  if (next == SlotState::free) free_.push_back(slot);
  if (observer_ != nullptr) observer_->host_removed(k.ns, k.hash, next == SlotState::promoting);
}

HostTier::Admission HostTier::admit(Namespace ns, const BlockHash& hash) {
  Admission a;
  if (const SlotId held = find(ns, hash); held != kNoSlot) {
    lru_.unlink(held);
    lru_.push_back(0, held);
    ++counters_.refreshed;
    a.slot = held;
    return a;
  }
  if (free_.empty()) {
    if (lru_.empty(0)) return a;  // every slot is being promoted
    const SlotId victim = lru_.front(0);
    a.dropped = true;
    a.dropped_ns = keys_[victim].ns;
    a.dropped_hash = keys_[victim].hash;
    unhold(victim, SlotState::free);
    ++counters_.dropped;
  }
  a.slot = free_.back();
  free_.pop_back();
  make_held(a.slot, ns, hash);
  a.copy = true;
  ++counters_.demoted;
  return a;
}

void HostTier::begin_promote(SlotId slot) {
  unhold(slot, SlotState::promoting);
  ++promoting_;
}

void HostTier::end_promote(SlotId slot) {
  Key& k = keys_[slot];
  KVPOOL_CHECK(k.state == SlotState::promoting);
  k.state = SlotState::free;
  free_.push_back(slot);
  --promoting_;
  ++counters_.promoted;
}

void HostTier::cancel_promote(SlotId slot) {
  Key& k = keys_[slot];
  KVPOOL_CHECK(k.state == SlotState::promoting);
  --promoting_;
  // A block demoted again meanwhile (same key) cannot exist: the key was out of the index, so
  // admit() gave it another slot. Keep the newer copy and free this one.
  if (find(k.ns, k.hash) != kNoSlot) {
    k.state = SlotState::free;
    free_.push_back(slot);
    return;
  }
  make_held(slot, k.ns, k.hash);
}

void HostTier::drop_promote(SlotId slot) {
  Key& k = keys_[slot];
  KVPOOL_CHECK(k.state == SlotState::promoting);
  --promoting_;
  k.state = SlotState::free;
  free_.push_back(slot);
  ++counters_.dropped;
}

bool HostTier::free_held(Namespace ns, const BlockHash& hash, uint64_t& counter) {
  const SlotId slot = find(ns, hash);
  if (slot == kNoSlot) return false;
  unhold(slot, SlotState::free);
  ++counter;
  return true;
}

bool HostTier::drop(Namespace ns, const BlockHash& hash) {
  return free_held(ns, hash, counters_.dropped);
}

bool HostTier::erase(Namespace ns, const BlockHash& hash) {
  return free_held(ns, hash, counters_.superseded);
}

void HostTier::discard(SlotId slot) {
  // A copy that ran off the event loop may fail after its slot was flushed, taken by another
  // block or claimed by a promotion: only a HELD slot is dropped (the caller cancels promotions
  // that read a failed slot, host_tier_store.h).
  if (keys_[slot].state != SlotState::held) return;
  unhold(slot, SlotState::free);
  --counters_.demoted;
}

uint32_t HostTier::flush() {
  uint32_t n = 0;
  while (!lru_.empty(0)) {
    unhold(lru_.front(0), SlotState::free);
    ++n;
  }
  counters_.flushed += n;
  return n;
}

std::string HostTier::check_invariants() const {
  uint32_t free = 0, held = 0, promoting = 0;
  for (SlotId s = 0; s < keys_.size(); ++s) {
    const Key& k = keys_[s];
    switch (k.state) {
      case SlotState::free:
        ++free;
        break;
      case SlotState::held:
        ++held;
        if (find(k.ns, k.hash) != s) return "H2: held slot " + std::to_string(s) + " not indexed";
        if (lru_.list_of(s) != 0) return "H2: held slot " + std::to_string(s) + " not queued";
        break;
      case SlotState::promoting:
        ++promoting;
        if (lru_.list_of(s) != decltype(lru_)::kNone) {
          return "H2: promoting slot " + std::to_string(s) + " is queued";
        }
        break;
    }
  }
  if (free + held + promoting != keys_.size() || promoting != promoting_) {
    return "H1: free " + std::to_string(free) + " + held " + std::to_string(held) +
           " + promoting " + std::to_string(promoting) + " != capacity " +
           std::to_string(keys_.size());
  }
  if (held != index_.size() || held != lru_.size(0)) {
    return "H2: " + std::to_string(held) + " held slots, " + std::to_string(index_.size()) +
           " indexed, " + std::to_string(lru_.size(0)) + " queued";
  }
  if (free_.size() != free) return "H3: free stack holds " + std::to_string(free_.size());
  for (SlotId s : free_) {
    if (keys_[s].state != SlotState::free) return "H3: slot " + std::to_string(s) + " not free";
  }
  return {};
}

}  // namespace kvpool::core

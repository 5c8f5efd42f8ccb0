// PrefixIndex: (namespace, block hash) → page id, for the pages that carry a hash.
//
// Open addressing with linear probing and backward-shift deletion, full keys stored in the slots
// so that a probe reads one cache line and never touches page metadata. At most one entry per
// page, so the table is sized once to hold every page at load ≤ 1/2 and never rehashes.
//
// Block hashes come from clients. An honest client's hashes are uniform, but a hostile one could
// choose hashes that pile into one probe run and turn every lookup into a scan; the slot is
// therefore derived through a keyed multiply-fold (wyhash's mum) with a per-index random secret,
// so a client cannot predict which hashes collide in the table.
//
// Invariants: size() = number of occupied slots ≤ capacity / 2; no key appears twice; every
// occupied slot is reachable by probing from its home slot without crossing an empty slot.
// Thread-safety: none; owned by one PagePool.
#pragma once

#include <cstdint>
#include <vector>

#include "common/block_hash.h"
#include "daemon/core/types.h"

namespace kvpool::core {

class PrefixIndex {
 public:
  // Room for `max_entries` keys. `seed` keys the slot hash; pass a random value in production.
  PrefixIndex(uint32_t max_entries, uint64_t seed);

  // The page stored under (ns, hash), or kNoPage.
  PageId find(Namespace ns, const BlockHash& hash) const {
    const Slot& s = slots_[probe(ns, hash)];
    return s.page;
  }
  // Stores (ns, hash) → page. Precondition: the key is absent and size() < max_entries.
  void insert(Namespace ns, const BlockHash& hash, PageId page);
  // Removes (ns, hash); returns false when it was absent.
  bool erase(Namespace ns, const BlockHash& hash);

  uint32_t size() const { return size_; }

  template <typename Fn>  // fn(Namespace, const BlockHash&, PageId)
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.page != kNoPage) fn(s.ns, BlockHash{s.lo, s.hi}, s.page);
    }
  }

 private:
  struct Slot {
    uint64_t lo = 0;
    uint64_t hi = 0;
    Namespace ns = 0;
    PageId page = kNoPage;  // kNoPage marks an empty slot
  };

  uint32_t home(Namespace ns, uint64_t lo, uint64_t hi) const;
  // Slot holding (ns, hash), or the empty slot that ends its probe run.
  uint32_t probe(Namespace ns, const BlockHash& hash) const {
    uint32_t i = home(ns, hash.lo, hash.hi);
    for (;;) {
      const Slot& s = slots_[i];
      if (s.page == kNoPage || (s.lo == hash.lo && s.hi == hash.hi && s.ns == ns)) return i;
      i = (i + 1) & mask_;
    }
  }

  std::vector<Slot> slots_;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
  uint32_t size_ = 0;
  uint64_t key0_ = 0;
  uint64_t key1_ = 0;
};

}  // namespace kvpool::core

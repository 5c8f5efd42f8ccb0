// PrefixIndex: (namespace, block hash) → page id, for the pages that carry a hash.
//
// Open addressing with linear probing and backward-shift deletion. A slot is 8 bytes: a 32-bit
// tag and the page id. The full key is not stored here: it lives with the page (the pool's page
// metadata), which a lookup reads anyway to take its reference, so the caller confirms a tag
// match with an is_key(page) predicate. Small slots keep the table a third of the size of one
// holding full keys, so probes, inserts and the erases that eviction does stay in cache.
//
// The tag is the top 32 bits of a keyed 64×64→128 multiply-fold (wyhash's mum) of the key with a
// per-index random secret; a slot's home is the top log2(slots) bits of its tag, so deletion
// recomputes homes from tags alone, without touching page metadata. Block hashes come from
// clients: an honest client's are uniform, a hostile one could otherwise choose hashes that pile
// into one probe run and turn every lookup into a scan; the secret makes that aim impossible.
//
// At most one entry per page, so the table is sized to hold every page at load ≤ 1/2 and
// rehashes only when an elastic pool grows past that (reserve(): by tag alone, since a slot's
// home is derived from its tag); it never shrinks, a smaller pool only lowers the load.
//
// Invariants: size() = occupied slots ≤ capacity / 2; each page appears at most once; every
// occupied slot is reachable from its home slot without crossing an empty slot.
// Thread-safety: none; owned by one PagePool.
#pragma once

#include <cstdint>
#include <vector>

#include "common/block_hash.h"
#include "daemon/core/types.h"

namespace kvpool::core {

class PrefixIndex {
 public:
  // Room for `max_entries` keys. `seed` keys the tag hash; pass secret_seed() in production.
  PrefixIndex(uint32_t max_entries, uint64_t seed);
  // A random, nonzero seed from the OS: a secret key for the tag hash, so that no client can aim
  // hashes at one probe run.
  static uint64_t secret_seed();

  uint32_t tag(Namespace ns, const BlockHash& hash) const;

  // The page stored under (ns, hash), or kNoPage. is_key(page) must say whether `page` carries
  // exactly (ns, hash); it is called only for pages whose tag matches.
  template <typename IsKey>
  PageId find(Namespace ns, const BlockHash& hash, IsKey&& is_key) const {
    const uint32_t t = tag(ns, hash);
    for (uint32_t i = home(t);; i = (i + 1) & mask_) {
      const Slot s = slots_[i];
      if (s.page == kNoPage) return kNoPage;
      if (s.tag == t && is_key(s.page)) return s.page;
    }
  }
  // Stores (ns, hash) → page. Preconditions: no page is stored under that key, `page` is not in
  // the index, and size() < max_entries.
  void insert(Namespace ns, const BlockHash& hash, PageId page);
  // Removes `page`, stored under (ns, hash); returns false when it is not there.
  bool erase(Namespace ns, const BlockHash& hash, PageId page);

  uint32_t size() const { return size_; }
  // Room for `max_entries` keys at load ≤ 1/2: rehashes into a larger table when needed, keeping
  // every entry. O(slots).
  void reserve(uint32_t max_entries);
  uint64_t capacity() const { return slots_.size() / 2; }

  template <typename Fn>  // fn(uint32_t tag, PageId page)
  void for_each(Fn&& fn) const {
    for (const Slot& s : slots_) {
      if (s.page != kNoPage) fn(s.tag, s.page);
    }
  }

 private:
  struct Slot {
    uint32_t tag = 0;
    PageId page = kNoPage;  // kNoPage marks an empty slot
  };

  uint32_t home(uint32_t t) const { return static_cast<uint32_t>(uint64_t{t} >> shift_); }

  std::vector<Slot> slots_;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;  // 32 − log2(slots)
  uint32_t size_ = 0;
  uint64_t key0_ = 0;
  uint64_t key1_ = 0;
};

}  // namespace kvpool::core

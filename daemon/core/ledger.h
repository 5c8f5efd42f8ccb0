// Ledger: the references one owner (a session) holds, page id → count.
//
// An open-addressing hash map with linear probing and backward-shift deletion (no tombstones), so
// find, add and erase are O(1) expected and the table never degrades under churn. Capacity is a
// power of two, kept at most half full; it grows by doubling and never shrinks while the owner
// lives (an owner's peak is its steady state). Keys are page ids the pool handed out, not values a
// client picks, so Fibonacci hashing spreads them well enough.
//
// Each entry also records the order in which the owner first took the page (a stamp). Releasing
// everything an owner holds (a closed or killed session) goes newest first, so the tails of the
// owner's sequences reach the eviction queue before their heads, as an orderly release would.
//
// Invariants: size() = number of entries with count > 0; references() = sum of counts; no entry
// has count 0 (erase() removes it).
// Thread-safety: none; owned by one PagePool.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/core/types.h"

namespace kvpool::core {

class Ledger {
 public:
  struct Entry {
    PageId page = kNoPage;  // kNoPage marks an empty slot
    uint32_t count = 0;
    uint64_t stamp = 0;
  };

  Ledger();

  // The entry for `page`, or nullptr. The pointer is valid until the next add/insert/erase.
  Entry* find(PageId page);
  const Entry* find(PageId page) const;
  uint32_t count(PageId page) const {
    const Entry* e = find(page);
    return e == nullptr ? 0 : e->count;
  }

  // Adds `n` > 0 references to `page`, inserting it with a fresh stamp when absent.
  void add(PageId page, uint32_t n = 1);
  // Re-inserts an entry removed by erase(), stamp included (used to undo a failed batch).
  void restore(PageId page, uint32_t count, uint64_t stamp);
  // Removes the entry of `page` (which must exist).
  void erase(PageId page);
  // Removes one reference; erases the entry when it reaches zero. Returns the remaining count.
  uint32_t remove_one(Entry* e);

  uint32_t size() const { return size_; }
  uint64_t references() const { return references_; }

  // The entries, newest stamp first.
  std::vector<Entry> entries_newest_first() const;

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Entry& e : slots_) {
      if (e.page != kNoPage) fn(e);
    }
  }

 private:
  uint32_t home(PageId page) const {
    return static_cast<uint32_t>((uint64_t{page} * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  uint32_t probe(PageId page) const;  // slot of `page` or of the empty slot where it would go
  void grow();
  void erase_at(uint32_t slot);

  std::vector<Entry> slots_;
  uint32_t mask_ = 0;
  uint32_t shift_ = 0;
  uint32_t size_ = 0;
  uint64_t references_ = 0;
  uint64_t next_stamp_ = 0;
};

}  // namespace kvpool::core

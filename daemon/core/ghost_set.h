// GhostSet: a bounded memory of the keys of recently evicted pages, so that a policy can tell a
// page that comes back after eviction (its contents were needed again: evidence of re-use that a
// pool which only counts hits never sees) from one that is new.
//
// Algorithm: a table of 16-byte buckets, each 7 tags of 16 bits and a cursor, with about twice
// as many tag slots as the capacity asked for. A key picks its bucket with its low bits and its
// tag with bits 47..62 (0 is reserved for "empty"; bit 63 is left to the caller). insert() fills
// the first empty way of the bucket, else overwrites the way under the cursor and advances it, so
// a bucket that take() did not touch forgets in FIFO order (it fills ways 0..6, then the cursor
// starts at way 0) and the set holds about the last `capacity` keys inserted. take()
// removes a key and says whether it was there; contains() only says. Both touch one bucket (one
// cache line), O(1), no allocation after the constructor; about 4.6 bytes per key of capacity.
//
// Approximations, harmless for a hint that only orders eviction: a key may be forgotten early
// when its bucket fills faster than others (about 10% of keys at `capacity` insertions' age), and
// a different key with the same bucket and tag (probability 7 / 65535 per take) reads as
// remembered.
//
// Thread-safety: none (a policy's state).
#pragma once

#include <cstdint>
#include <vector>

namespace kvpool::core {

class GhostSet {
 public:
  GhostSet() = default;
  // Room for about `capacity` keys (rounded up to a power of two of buckets; at least one).
  explicit GhostSet(uint64_t capacity) {
    uint64_t buckets = 1;
    while (buckets * kWays < 2 * capacity)
      buckets <<= 1;
    buckets_.assign(buckets, Bucket{});
    mask_ = buckets - 1;
  }

  void insert(uint64_t key) {
    if (buckets_.empty()) return;
    Bucket& b = buckets_[key & mask_];
    const uint16_t t = tag(key);
    uint32_t empty = kWays;
    for (uint32_t w = 0; w < kWays; ++w) {
      if (b.tags[w] == t) return;
      if (b.tags[w] == 0 && empty == kWays) empty = w;
    }
    if (empty != kWays) {
      b.tags[empty] = t;
      return;
    }
    b.tags[b.cursor] = t;
    b.cursor = static_cast<uint16_t>((b.cursor + 1) % kWays);
  }

  bool take(uint64_t key) {
    if (buckets_.empty()) return false;
    Bucket& b = buckets_[key & mask_];
    const uint16_t t = tag(key);
    for (uint32_t w = 0; w < kWays; ++w) {
      if (b.tags[w] == t) {
        b.tags[w] = 0;
        return true;
      }
    }
    return false;
  }

  // Whether the key is remembered, leaving it so.
  bool contains(uint64_t key) const {
    if (buckets_.empty()) return false;
    const Bucket& b = buckets_[key & mask_];
    const uint16_t t = tag(key);
    for (uint32_t w = 0; w < kWays; ++w) {
      if (b.tags[w] == t) return true;
    }
    return false;
  }

  uint64_t slots() const { return buckets_.size() * kWays; }

 private:
  static constexpr uint32_t kWays = 7;
  struct alignas(16) Bucket {
    uint16_t tags[kWays] = {};
    uint16_t cursor = 0;
  };
  static_assert(sizeof(Bucket) == 16);
  static uint16_t tag(uint64_t key) {
    const auto t = static_cast<uint16_t>(key >> 47);
    return t != 0 ? t : 1;
  }
  std::vector<Bucket> buckets_;
  uint64_t mask_ = 0;
};

}  // namespace kvpool::core

#include "daemon/core/prefix_index.h"

#include <algorithm>
#include <bit>
#include <random>
#include <utility>

#include "daemon/core/check.h"

namespace kvpool::core {

namespace {

__extension__ using U128 = unsigned __int128;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 64×64→128 multiply, folded: every output bit depends on every input bit of both words.
uint64_t mum(uint64_t a, uint64_t b) {
  const U128 p = U128{a} * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

}  // namespace

namespace {

// Slots for `max_entries` keys at load ≤ 1/2: a power of two, ≤ 2^32 since max_entries < 2^31.
uint64_t slots_for(uint32_t max_entries) {
  return std::bit_ceil(std::max<uint64_t>(16, uint64_t{max_entries} * 2));
}

}  // namespace

uint64_t PrefixIndex::secret_seed() {
  std::random_device rd;
  return ((uint64_t{rd()} << 32) ^ rd()) | 1;
}

PrefixIndex::PrefixIndex(uint32_t max_entries, uint64_t seed) {
  const uint64_t n = slots_for(max_entries);
  slots_.assign(n, Slot{});
  mask_ = static_cast<uint32_t>(n - 1);
  shift_ = 32 - static_cast<uint32_t>(std::countr_zero(n));
  key0_ = splitmix64(seed) | 1;
  key1_ = splitmix64(seed) | 1;
}

void PrefixIndex::reserve(uint32_t max_entries) {
  const uint64_t n = slots_for(max_entries);
  if (n <= slots_.size()) return;
  std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(n));
  mask_ = static_cast<uint32_t>(n - 1);
  shift_ = 32 - static_cast<uint32_t>(std::countr_zero(n));
  for (const Slot& s : old) {
    if (s.page == kNoPage) continue;
    uint32_t i = home(s.tag);
    while (slots_[i].page != kNoPage)
      i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

uint32_t PrefixIndex::tag(Namespace ns, const BlockHash& hash) const {
  const uint64_t x = mum(hash.lo ^ key0_, hash.hi ^ key1_ ^ (uint64_t{ns} << 32));
  return static_cast<uint32_t>(mum(x, 0x9E3779B97F4A7C15ull ^ key0_) >> 32);
}

void PrefixIndex::insert(Namespace ns, const BlockHash& hash, PageId page) {
  KVPOOL_CHECK(page != kNoPage);
  KVPOOL_CHECK((uint64_t{size_} + 1) * 2 <= slots_.size());
  const uint32_t t = tag(ns, hash);
  uint32_t i = home(t);
  while (slots_[i].page != kNoPage) {
    KVPOOL_DCHECK(slots_[i].page != page);
    i = (i + 1) & mask_;
  }
  slots_[i] = Slot{t, page};
  ++size_;
}

bool PrefixIndex::erase(Namespace ns, const BlockHash& hash, PageId page) {
  if (page == kNoPage) return false;
  const uint32_t t = tag(ns, hash);
  uint32_t hole = home(t);
  for (;; hole = (hole + 1) & mask_) {
    if (slots_[hole].page == kNoPage) return false;
    if (slots_[hole].page == page && slots_[hole].tag == t) break;
  }
  // Backward-shift deletion: pull later members of the run into the hole unless their home lies
  // cyclically in (hole, j], where moving them would put them before their home.
  for (uint32_t j = (hole + 1) & mask_; slots_[j].page != kNoPage; j = (j + 1) & mask_) {
    const uint32_t h = home(slots_[j].tag);
    if (((j - h) & mask_) >= ((j - hole) & mask_)) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{};
  --size_;
  return true;
}

}  // namespace kvpool::core

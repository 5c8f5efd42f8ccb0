#include "daemon/core/prefix_index.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <vector>

namespace kvpool::core {
namespace {

using Key = std::tuple<Namespace, uint64_t, uint64_t>;

BlockHash hash_of(uint64_t i) {
  return BlockHash{i * 0x9E3779B97F4A7C15ull + 1, ~i};
}

Key key(Namespace ns, const BlockHash& h) {
  return {ns, h.lo, h.hi};
}

// The index stores tags and page ids; the keys live with the pages (the pool's page metadata).
// This double keeps them in a map, as the pool keeps them in its pages, and gives the tests a
// key-based view: find/erase by key, for_each with keys.
class KeyedIndex {
 public:
  KeyedIndex(uint32_t max_entries, uint64_t seed) : index_(max_entries, seed) {}

  void insert(Namespace ns, const BlockHash& h, PageId page) {
    keys_[page] = key(ns, h);
    index_.insert(ns, h, page);
  }
  PageId find(Namespace ns, const BlockHash& h) const {
    return index_.find(ns, h, [&](PageId p) {
      const auto it = keys_.find(p);
      return it != keys_.end() && it->second == key(ns, h);
    });
  }
  bool erase(Namespace ns, const BlockHash& h) {
    const PageId page = find(ns, h);
    if (page == kNoPage) return false;
    keys_.erase(page);
    return index_.erase(ns, h, page);
  }
  uint32_t size() const { return index_.size(); }
  template <typename Fn>
  void for_each(Fn&& fn) const {
    index_.for_each([&](uint32_t tag, PageId page) {
      const auto& [ns, lo, hi] = keys_.at(page);
      EXPECT_EQ(tag, index_.tag(ns, BlockHash{lo, hi})) << "page " << page;
      fn(ns, BlockHash{lo, hi}, page);
    });
  }
  PrefixIndex& raw() { return index_; }

 private:
  PrefixIndex index_;
  std::map<PageId, Key> keys_;
};

std::map<Key, PageId> contents(const KeyedIndex& index) {
  std::map<Key, PageId> out;
  index.for_each([&](Namespace ns, const BlockHash& h, PageId page) {
    EXPECT_NE(page, kNoPage);
    EXPECT_TRUE(out.emplace(key(ns, h), page).second) << "key visited twice";
  });
  return out;
}

TEST(PrefixIndex, StartsEmpty) {
  const KeyedIndex index(100, 1);
  EXPECT_EQ(index.size(), 0u);
  EXPECT_EQ(index.find(0, BlockHash{}), kNoPage);
  EXPECT_EQ(index.find(1, hash_of(5)), kNoPage);
  EXPECT_TRUE(contents(index).empty());
}

TEST(PrefixIndex, InsertFindErase) {
  KeyedIndex index(100, 1);
  index.insert(1, hash_of(1), 10);
  index.insert(1, hash_of(2), 20);
  index.insert(1, BlockHash{}, 30);  // the all-zero hash is an ordinary key
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.find(1, hash_of(1)), 10u);
  EXPECT_EQ(index.find(1, hash_of(2)), 20u);
  EXPECT_EQ(index.find(1, BlockHash{}), 30u);
  EXPECT_EQ(index.find(1, hash_of(3)), kNoPage);

  EXPECT_TRUE(index.erase(1, hash_of(1)));
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.find(1, hash_of(1)), kNoPage);
  EXPECT_EQ(index.find(1, hash_of(2)), 20u);
  EXPECT_EQ(index.find(1, BlockHash{}), 30u);

  // The key can be stored again, under another page.
  index.insert(1, hash_of(1), 11);
  EXPECT_EQ(index.find(1, hash_of(1)), 11u);
  EXPECT_EQ(index.size(), 3u);
}

TEST(PrefixIndex, EraseOfAnAbsentKeyReturnsFalseAndChangesNothing) {
  KeyedIndex index(16, 7);
  EXPECT_FALSE(index.erase(0, hash_of(1)));  // empty index
  index.insert(1, hash_of(1), 4);
  EXPECT_FALSE(index.erase(1, hash_of(2)));  // never inserted
  EXPECT_FALSE(index.erase(2, hash_of(1)));  // same hash, other namespace
  EXPECT_EQ(index.size(), 1u);
  EXPECT_EQ(index.find(1, hash_of(1)), 4u);
  EXPECT_TRUE(index.erase(1, hash_of(1)));
  EXPECT_FALSE(index.erase(1, hash_of(1)));  // already erased
  EXPECT_EQ(index.size(), 0u);
}

TEST(PrefixIndex, EraseNeedsTheRightKeyAndPage) {
  KeyedIndex index(16, 7);
  index.insert(1, hash_of(1), 4);
  index.insert(1, hash_of(2), 5);
  PrefixIndex& raw = index.raw();
  EXPECT_FALSE(raw.erase(1, hash_of(1), 5));        // page stored, under another key
  EXPECT_FALSE(raw.erase(2, hash_of(1), 4));        // right page, other namespace
  EXPECT_FALSE(raw.erase(1, hash_of(1), kNoPage));  // the empty-slot marker
  EXPECT_EQ(raw.size(), 2u);
  EXPECT_TRUE(raw.erase(1, hash_of(1), 4));
  EXPECT_EQ(index.find(1, hash_of(1)), kNoPage);
  EXPECT_EQ(index.find(1, hash_of(2)), 5u);
}

TEST(PrefixIndex, FindConfirmsTagMatchesWithThePredicate) {
  PrefixIndex index(16, 9);
  index.insert(3, hash_of(8), 2);
  int asked = 0;
  // A predicate that denies every page: the tag matched, but the key is not the page's.
  EXPECT_EQ(index.find(3, hash_of(8),
                       [&](PageId p) {
                         ++asked;
                         return p != 2;
                       }),
            kNoPage);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(index.find(3, hash_of(8), [](PageId p) { return p == 2; }), 2u);
  // A key whose tag differs never reaches the predicate.
  asked = 0;
  EXPECT_EQ(index.find(3, hash_of(9),
                       [&](PageId) {
                         ++asked;
                         return true;
                       }),
            kNoPage);
  EXPECT_EQ(asked, 0);
}

TEST(PrefixIndex, NamespacesAndBothHashHalvesAreDistinctKeys) {
  KeyedIndex index(64, 3);
  const BlockHash h{0x1234, 0x5678};
  index.insert(1, h, 1);
  index.insert(2, h, 2);
  index.insert(0, h, 3);
  index.insert(1, BlockHash{0x1234, 0x5679}, 4);  // same lo
  index.insert(1, BlockHash{0x1235, 0x5678}, 5);  // same hi
  index.insert(1, BlockHash{0x5678, 0x1234}, 6);  // halves swapped
  EXPECT_EQ(index.size(), 6u);
  EXPECT_EQ(index.find(1, h), 1u);
  EXPECT_EQ(index.find(2, h), 2u);
  EXPECT_EQ(index.find(0, h), 3u);
  EXPECT_EQ(index.find(3, h), kNoPage);
  EXPECT_EQ(index.find(1, BlockHash{0x1234, 0x5679}), 4u);
  EXPECT_EQ(index.find(1, BlockHash{0x1235, 0x5678}), 5u);
  EXPECT_EQ(index.find(1, BlockHash{0x5678, 0x1234}), 6u);

  // Erasing the key in one namespace leaves the others.
  EXPECT_TRUE(index.erase(2, h));
  EXPECT_EQ(index.find(2, h), kNoPage);
  EXPECT_EQ(index.find(1, h), 1u);
  EXPECT_EQ(index.find(0, h), 3u);
}

TEST(PrefixIndex, SameContentsWhateverTheSeed) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0xDEADBEEF}, ~uint64_t{0}}) {
    KeyedIndex index(50, seed);
    for (uint32_t i = 0; i < 50; ++i)
      index.insert(i % 3, hash_of(i), i);
    for (uint32_t i = 0; i < 50; ++i) {
      EXPECT_EQ(index.find(i % 3, hash_of(i)), i) << "seed " << seed;
      EXPECT_EQ(index.find((i + 1) % 3, hash_of(i)), kNoPage) << "seed " << seed;
    }
  }
}

TEST(PrefixIndex, FillsToCapacity) {
  for (const uint32_t cap : {1u, 7u, 8u, 9u, 1000u, 4096u}) {
    KeyedIndex index(cap, cap);
    std::map<Key, PageId> want;
    for (uint32_t i = 0; i < cap; ++i) {
      const Namespace ns = i % 2;
      index.insert(ns, hash_of(i), i);
      want[key(ns, hash_of(i))] = i;
    }
    EXPECT_EQ(index.size(), cap);
    EXPECT_EQ(contents(index), want) << "capacity " << cap;
    for (uint32_t i = 0; i < cap; ++i) {
      ASSERT_EQ(index.find(i % 2, hash_of(i)), i) << "capacity " << cap;
      ASSERT_EQ(index.find(i % 2, hash_of(i + cap)), kNoPage) << "capacity " << cap;
    }
    // Emptied again, it holds nothing.
    for (uint32_t i = 0; i < cap; ++i)
      ASSERT_TRUE(index.erase(i % 2, hash_of(i)));
    EXPECT_EQ(index.size(), 0u);
    EXPECT_TRUE(contents(index).empty());
  }
}

// Random insert / erase at (or near) full capacity against std::map. The key universe is a few
// times the capacity, so every probe run is repeatedly cut by backward-shift deletion.
void churn(uint64_t seed, uint32_t cap, uint32_t universe, uint32_t ops) {
  std::mt19937_64 rng(seed);
  KeyedIndex index(cap, seed);
  std::map<Key, PageId> ref;
  std::vector<std::pair<Namespace, BlockHash>> keys;
  for (uint32_t i = 0; i < universe; ++i)
    keys.emplace_back(i % 3, hash_of(i / 3));
  PageId next_page = 0;
  for (uint32_t op = 0; op < ops; ++op) {
    const auto& [ns, h] = keys[rng() % keys.size()];
    const auto it = ref.find(key(ns, h));
    if (it == ref.end()) {
      if (ref.size() < cap) {
        index.insert(ns, h, next_page);
        ref.emplace(key(ns, h), next_page);
        next_page = (next_page + 1) % kMaxPages;
      } else {
        ASSERT_FALSE(index.erase(ns, h)) << "seed " << seed << " op " << op;
      }
    } else if (rng() % 4 != 0) {
      ASSERT_EQ(index.find(ns, h), it->second) << "seed " << seed << " op " << op;
      ASSERT_TRUE(index.erase(ns, h)) << "seed " << seed << " op " << op;
      ref.erase(it);
      ASSERT_EQ(index.find(ns, h), kNoPage) << "seed " << seed << " op " << op;
    }
    ASSERT_EQ(index.size(), ref.size()) << "seed " << seed << " op " << op;
    if (op % 256 == 0) {
      for (const auto& [kns, kh] : keys) {
        const auto r = ref.find(key(kns, kh));
        ASSERT_EQ(index.find(kns, kh), r == ref.end() ? kNoPage : r->second)
            << "seed " << seed << " op " << op;
      }
    }
  }
  EXPECT_EQ(contents(index), ref);
}

TEST(PrefixIndex, ChurnAtCapacityMatchesMap) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    ASSERT_NO_FATAL_FAILURE(churn(seed, 64, 192, 20000));
  }
  ASSERT_NO_FATAL_FAILURE(churn(99, 8, 30, 5000));  // smallest table: 16 slots, half full
  ASSERT_NO_FATAL_FAILURE(churn(100, 500, 900, 20000));
}

TEST(PrefixIndex, ForEachVisitsEachEntryOnce) {
  KeyedIndex index(300, 5);
  std::map<Key, PageId> want;
  for (uint32_t i = 0; i < 300; ++i) {
    index.insert(i % 4, hash_of(i), 1000 + i);
    want[key(i % 4, hash_of(i))] = 1000 + i;
  }
  for (uint32_t i = 0; i < 300; i += 3) {
    ASSERT_TRUE(index.erase(i % 4, hash_of(i)));
    want.erase(key(i % 4, hash_of(i)));
  }
  size_t visits = 0;
  index.for_each([&](Namespace, const BlockHash&, PageId) { ++visits; });
  EXPECT_EQ(visits, want.size());
  EXPECT_EQ(visits, index.size());
  EXPECT_EQ(contents(index), want);
}

}  // namespace
}  // namespace kvpool::core

#include "daemon/core/ledger.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <unordered_map>
#include <vector>

namespace kvpool::core {
namespace {

// Every (page, count) the ledger holds, collected through for_each (which also checks that no
// slot holds a count of 0 and no page twice).
std::map<PageId, uint32_t> contents(const Ledger& l) {
  std::map<PageId, uint32_t> out;
  l.for_each([&](const Ledger::Entry& e) {
    EXPECT_NE(e.count, 0u) << "page " << e.page;
    EXPECT_TRUE(out.emplace(e.page, e.count).second) << "page " << e.page << " stored twice";
  });
  return out;
}

// The ledger agrees with `ref` everywhere: sizes, totals, every key of `ref` and every key of
// `universe` (present or absent).
void expect_matches(const Ledger& l, const std::unordered_map<PageId, uint32_t>& ref,
                    const std::vector<PageId>& universe) {
  uint64_t refs = 0;
  for (const auto& [page, count] : ref) {
    refs += count;
    ASSERT_EQ(l.count(page), count) << "page " << page;
    const Ledger::Entry* e = l.find(page);
    ASSERT_NE(e, nullptr) << "page " << page;
    EXPECT_EQ(e->page, page);
  }
  for (const PageId page : universe) {
    if (ref.count(page) == 0) {
      ASSERT_EQ(l.find(page), nullptr) << "page " << page;
      ASSERT_EQ(l.count(page), 0u) << "page " << page;
    }
  }
  EXPECT_EQ(l.size(), ref.size());
  EXPECT_EQ(l.references(), refs);
}

// The Fibonacci home slot of the ledger's hash for a table of 2^bits slots (ledger.h), used only
// to pick keys that collide; the tests stay correct whatever the hash really is.
uint32_t fib_home(PageId page, uint32_t bits) {
  return static_cast<uint32_t>((uint64_t{page} * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

std::vector<PageId> pages_with_home(uint32_t home, uint32_t bits, size_t n) {
  std::vector<PageId> out;
  for (PageId p = 0; out.size() < n; ++p) {
    if (fib_home(p, bits) == home) out.push_back(p);
  }
  return out;
}

TEST(Ledger, StartsEmpty) {
  const Ledger l;
  EXPECT_EQ(l.size(), 0u);
  EXPECT_EQ(l.references(), 0u);
  EXPECT_EQ(l.find(0), nullptr);
  EXPECT_EQ(l.find(12345), nullptr);
  EXPECT_EQ(l.count(7), 0u);
  EXPECT_TRUE(l.entries_newest_first().empty());
  EXPECT_TRUE(contents(l).empty());
}

TEST(Ledger, AddFindCount) {
  Ledger l;
  l.add(5);
  EXPECT_EQ(l.count(5), 1u);
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(l.references(), 1u);

  l.add(5, 3);
  EXPECT_EQ(l.count(5), 4u);
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(l.references(), 4u);

  l.add(9, 2);
  EXPECT_EQ(l.count(9), 2u);
  EXPECT_EQ(l.count(5), 4u);
  EXPECT_EQ(l.count(6), 0u);
  EXPECT_EQ(l.size(), 2u);
  EXPECT_EQ(l.references(), 6u);

  Ledger::Entry* e = l.find(9);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->page, 9u);
  EXPECT_EQ(e->count, 2u);
  const Ledger& cl = l;
  EXPECT_EQ(cl.find(9), e);
  EXPECT_EQ(cl.find(10), nullptr);

  // Page ids at the top of the range are ordinary keys.
  l.add(kMaxPages - 1);
  EXPECT_EQ(l.count(kMaxPages - 1), 1u);
  EXPECT_EQ(l.size(), 3u);
}

TEST(Ledger, EraseRemovesTheEntryAndItsReferences) {
  Ledger l;
  l.add(1, 3);
  l.add(2, 1);
  l.add(3, 5);
  l.erase(1);
  EXPECT_EQ(l.find(1), nullptr);
  EXPECT_EQ(l.count(1), 0u);
  EXPECT_EQ(l.count(2), 1u);
  EXPECT_EQ(l.count(3), 5u);
  EXPECT_EQ(l.size(), 2u);
  EXPECT_EQ(l.references(), 6u);
  l.erase(3);
  l.erase(2);
  EXPECT_EQ(l.size(), 0u);
  EXPECT_EQ(l.references(), 0u);
  EXPECT_TRUE(contents(l).empty());
}

TEST(Ledger, RemoveOneCountsDownAndErasesAtZero) {
  Ledger l;
  l.add(4, 3);
  l.add(8);
  EXPECT_EQ(l.remove_one(l.find(4)), 2u);
  EXPECT_EQ(l.count(4), 2u);
  EXPECT_EQ(l.references(), 3u);
  EXPECT_EQ(l.size(), 2u);
  EXPECT_EQ(l.remove_one(l.find(4)), 1u);
  EXPECT_EQ(l.remove_one(l.find(4)), 0u);
  EXPECT_EQ(l.find(4), nullptr);
  EXPECT_EQ(l.size(), 1u);
  EXPECT_EQ(l.references(), 1u);
  EXPECT_EQ(l.remove_one(l.find(8)), 0u);
  EXPECT_EQ(l.size(), 0u);
  EXPECT_EQ(l.references(), 0u);
}

TEST(Ledger, RestoreBringsBackCountAndStamp) {
  Ledger l;
  l.add(10);  // oldest
  l.add(20, 4);
  l.add(30);  // newest
  const Ledger::Entry saved = *l.find(20);
  l.erase(20);
  EXPECT_EQ(l.find(20), nullptr);
  EXPECT_EQ(l.references(), 2u);

  l.restore(saved.page, saved.count, saved.stamp);
  ASSERT_NE(l.find(20), nullptr);
  EXPECT_EQ(l.count(20), 4u);
  EXPECT_EQ(l.find(20)->stamp, saved.stamp);
  EXPECT_EQ(l.size(), 3u);
  EXPECT_EQ(l.references(), 6u);
  // The restored entry keeps its place in the order: still between 30 and 10.
  const std::vector<Ledger::Entry> order = l.entries_newest_first();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0].page, 30u);
  EXPECT_EQ(order[1].page, 20u);
  EXPECT_EQ(order[2].page, 10u);

  // A page erased and taken again by add() is new: it gets a fresh (newest) stamp.
  l.erase(10);
  l.add(10);
  EXPECT_GT(l.find(10)->stamp, l.find(30)->stamp);
  EXPECT_EQ(l.entries_newest_first().front().page, 10u);
}

TEST(Ledger, StampsOrderFirstTakenNotLastTouched) {
  Ledger l;
  const std::vector<PageId> first_taken = {7, 3, 99, 1, 42, 0, 18};
  for (const PageId p : first_taken)
    l.add(p);
  // More references to old entries do not make them newer.
  l.add(7, 2);
  l.add(3);
  const std::vector<Ledger::Entry> order = l.entries_newest_first();
  ASSERT_EQ(order.size(), first_taken.size());
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i].page, first_taken[first_taken.size() - 1 - i]) << "position " << i;
    if (i > 0) {
      EXPECT_GT(order[i - 1].stamp, order[i].stamp);
    }
  }
  EXPECT_EQ(order.back().count, 3u);  // page 7
}

TEST(Ledger, GrowsPastTheInitialSlotsAndKeepsEverything) {
  Ledger l;
  std::unordered_map<PageId, uint32_t> ref;
  std::vector<PageId> universe;
  // Sequential ids (what a fresh pool hands out) and widely spread ones, interleaved.
  for (uint32_t i = 0; i < 5000; ++i) {
    const PageId a = i;
    const PageId b = 1'000'000 + i * 7919;
    l.add(a, 1 + i % 3);
    l.add(b);
    ref[a] += 1 + i % 3;
    ref[b] += 1;
    universe.push_back(a);
    universe.push_back(b);
    universe.push_back(b + 1);  // never added
    if (i == 7 || i == 8 || i == 100 || i == 4999) {
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, universe)) << "after " << i + 1;
    }
  }
  EXPECT_EQ(l.size(), 10000u);
  EXPECT_EQ(contents(l).size(), 10000u);
  EXPECT_EQ(l.entries_newest_first().size(), 10000u);
  EXPECT_EQ(l.entries_newest_first().front().page, 1'000'000u + 4999u * 7919u);
  EXPECT_EQ(l.entries_newest_first().back().page, 0u);

  // Emptying the grown table leaves nothing behind.
  for (uint32_t i = 0; i < 5000; ++i) {
    l.erase(i);
    l.erase(1'000'000 + i * 7919);
  }
  EXPECT_EQ(l.size(), 0u);
  EXPECT_EQ(l.references(), 0u);
  EXPECT_TRUE(contents(l).empty());
  l.add(3);
  EXPECT_EQ(l.count(3), 1u);
}

TEST(Ledger, BackwardShiftAcrossTheTableEndKeepsRunsReachable) {
  // Five keys whose home is the last of the 16 initial slots form a run that wraps to slots
  // 0..3; keys homed at 0 and 2 sit behind them, in slots 4 and 5. Deleting from the middle, the
  // head and the wrapped part must keep every survivor findable (a wrong shift strands a key past
  // an empty slot, or moves one before its home).
  const std::vector<PageId> at15 = pages_with_home(15, 4, 5);
  const std::vector<PageId> at0 = pages_with_home(0, 4, 1);
  const std::vector<PageId> at2 = pages_with_home(2, 4, 1);
  std::vector<PageId> keys = at15;
  keys.push_back(at0[0]);
  keys.push_back(at2[0]);
  ASSERT_EQ(keys.size(), 7u);  // 7 < 8: no growth, the table stays at 16 slots

  for (size_t first = 0; first < keys.size(); ++first) {
    for (size_t second = 0; second < keys.size(); ++second) {
      if (second == first) continue;
      Ledger l;
      std::unordered_map<PageId, uint32_t> ref;
      for (size_t i = 0; i < keys.size(); ++i) {
        l.add(keys[i], static_cast<uint32_t>(i + 1));
        ref[keys[i]] = static_cast<uint32_t>(i + 1);
      }
      l.erase(keys[first]);
      ref.erase(keys[first]);
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, keys)) << first;
      EXPECT_EQ(l.remove_one(l.find(keys[second])), static_cast<uint32_t>(second));
      if (second == 0) {
        ref.erase(keys[second]);  // count 1: remove_one erased it
      } else {
        ref[keys[second]] -= 1;
      }
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, keys)) << first << " " << second;
      // Put both back and check again: re-inserted keys land somewhere reachable.
      l.add(keys[first], 9);
      ref[keys[first]] = 9;
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, keys)) << first << " " << second;
    }
  }
}

// Random add / remove_one / erase / restore against std::unordered_map. A small key universe keeps
// the table dense with long probe runs, so backward-shift deletion is exercised constantly.
void churn(uint64_t seed, uint32_t universe_size, PageId base, uint32_t stride) {
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return static_cast<uint32_t>(rng() % n); };
  std::vector<PageId> universe(universe_size);
  for (uint32_t i = 0; i < universe_size; ++i)
    universe[i] = base + i * stride;

  Ledger l;
  std::unordered_map<PageId, uint32_t> ref;
  std::vector<Ledger::Entry> erased;  // candidates for restore()
  for (int op = 0; op < 20000; ++op) {
    const PageId page = universe[below(universe_size)];
    const auto it = ref.find(page);
    const uint32_t r = below(10);
    if (r < 4) {
      const uint32_t n = 1 + below(3);
      l.add(page, n);
      ref[page] += n;
    } else if (it != ref.end() && r < 7) {
      Ledger::Entry* e = l.find(page);
      ASSERT_NE(e, nullptr);
      const uint32_t left = l.remove_one(e);
      ASSERT_EQ(left, it->second - 1);
      if (left == 0) {
        ref.erase(it);
      } else {
        it->second = left;
      }
    } else if (it != ref.end() && r < 9) {
      erased.push_back(*l.find(page));
      l.erase(page);
      ref.erase(it);
    } else if (!erased.empty()) {
      const size_t k = below(erased.size());
      const Ledger::Entry e = erased[k];
      erased[k] = erased.back();
      erased.pop_back();
      if (ref.count(e.page) == 0) {
        l.restore(e.page, e.count, e.stamp);
        ref[e.page] = e.count;
        ASSERT_EQ(l.find(e.page)->stamp, e.stamp);
      }
    }
    if (op % 97 == 0) {
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, universe)) << "seed " << seed << " op " << op;
    } else {
      ASSERT_EQ(l.count(page), ref.count(page) ? ref[page] : 0u) << "seed " << seed << " op " << op;
      ASSERT_EQ(l.size(), ref.size()) << "seed " << seed << " op " << op;
    }
  }
  ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, universe));
  std::map<PageId, uint32_t> want(ref.begin(), ref.end());
  EXPECT_EQ(contents(l), want);
  // Entries come out newest first, each once.
  const std::vector<Ledger::Entry> order = l.entries_newest_first();
  ASSERT_EQ(order.size(), ref.size());
  for (size_t i = 1; i < order.size(); ++i)
    EXPECT_GT(order[i - 1].stamp, order[i].stamp);
}

TEST(Ledger, ChurnMatchesUnorderedMapSmallUniverse) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    ASSERT_NO_FATAL_FAILURE(churn(seed, 40, 0, 1));
  }
}

TEST(Ledger, ChurnMatchesUnorderedMapThroughGrowth) {
  for (uint64_t seed = 11; seed <= 12; ++seed) {
    ASSERT_NO_FATAL_FAILURE(churn(seed, 600, 0, 1));
    ASSERT_NO_FATAL_FAILURE(churn(seed, 600, 123457, 4096));
  }
}

TEST(Ledger, ChurnWithCollidingKeys) {
  // Keys that all share one home slot in a 16-slot table, and mostly share a few in larger ones.
  std::mt19937_64 rng(77);
  const std::vector<PageId> keys = pages_with_home(3, 4, 7);
  for (int round = 0; round < 300; ++round) {
    Ledger l;
    std::unordered_map<PageId, uint32_t> ref;
    for (int op = 0; op < 30; ++op) {
      const PageId page = keys[rng() % keys.size()];
      if (ref.count(page) != 0 && rng() % 2 == 0) {
        l.erase(page);
        ref.erase(page);
      } else {
        l.add(page);
        ref[page] += 1;
      }
      ASSERT_NO_FATAL_FAILURE(expect_matches(l, ref, keys)) << round << " " << op;
    }
  }
}

}  // namespace
}  // namespace kvpool::core

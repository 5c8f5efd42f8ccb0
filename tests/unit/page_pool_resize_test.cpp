// PagePool::grow and PagePool::shrink (elastic pools): growth hands out the new pages, a shrink
// is refused while a tail page is held and changes nothing, moves CACHED tail pages below the new
// size with their hash, pin and policy place, evicts those with no room below, and a random
// sequence of grows, shrinks and the usual calls keeps every invariant, for every policy.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/page_pool.h"
#include "tests/unit/status_assertions.h"

namespace kvpool::core {
namespace {

using kvpool::testing::describe;
using kvpool::testing::is;
using kvpool::testing::ok;

BlockHash H(uint64_t id) {
  return BlockHash{0xE1A5'0000ull + id, id * 0x9E3779B97F4A7C15ull};
}

PoolOptions opts(uint32_t pages, std::string_view policy = "lru") {
  PoolOptions o;
  o.num_pages = pages;
  o.index_seed = 7;
  o.policy = make_policy(policy);
  o.clock_ms = [] { return uint64_t{1000}; };
  return o;
}

// Allocates n pages for `owner`, publishes them under H(first_hash + i) and releases them: they
// end CACHED. Returns the pages.
std::vector<PageId> cache_pages(PagePool& pool, OwnerId owner, uint32_t n, uint64_t first_hash,
                                const CallHints& hints = {}) {
  std::vector<PageId> pages(n);
  EXPECT_TRUE(ok(pool.alloc(owner, pages, hints)));
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back(PublishItem{pages[i], H(first_hash + i)});
  std::vector<PublishResult> out(n);
  EXPECT_TRUE(ok(pool.publish(owner, 1, items, out)));
  EXPECT_TRUE(ok(pool.release(owner, pages)));
  return pages;
}

PageId find(PagePool& pool, OwnerId owner, uint64_t hash_id) {
  const BlockHash chain[] = {H(hash_id)};
  PageId out[1] = {kNoPage};
  uint32_t hits = 0;
  EXPECT_TRUE(ok(pool.lookup(owner, 1, chain, out, hits)));
  if (hits == 0) return kNoPage;
  EXPECT_TRUE(ok(pool.release(owner, std::span<const PageId>(out, 1))));
  return out[0];
}

struct Removals final : IndexObserver {
  void stored(Namespace, const BlockHash&, PageId) override {}
  void removed(Namespace, const BlockHash& hash, PageId page, Removal why) override {
    removed_pages.push_back(page);
    removed_hashes.push_back(hash);
    evicted += why == Removal::evicted;
  }
  std::vector<PageId> removed_pages;
  std::vector<BlockHash> removed_hashes;
  uint32_t evicted = 0;
};

TEST(PagePoolResize, GrowHandsOutTheNewPagesAfterTheOldFreeOnes) {
  PagePool pool(opts(4));
  const OwnerId o = pool.open_owner();
  PageId two[2];
  ASSERT_TRUE(ok(pool.alloc(o, two)));  // 0, 1
  ASSERT_TRUE(ok(pool.grow(8)));
  EXPECT_EQ(pool.num_pages(), 8u);
  EXPECT_EQ(pool.stats().free, 6u);
  PageId six[6];
  ASSERT_TRUE(ok(pool.alloc(o, six)));
  // The old FREE pages first, then the new ones lowest first.
  EXPECT_EQ(std::vector<PageId>(six, six + 6), (std::vector<PageId>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pool.check_invariants(), "");
  PageId more[1];
  EXPECT_TRUE(is(pool.alloc(o, more), Status(Errc::out_of_pages, kNoItem, 1)));
}

TEST(PagePoolResize, GrowAndShrinkRefuseSizesThatCannotBe) {
  PagePool pool(opts(4));
  std::vector<PageMove> moves;
  EXPECT_TRUE(is(pool.grow(4), Status(Errc::invalid_argument, kNoItem, 4)));
  EXPECT_TRUE(is(pool.grow(3), Status(Errc::invalid_argument, kNoItem, 3)));
  EXPECT_TRUE(is(pool.grow(kMaxPages + 1), Status(Errc::invalid_argument, kNoItem, kMaxPages + 1)));
  EXPECT_TRUE(is(pool.shrink(4, moves), Status(Errc::invalid_argument, kNoItem, 4)));
  EXPECT_TRUE(is(pool.shrink(0, moves), Status(Errc::invalid_argument, kNoItem, 0)));
  EXPECT_EQ(pool.num_pages(), 4u);
  EXPECT_TRUE(moves.empty());
}

TEST(PagePoolResize, ShrinkIsRefusedWhileATailPageIsHeldAndChangesNothing) {
  PagePool pool(opts(8));
  const OwnerId o = pool.open_owner();
  cache_pages(pool, o, 2, 100);  // pages 0, 1 CACHED
  PageId held[6];
  ASSERT_TRUE(ok(pool.alloc(o, held)));                                // 2..7 IN_USE
  ASSERT_TRUE(ok(pool.release(o, std::span<const PageId>(held, 3))));  // 2, 3, 4 FREE again
  const PoolStats before = pool.stats();
  std::vector<PageMove> moves;
  const Status s = pool.shrink(4, moves);
  EXPECT_TRUE(is(s, Status(Errc::pages_in_use, 3, 5))) << describe(s);
  EXPECT_EQ(s.message(),
            "pages_in_use: 3 pages past the new pool size are in use, the first is page 5");
  EXPECT_EQ(Status(Errc::pages_in_use, 1, 9).message(),
            "pages_in_use: 1 page past the new pool size is in use, the first is page 9");
  EXPECT_TRUE(moves.empty());
  EXPECT_EQ(pool.num_pages(), 8u);
  const PoolStats after = pool.stats();
  EXPECT_EQ(after.free, before.free);
  EXPECT_EQ(after.cached, before.cached);
  EXPECT_EQ(after.in_use, before.in_use);
  EXPECT_EQ(pool.check_invariants(), "");
  // Once the tail is released the same shrink goes through.
  ASSERT_TRUE(ok(pool.release(o, std::span<const PageId>(held + 3, 3))));
  EXPECT_TRUE(ok(pool.shrink(4, moves)));
  EXPECT_EQ(pool.num_pages(), 4u);
  EXPECT_EQ(pool.stats().free, 2u);
}

TEST(PagePoolResize, ShrinkMovesCachedTailPagesBelowAndReindexesThem) {
  for (const std::string_view policy : policy_names()) {
    SCOPED_TRACE(std::string(policy));
    PagePool pool(opts(8, policy));
    Removals seen;
    pool.set_observer(&seen);
    const OwnerId o = pool.open_owner();
    PageId low[4];
    ASSERT_TRUE(ok(pool.alloc(o, low)));  // 0..3 held while the tail is filled
    ASSERT_EQ(cache_pages(pool, o, 4, 200), (std::vector<PageId>{4, 5, 6, 7}));
    ASSERT_TRUE(ok(pool.release(o, low)));  // unpublished: FREE
    std::vector<PageMove> moves;
    ASSERT_TRUE(ok(pool.shrink(4, moves)));
    EXPECT_EQ(pool.num_pages(), 4u);
    EXPECT_EQ(pool.check_invariants(), "");
    ASSERT_EQ(moves.size(), 4u);
    std::vector<PageId> to;
    for (const PageMove& m : moves) {
      ASSERT_GE(m.from, 4u);
      ASSERT_LT(m.to, 4u);
      // The hash page m.from carried (H(200 + m.from - 4)) is found at m.to.
      EXPECT_EQ(find(pool, o, 200 + m.from - 4), m.to);
      to.push_back(m.to);
    }
    std::sort(to.begin(), to.end());
    EXPECT_EQ(to, (std::vector<PageId>{0, 1, 2, 3}));
    EXPECT_EQ(pool.stats().cached, 4u);
    EXPECT_EQ(pool.stats().free, 0u);
    EXPECT_EQ(pool.stats().counters.evicted, 0u);
    EXPECT_TRUE(seen.removed_pages.empty());
    // The moved pages are in the policy: a full alloc evicts all four.
    PageId all[4];
    ASSERT_TRUE(ok(pool.alloc(o, all)));
    EXPECT_EQ(seen.evicted, 4u);
  }
}

TEST(PagePoolResize, ShrinkEvictsCachedTailPagesWithNoRoomBelow) {
  PagePool pool(opts(8));
  Removals seen;
  pool.set_observer(&seen);
  const OwnerId o = pool.open_owner();
  cache_pages(pool, o, 8, 300);  // 0..7 CACHED, LRU order 0 first
  std::vector<PageMove> moves;
  ASSERT_TRUE(ok(pool.shrink(4, moves)));
  EXPECT_TRUE(moves.empty());  // no FREE page below 4
  EXPECT_EQ(seen.evicted, 4u);
  EXPECT_EQ(seen.removed_pages, (std::vector<PageId>{4, 5, 6, 7}));
  EXPECT_EQ(pool.stats().counters.evicted, 4u);
  EXPECT_EQ(pool.stats().cached, 4u);
  EXPECT_EQ(find(pool, o, 304), kNoPage);
  EXPECT_EQ(find(pool, o, 300), 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolResize, ShrinkWithSomeRoomKeepsWhatThePolicyWouldKeepLongest) {
  PagePool pool(opts(6));
  Removals seen;
  pool.set_observer(&seen);
  const OwnerId o = pool.open_owner();
  PageId first[1];
  ASSERT_TRUE(ok(pool.alloc(o, first)));    // page 0, IN_USE, unpublished
  cache_pages(pool, o, 5, 400);             // pages 1..5 CACHED, LRU 1 first
  ASSERT_TRUE(ok(pool.release(o, first)));  // page 0 FREE
  // Touch page 3 so that LRU keeps it longest: order 1, 2, 4, 5, 3.
  ASSERT_EQ(find(pool, o, 402), 3u);
  std::vector<PageMove> moves;
  ASSERT_TRUE(ok(pool.shrink(2, moves)));  // tail 2..5 CACHED, one FREE page below (0)
  ASSERT_EQ(moves.size(), 1u);
  EXPECT_EQ(moves[0], (PageMove{3, 0}));
  EXPECT_EQ(seen.removed_pages, (std::vector<PageId>{2, 4, 5}));
  EXPECT_EQ(find(pool, o, 402), 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolResize, MovedPagesReenterThePolicyInTheOrderTheyLeftIt) {
  PagePool pool(opts(8));
  const OwnerId o = pool.open_owner();
  PageId low[4];
  ASSERT_TRUE(ok(pool.alloc(o, low)));
  cache_pages(pool, o, 4, 800);           // 4..7 CACHED, LRU order 4, 5, 6, 7
  ASSERT_EQ(find(pool, o, 800), 4u);      // now 5, 6, 7, 4
  ASSERT_EQ(find(pool, o, 802), 6u);      // now 5, 7, 4, 6
  ASSERT_TRUE(ok(pool.release(o, low)));  // 0..3 FREE
  std::vector<PageMove> moves;
  ASSERT_TRUE(ok(pool.shrink(4, moves)));
  std::vector<PageId> from;
  for (const PageMove& m : moves)
    from.push_back(m.from);
  EXPECT_EQ(from, (std::vector<PageId>{5, 7, 4, 6}));
  std::vector<PageId> queued;
  pool.policy().for_each_queued([&](PageId p) { queued.push_back(p); });
  std::vector<PageId> to;
  for (const PageMove& m : moves)
    to.push_back(m.to);
  EXPECT_EQ(queued, to);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolResize, PinnedCachedPageMovesWithItsPin) {
  PagePool pool(opts(8));
  const OwnerId o = pool.open_owner();
  PageId low[4];
  ASSERT_TRUE(ok(pool.alloc(o, low)));  // 0..3 held while the tail is filled
  CallHints pin;
  pin.hints.pin_ttl_ms = 60'000;
  pin.pin_account = 2;
  const std::vector<PageId> tail = cache_pages(pool, o, 4, 500, pin);  // 4..7, pinned
  ASSERT_TRUE(ok(pool.release(o, low)));                               // 0..3 FREE
  ASSERT_EQ(pool.pinned_by(2), 4u);
  std::vector<PageMove> moves;
  ASSERT_TRUE(ok(pool.shrink(4, moves)));
  ASSERT_EQ(moves.size(), 4u);
  for (const PageMove& m : moves) {
    EXPECT_EQ(pool.pinned_until(m.to), 61'000u);
    EXPECT_EQ(pool.state(m.to), PageState::cached);
  }
  EXPECT_EQ(pool.pinned_by(2), 4u);
  EXPECT_EQ(pool.stats().pinned_cached, 4u);
  EXPECT_EQ(pool.check_invariants(), "");
  // Still held out of the policy: no victim to give.
  EXPECT_EQ(pool.evict(4), 0u);
  (void)tail;
}

TEST(PagePoolResize, PinnedPagesAreTheLastToBeEvicted) {
  PagePool pool(opts(4));
  const OwnerId o = pool.open_owner();
  CallHints pin;
  pin.hints.pin_ttl_ms = 60'000;
  PageId a[2];
  ASSERT_TRUE(ok(pool.alloc(o, a)));                                // 0, 1 held
  cache_pages(pool, o, 1, 600, pin);                                // page 2, pinned
  cache_pages(pool, o, 1, 601);                                     // page 3
  ASSERT_TRUE(ok(pool.release(o, std::span<const PageId>(a, 1))));  // 0 FREE, 1 held
  std::vector<PageMove> moves;
  ASSERT_TRUE(ok(pool.shrink(2, moves)));
  EXPECT_EQ(moves, (std::vector<PageMove>{{2, 0}}));
  EXPECT_EQ(pool.pinned_until(0), 61'000u);
  EXPECT_EQ(find(pool, o, 601), kNoPage);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolResize, GrowRehashesTheIndexPastItsTable) {
  PagePool pool(opts(8));
  const OwnerId o = pool.open_owner();
  cache_pages(pool, o, 8, 700);
  ASSERT_TRUE(ok(pool.grow(1000)));
  for (uint64_t i = 0; i < 8; ++i)
    EXPECT_EQ(find(pool, o, 700 + i), i);
  cache_pages(pool, o, 992, 1000);
  EXPECT_EQ(pool.stats().cached, 1000u);
  EXPECT_EQ(pool.check_invariants(), "");
}

// Random grow / shrink / alloc / publish / release / lookup, every policy, invariants after each
// step; the moves a shrink reports are checked against the keys the pages carried.
TEST(PagePoolResize, RandomSequencesKeepEveryInvariant) {
  for (const std::string_view policy : policy_names()) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(std::string(policy) + " seed " + std::to_string(seed));
      std::mt19937_64 rng(seed);
      auto pick = [&](uint64_t n) { return static_cast<uint32_t>(rng() % n); };
      PagePool pool(opts(16, policy));
      const OwnerId owners[2] = {pool.open_owner(), pool.open_owner()};
      std::vector<std::vector<PageId>> held(2);
      uint64_t next_hash = 1;
      for (int step = 0; step < 3000; ++step) {
        const uint32_t who = pick(2);
        const OwnerId o = owners[who];
        auto& mine = held[who];
        const uint32_t op = pick(10);
        if (op == 0) {
          const uint32_t to = pool.num_pages() + 1 + pick(16);
          ASSERT_TRUE(ok(pool.grow(to)));
          ASSERT_EQ(pool.num_pages(), to);
        } else if (op == 1 && pool.num_pages() > 1) {
          const uint32_t to = 1 + pick(pool.num_pages() - 1);
          uint32_t in_tail = 0;
          PageId first = kNoPage;
          for (PageId p = to; p < pool.num_pages(); ++p) {
            if (pool.refcount(p) != 0 && in_tail++ == 0) first = p;
          }
          std::vector<std::pair<PageId, BlockHash>> keys;
          for (PageId p = to; p < pool.num_pages(); ++p) {
            Namespace ns = 0;
            BlockHash h;
            if (pool.indexed_key(p, ns, h)) keys.emplace_back(p, h);
          }
          const uint32_t cached_before = pool.stats().cached;
          const uint64_t evicted_before = pool.stats().counters.evicted;
          std::vector<PageMove> moves;
          const Status s = pool.shrink(to, moves);
          if (in_tail != 0) {
            ASSERT_TRUE(is(s, Status(Errc::pages_in_use, in_tail, first)));
            ASSERT_TRUE(moves.empty());
          } else {
            ASSERT_TRUE(ok(s)) << describe(s);
            ASSERT_EQ(pool.num_pages(), to);
            for (const PageMove& m : moves) {
              const auto it = std::find_if(keys.begin(), keys.end(),
                                           [&](const auto& k) { return k.first == m.from; });
              ASSERT_NE(it, keys.end());
              Namespace ns = 0;
              BlockHash h;
              ASSERT_TRUE(pool.indexed_key(m.to, ns, h));
              ASSERT_EQ(h, it->second);
            }
            const uint64_t evicted = pool.stats().counters.evicted - evicted_before;
            ASSERT_EQ(moves.size() + evicted, keys.size());
            ASSERT_EQ(pool.stats().cached + evicted, cached_before);
          }
        } else if (op <= 4) {
          std::vector<PageId> pages(1 + pick(4));
          if (pool.alloc(o, pages).ok()) mine.insert(mine.end(), pages.begin(), pages.end());
        } else if (op <= 6 && !mine.empty()) {
          const PageId p = mine[pick(mine.size())];
          const PublishItem item{p, H(next_hash++ % 64)};
          PublishResult out[1];
          if (pool.publish(o, 1, std::span<const PublishItem>(&item, 1), out).ok() &&
              out[0].page != p) {
            mine.push_back(out[0].page);  // a duplicate: the owner holds the existing page too
          }
        } else if (op <= 8 && !mine.empty()) {
          const size_t i = pick(mine.size());
          ASSERT_TRUE(ok(pool.release(o, std::span<const PageId>(&mine[i], 1))));
          mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          const BlockHash chain[] = {H(pick(64))};
          PageId out[1];
          uint32_t hits = 0;
          ASSERT_TRUE(ok(pool.lookup(o, 1, chain, out, hits)));
          if (hits == 1) mine.push_back(out[0]);
        }
        ASSERT_EQ(pool.check_invariants(), "") << "step " << step << " op " << op;
      }
    }
  }
}

}  // namespace
}  // namespace kvpool::core

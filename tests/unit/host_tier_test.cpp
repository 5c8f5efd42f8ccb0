// HostTier and TierMover on small pools: admission order and LRU drops, refreshes that need no
// copy, promotion claiming slots out of reach of the demotions it causes, the demotions reported
// page → slot before promotions slot → page, duplicates answered with the device page, cancelled
// promotions freeing their pages and restoring their slots, and both tiers' invariants after every
// step.

#include <gtest/gtest.h>
#include <algorithm>

#include <vector>

#include "daemon/core/host_tier.h"
#include "daemon/core/tier_mover.h"

namespace kvpool::core {
namespace {

constexpr Namespace kNs = 2;

BlockHash h(uint64_t i) {
  return BlockHash{i * 0x9E3779B97F4A7C15ull + 1, i};
}

TEST(HostTier, AdmitsInLruOrderAndDropsTheOldest) {
  HostTier t(2, 1);
  const auto a = t.admit(kNs, h(1));
  const auto b = t.admit(kNs, h(2));
  EXPECT_TRUE(a.copy && b.copy);
  EXPECT_NE(a.slot, b.slot);
  EXPECT_FALSE(a.dropped || b.dropped);
  // A block held already moves to most recent without a copy, so h(2) is now the oldest.
  const auto again = t.admit(kNs, h(1));
  EXPECT_EQ(again.slot, a.slot);
  EXPECT_FALSE(again.copy);
  const auto c = t.admit(kNs, h(3));
  EXPECT_TRUE(c.dropped);
  EXPECT_EQ(c.dropped_hash, h(2));
  EXPECT_EQ(c.slot, b.slot);
  EXPECT_EQ(t.find(kNs, h(2)), kNoSlot);
  EXPECT_EQ(t.find(kNs, h(1)), a.slot);
  EXPECT_EQ(t.find(kNs + 1, h(1)), kNoSlot);  // namespaces never meet
  EXPECT_EQ(t.counters().dropped, 1u);
  EXPECT_EQ(t.counters().refreshed, 1u);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(HostTier, PromotingSlotsAreNeitherFoundNorDropped) {
  HostTier t(1, 1);
  const SlotId s = t.admit(kNs, h(1)).slot;
  t.begin_promote(s);
  EXPECT_EQ(t.find(kNs, h(1)), kNoSlot);
  EXPECT_EQ(t.check_invariants(), "");
  // The only slot is being promoted: nothing can be admitted.
  EXPECT_EQ(t.admit(kNs, h(2)).slot, kNoSlot);
  t.cancel_promote(s);
  EXPECT_EQ(t.find(kNs, h(1)), s);
  t.begin_promote(s);
  t.end_promote(s);
  EXPECT_EQ(t.held(), 0u);
  EXPECT_EQ(t.counters().promoted, 1u);
  EXPECT_EQ(t.check_invariants(), "");
}

// drop(): a hybrid model's other group lost the block. It leaves the tier, counted as dropped
// (not superseded, which erase() counts), and the slot is free again.
TEST(HostTier, DropFreesTheSlotAndCountsADrop) {
  HostTier t(2, 1);
  const SlotId a = t.admit(kNs, h(1)).slot;
  t.admit(kNs, h(2));
  EXPECT_TRUE(t.drop(kNs, h(1)));
  EXPECT_FALSE(t.drop(kNs, h(1)));
  EXPECT_EQ(t.find(kNs, h(1)), kNoSlot);
  EXPECT_EQ(t.counters().dropped, 1u);
  EXPECT_EQ(t.counters().superseded, 0u);
  EXPECT_EQ(t.admit(kNs, h(3)).slot, a);  // the freed slot, nothing dropped for it
  EXPECT_EQ(t.counters().dropped, 1u);
  EXPECT_TRUE(t.erase(kNs, h(2)));
  EXPECT_EQ(t.counters().superseded, 1u);
  EXPECT_EQ(t.check_invariants(), "");
}

TEST(HostTier, ZeroCapacityAdmitsNothingAndFlushEmpties) {
  HostTier none(0, 1);
  EXPECT_EQ(none.admit(kNs, h(1)).slot, kNoSlot);
  HostTier t(4, 1);
  for (uint64_t i = 0; i < 3; ++i)
    t.admit(kNs, h(i));
  const SlotId s = t.find(kNs, h(0));
  t.discard(s);
  EXPECT_EQ(t.find(kNs, h(0)), kNoSlot);
  EXPECT_EQ(t.flush(), 2u);
  EXPECT_EQ(t.held(), 0u);
  EXPECT_EQ(t.check_invariants(), "");
}

struct Tiered : ::testing::Test {
  PagePool pool{PoolOptions{4, nullptr, 1}};
  HostTier host{8, 1};
  TierMover mover{pool, host, nullptr};
  OwnerId owner = pool.open_owner();

  // Allocates, publishes and releases one page per hash; returns the pages.
  std::vector<PageId> cache(std::vector<uint64_t> ids) {
    std::vector<PageId> pages(ids.size());
    EXPECT_TRUE(pool.alloc(owner, pages).ok());
    std::vector<PublishItem> items;
    for (size_t i = 0; i < ids.size(); ++i)
      items.push_back({pages[i], h(ids[i])});
    std::vector<PublishResult> out(ids.size());
    EXPECT_TRUE(pool.publish(owner, kNs, items, out).ok());
    EXPECT_TRUE(pool.release(owner, pages).ok());
    return pages;
  }
  void check() {
    EXPECT_EQ(pool.check_invariants(), "");
    EXPECT_EQ(host.check_invariants(), "");
  }
};

TEST_F(Tiered, EvictionsAreDemotedPageToSlot) {
  const auto first = cache({1, 2, 3, 4});
  cache({5, 6});  // evicts two of the first four (LRU: 1, 2)
  const auto moves = mover.admit_pending();
  ASSERT_EQ(moves.size(), 2u);
  EXPECT_EQ(moves[0].page, first[0]);
  EXPECT_EQ(moves[1].page, first[1]);
  EXPECT_EQ(host.find(kNs, h(1)), moves[0].slot);
  EXPECT_EQ(host.find(kNs, h(2)), moves[1].slot);
  EXPECT_TRUE(mover.admit_pending().empty());  // consumed
  check();
}

// Evictions dropped before admission are lost, as without a tier: their pages went back FREE.
TEST_F(Tiered, DroppedEvictionsAreNeverAdmitted) {
  cache({1, 2, 3, 4});
  std::vector<PageId> pages(2);
  ASSERT_TRUE(pool.alloc(owner, pages).ok());  // evicts 1 and 2
  ASSERT_TRUE(pool.release(owner, pages).ok());
  mover.drop_pending();
  EXPECT_TRUE(mover.admit_pending().empty());
  EXPECT_EQ(host.find(kNs, h(1)), kNoSlot);
  EXPECT_EQ(host.find(kNs, h(2)), kNoSlot);
  EXPECT_EQ(host.held(), 0u);
  cache({5, 6, 7});  // two FREE pages, then one eviction, admitted as usual
  EXPECT_EQ(mover.admit_pending().size(), 1u);
  check();
}

TEST_F(Tiered, PromotionClaimsSlotsAllocatesAndPublishes) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});  // 1..4 demoted
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(1), h(2), h(9)};
  const auto started = mover.start_promotion(owner, kNs, chain, PagePool::kUnlimited, {});
  // A copy: the span is the mover's, and ends with the promotion.
  const std::vector<TierMover::Move> promos(started.begin(), started.end());
  ASSERT_EQ(promos.size(), 2u);  // h(9) was never cached
  // The promotion's pages carry no hash until finish: nobody can find them yet.
  uint32_t hits = 0;
  std::vector<PageId> found(1);
  const BlockHash one = h(1);
  ASSERT_TRUE(pool.lookup(pool.open_owner(), kNs, std::span(&one, 1), found, hits).ok());
  EXPECT_EQ(hits, 0u);
  // Its allocation evicted two of 5..8, demoted into other slots than the claimed ones.
  const auto demoted = mover.admit_pending();
  ASSERT_EQ(demoted.size(), 2u);
  for (const auto& d : demoted) {
    EXPECT_NE(d.slot, promos[0].slot);
    EXPECT_NE(d.slot, promos[1].slot);
  }
  std::vector<PageId> out(2);
  EXPECT_EQ(mover.finish_promotion(owner, kNs, chain, out), 2u);
  EXPECT_EQ(out[0], promos[0].page);
  EXPECT_EQ(pool.held(owner, out[0]), 1u);
  EXPECT_EQ(host.find(kNs, h(1)), kNoSlot);  // exclusive: the block left the host tier
  Namespace ns = 0;
  BlockHash key;
  ASSERT_TRUE(pool.indexed_key(out[1], ns, key));
  EXPECT_EQ(key, h(2));
  EXPECT_EQ(host.counters().promoted, 2u);
  check();
}

TEST_F(Tiered, PromotionIsBoundedByTheDeviceRoom) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});
  mover.admit_pending();
  std::vector<PageId> held(3);
  ASSERT_TRUE(pool.alloc(owner, held).ok());  // one page left that can be handed out
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(1), h(2)};
  const auto started = mover.start_promotion(owner, kNs, chain, PagePool::kUnlimited, {});
  const std::vector<TierMover::Move> promos(started.begin(), started.end());
  EXPECT_EQ(promos.size(), 1u);
  std::vector<PageId> out(1);
  mover.admit_pending();
  EXPECT_EQ(mover.finish_promotion(owner, kNs, chain, out), 1u);
  EXPECT_NE(host.find(kNs, h(2)), kNoSlot);
  check();
}

TEST_F(Tiered, CancelReleasesThePagesAndRestoresTheSlots) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(3), h(4)};
  const auto started = mover.start_promotion(owner, kNs, chain, 2, {});
  const std::vector<TierMover::Move> promos(started.begin(), started.end());
  ASSERT_EQ(promos.size(), 2u);
  mover.admit_pending();
  mover.cancel_promotion(owner);
  EXPECT_EQ(pool.owner_pages(owner), 0u);
  EXPECT_NE(host.find(kNs, h(3)), kNoSlot);
  EXPECT_NE(host.find(kNs, h(4)), kNoSlot);
  EXPECT_EQ(host.counters().promoted, 0u);
  check();
}

TEST_F(Tiered, AHashPublishedMeanwhileIsAnsweredWithTheDevicePage) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(1)};
  const auto started = mover.start_promotion(owner, kNs, chain, 1, {});
  const std::vector<TierMover::Move> promos(started.begin(), started.end());
  ASSERT_EQ(promos.size(), 1u);
  mover.admit_pending();
  // Another owner computes and publishes h(1) before the promotion finishes.
  const OwnerId other = pool.open_owner();
  PageId page = kNoPage;
  ASSERT_TRUE(pool.alloc(other, std::span(&page, 1)).ok());
  mover.admit_pending();
  const PublishItem item{page, h(1)};
  PublishResult res;
  ASSERT_TRUE(pool.publish(other, kNs, std::span(&item, 1), std::span(&res, 1)).ok());
  std::vector<PageId> out(1);
  EXPECT_EQ(mover.finish_promotion(owner, kNs, chain, out), 1u);
  EXPECT_EQ(out[0], page);
  EXPECT_EQ(pool.owner_pages(owner), 1u);  // the allocated copy was released
  check();
}

TEST_F(Tiered, TwoOwnersMayEachHaveAPromotionOpen) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});  // 1..4 demoted
  mover.admit_pending();
  const OwnerId other = pool.open_owner();
  const std::vector<BlockHash> first{h(1), h(2)};
  const std::vector<BlockHash> second{h(3)};
  const auto a = mover.start_promotion(owner, kNs, first, PagePool::kUnlimited, {});
  const std::vector<TierMover::Move> mine(a.begin(), a.end());
  mover.admit_pending();
  const auto b = mover.start_promotion(other, kNs, second, PagePool::kUnlimited, {});
  const std::vector<TierMover::Move> theirs(b.begin(), b.end());
  mover.admit_pending();
  ASSERT_EQ(mine.size(), 2u);
  ASSERT_EQ(theirs.size(), 1u);
  EXPECT_EQ(host.promoting(), 3u);
  // The second finishes first; each owner gets its own pages, published under its own chain.
  std::vector<PageId> out(2);
  EXPECT_EQ(mover.finish_promotion(other, kNs, second, out), 1u);
  EXPECT_EQ(out[0], theirs[0].page);
  mover.cancel_promotion(owner);
  EXPECT_EQ(pool.owner_pages(owner), 0u);
  EXPECT_NE(host.find(kNs, h(1)), kNoSlot);  // back in the host tier
  EXPECT_EQ(host.find(kNs, h(3)), kNoSlot);  // promoted
  EXPECT_EQ(host.promoting(), 0u);
  check();
}

TEST_F(Tiered, DiscardLeavesASlotThatIsNoLongerHeldAlone) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(1)};
  const auto started = mover.start_promotion(owner, kNs, chain, 1, {});
  ASSERT_EQ(started.size(), 1u);
  const SlotId claimed = started[0].slot;
  mover.admit_pending();
  // A demotion that failed off the loop after its slot was claimed: nothing to drop.
  mover.discard(claimed);
  EXPECT_EQ(host.promoting(), 1u);
  std::vector<PageId> out(1);
  EXPECT_EQ(mover.finish_promotion(owner, kNs, chain, out), 1u);
  check();
}

TEST_F(Tiered, ACancelThatDropsTheSlotsLosesTheBlocks) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});
  mover.admit_pending();
  const std::vector<BlockHash> chain{h(3), h(4)};
  ASSERT_EQ(mover.start_promotion(owner, kNs, chain, 2, {}).size(), 2u);
  mover.admit_pending();
  const uint32_t held_before = host.held();
  // The slots' bytes may be bad (a demotion into one failed): they must not come back.
  mover.cancel_promotion(owner, false);
  EXPECT_EQ(pool.owner_pages(owner), 0u);
  EXPECT_EQ(host.find(kNs, h(3)), kNoSlot);
  EXPECT_EQ(host.find(kNs, h(4)), kNoSlot);
  EXPECT_EQ(host.held(), held_before);
  EXPECT_EQ(host.promoting(), 0u);
  check();
}

TEST_F(Tiered, EvictIntoHoldsTheVictimsForTheOwner) {
  const auto pages = cache({1, 2, 3});
  const OwnerId tier_owner = pool.open_owner();
  std::vector<PageId> held;
  EXPECT_EQ(pool.evict_into(tier_owner, 2, held), 2u);
  ASSERT_EQ(held.size(), 2u);
  for (const PageId p : held) {
    EXPECT_EQ(pool.held(tier_owner, p), 1u);
    EXPECT_FALSE(pool.published(p));
  }
  EXPECT_EQ(mover.admit_pending().size(), 2u);  // demoted as any eviction
  // Nobody else gets them while they are held: the pool's one free page and one cached remain.
  EXPECT_EQ(pool.stats().free, 1u);
  std::vector<PageId> two(2);
  ASSERT_TRUE(pool.alloc(owner, two).ok());
  for (const PageId p : two)
    EXPECT_EQ(std::count(held.begin(), held.end(), p), 0);
  ASSERT_TRUE(pool.release(tier_owner, held).ok());
  EXPECT_EQ(pool.stats().free, 2u);
  check();
}

TEST_F(Tiered, ABlockPublishedAfreshLeavesTheHostTier) {
  cache({1, 2, 3, 4});
  cache({5, 6, 7, 8});  // 1..4 demoted
  mover.admit_pending();
  ASSERT_NE(host.find(kNs, h(1)), kNoSlot);
  cache({1});  // computed again and published on the device tier
  mover.admit_pending();
  EXPECT_EQ(host.find(kNs, h(1)), kNoSlot);  // the tiers stay exclusive
  EXPECT_EQ(host.counters().superseded, 1u);
  check();
}

TEST(TieredSmallHost, MoreEvictionsThanSlotsWriteEachSlotOnce) {
  PagePool pool{PoolOptions{8, nullptr, 1}};
  HostTier host{2, 1};
  TierMover mover{pool, host, nullptr};
  const OwnerId owner = pool.open_owner();
  std::vector<PageId> pages(8);
  ASSERT_TRUE(pool.alloc(owner, pages).ok());
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < 8; ++i)
    items.push_back({pages[i], h(i)});
  std::vector<PublishResult> out(8);
  ASSERT_TRUE(pool.publish(owner, kNs, items, out).ok());
  ASSERT_TRUE(pool.release(owner, pages).ok());
  ASSERT_TRUE(pool.alloc(owner, pages).ok());  // evicts all 8 in one call
  const auto moves = mover.admit_pending();
  ASSERT_EQ(moves.size(), 2u);  // only the last two blocks' copies: one per slot
  EXPECT_NE(moves[0].slot, moves[1].slot);
  for (const auto& m : moves)
    EXPECT_EQ(host.find(kNs, host.slot_hash(m.slot)), m.slot);
  EXPECT_EQ(host.held(), 2u);
  EXPECT_EQ(host.check_invariants(), "");
}

TEST_F(Tiered, FlushRemovalsAreNotDemoted) {
  cache({1, 2});
  pool.flush();
  EXPECT_TRUE(mover.admit_pending().empty());
  EXPECT_EQ(host.held(), 0u);
  check();
}

}  // namespace
}  // namespace kvpool::core

// The eviction policies and their building blocks, driven directly through their interfaces
// (no PagePool): PageLists (intrusive FIFO lists), GhostSet (approximate memory of evicted keys),
// the policy registry (make_policy, policy_names, contents_key), and each policy's queueing
// decisions: LRU order; S3-FIFO's small/main queues, ghost comebacks and frequency moves; the
// prefix policy's segment placement by PageFacts, its caps, release-run propagation and victim
// order across segments.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/ghost_set.h"
#include "daemon/core/lru_policy.h"
#include "daemon/core/page_lists.h"
#include "daemon/core/prefix_policy.h"
#include "daemon/core/s3fifo_policy.h"

namespace kvpool::core {
namespace {

// A well-mixed key per id, as the pool computes them.
uint64_t key_of(uint64_t id) {
  return contents_key(1, BlockHash{id, id * 0x9E3779B97F4A7C15ull + 1});
}

PageFacts facts(uint64_t id, uint8_t hits = 0, Priority priority = Priority::none,
                bool first = true, uint32_t run = 0) {
  return PageFacts{key_of(id), hits, priority, first, run};
}

std::vector<PageId> queued(const EvictionPolicy& p) {
  std::vector<PageId> out;
  p.for_each_queued([&](PageId page) { out.push_back(page); });
  return out;
}

// Victims until the policy has none left.
std::vector<PageId> drain(EvictionPolicy& p) {
  std::vector<PageId> out;
  for (PageId page = p.victim(); page != kNoPage; page = p.victim())
    out.push_back(page);
  return out;
}

template <uint8_t N>
std::vector<PageId> list(const PageLists<N>& lists, uint8_t k) {
  std::vector<PageId> out;
  lists.for_each(k, [&](PageId page) { out.push_back(page); });
  return out;
}

using Pages = std::vector<PageId>;

// PageLists -----------------------------------------------------------------------------------

TEST(PageLists, KeepPushOrderPerListWithSizesAndMembership) {
  PageLists<3> l;
  l.reset(10);
  for (uint8_t k = 0; k < 3; ++k) {
    EXPECT_TRUE(l.empty(k));
    EXPECT_EQ(l.size(k), 0u);
  }
  for (const PageId p : {4u, 1u, 7u})
    l.push_back(0, p);
  l.push_back(2, 3);
  l.push_back(2, 0);
  EXPECT_EQ(list(l, 0), (Pages{4, 1, 7}));
  EXPECT_EQ(list(l, 1), Pages{});
  EXPECT_EQ(list(l, 2), (Pages{3, 0}));
  EXPECT_EQ(l.size(0), 3u);
  EXPECT_EQ(l.size(1), 0u);
  EXPECT_EQ(l.size(2), 2u);
  EXPECT_TRUE(l.empty(1));
  EXPECT_FALSE(l.empty(2));
  EXPECT_EQ(l.list_of(4), 0);
  EXPECT_EQ(l.list_of(7), 0);
  EXPECT_EQ(l.list_of(0), 2);
  for (const PageId p : {2u, 5u, 6u, 8u, 9u})
    EXPECT_EQ(l.list_of(p), PageLists<3>::kNone) << p;
}

TEST(PageLists, UnlinkFromMiddleHeadAndTail) {
  PageLists<2> l;
  l.reset(8);
  for (PageId p = 0; p < 6; ++p)
    l.push_back(1, p);
  l.unlink(3);  // middle
  EXPECT_EQ(list(l, 1), (Pages{0, 1, 2, 4, 5}));
  l.unlink(0);  // head
  EXPECT_EQ(list(l, 1), (Pages{1, 2, 4, 5}));
  l.unlink(5);  // tail
  EXPECT_EQ(list(l, 1), (Pages{1, 2, 4}));
  EXPECT_EQ(l.size(1), 3u);
  for (const PageId p : {0u, 3u, 5u})
    EXPECT_EQ(l.list_of(p), PageLists<2>::kNone) << p;

  // Pushing after unlinking the tail appends after the new tail; an unlinked page can go into
  // another list.
  l.push_back(1, 6);
  l.push_back(0, 5);
  EXPECT_EQ(list(l, 1), (Pages{1, 2, 4, 6}));
  EXPECT_EQ(list(l, 0), Pages{5});
  EXPECT_EQ(l.list_of(5), 0);

  // Unlinking every page one by one, the only one last, leaves an empty list that works again.
  for (const PageId p : {2u, 6u, 1u, 4u})
    l.unlink(p);
  EXPECT_TRUE(l.empty(1));
  EXPECT_EQ(list(l, 1), Pages{});
  l.push_back(1, 2);
  EXPECT_EQ(list(l, 1), Pages{2});
  EXPECT_EQ(l.pop_front(1), 2u);
  EXPECT_EQ(l.pop_front(1), kNoPage);
}

TEST(PageLists, PopFrontTakesTheOldestAndUnlinksIt) {
  PageLists<1> l;
  l.reset(5);
  EXPECT_EQ(l.pop_front(0), kNoPage);
  for (const PageId p : {2u, 0u, 4u})
    l.push_back(0, p);
  EXPECT_EQ(l.pop_front(0), 2u);
  EXPECT_EQ(l.list_of(2), PageLists<1>::kNone);
  EXPECT_EQ(l.size(0), 2u);
  l.push_back(0, 2);  // back at the tail
  EXPECT_EQ(l.pop_front(0), 0u);
  EXPECT_EQ(l.pop_front(0), 4u);
  EXPECT_EQ(l.pop_front(0), 2u);
  EXPECT_EQ(l.pop_front(0), kNoPage);
  EXPECT_TRUE(l.empty(0));
}

TEST(PageLists, ResetForgetsEverything) {
  PageLists<2> l;
  l.reset(4);
  l.push_back(0, 1);
  l.push_back(1, 2);
  l.reset(6);
  EXPECT_TRUE(l.empty(0));
  EXPECT_TRUE(l.empty(1));
  for (PageId p = 0; p < 6; ++p)
    EXPECT_EQ(l.list_of(p), PageLists<2>::kNone);
  l.push_back(1, 5);
  EXPECT_EQ(list(l, 1), Pages{5});
}

// GhostSet ------------------------------------------------------------------------------------

TEST(GhostSet, TakeFindsAnInsertedKeyOnce) {
  GhostSet g(64);
  EXPECT_GE(g.slots(), 128u);
  EXPECT_FALSE(g.take(key_of(1)));
  g.insert(key_of(1));
  g.insert(key_of(1));  // a second insert does not make a second copy
  EXPECT_TRUE(g.take(key_of(1)));
  EXPECT_FALSE(g.take(key_of(1)));
  EXPECT_FALSE(g.take(key_of(2)));
}

TEST(GhostSet, IgnoresBit63OfTheKey) {
  GhostSet g(64);
  const uint64_t k = key_of(9) & ~(uint64_t{1} << 63);
  g.insert(k);
  EXPECT_TRUE(g.take(k | (uint64_t{1} << 63)));
  EXPECT_FALSE(g.take(k));
}

TEST(GhostSet, DefaultConstructedRemembersNothing) {
  GhostSet g;
  EXPECT_EQ(g.slots(), 0u);
  EXPECT_FALSE(g.take(key_of(3)));
}

TEST(GhostSet, EachBucketForgetsInFifoOrder) {
  // Capacity 3: one bucket of 7 ways, so every key shares it.
  GhostSet g(3);
  ASSERT_EQ(g.slots(), 7u);
  for (uint64_t i = 0; i < 8; ++i)
    g.insert(key_of(i));
  EXPECT_FALSE(g.take(key_of(0))) << "the oldest key makes room for the 8th";
  for (uint64_t i = 1; i < 8; ++i)
    EXPECT_TRUE(g.take(key_of(i))) << "key " << i;
}

TEST(GhostSet, ATakeFreesAWayThatTheNextInsertFills) {
  GhostSet g(3);  // one bucket of 7 ways
  for (uint64_t i = 0; i < 7; ++i)
    g.insert(key_of(i));
  EXPECT_TRUE(g.take(key_of(3)));
  g.insert(key_of(7));  // into the freed way: nothing forgotten
  for (uint64_t i = 0; i < 8; ++i)
    EXPECT_EQ(g.take(key_of(i)), i != 3) << "key " << i;
}

TEST(GhostSet, RemembersAboutTheLastCapacityKeys) {
  constexpr uint64_t kCap = 1000;
  GhostSet g(kCap);
  EXPECT_GE(g.slots(), 2 * kCap);
  for (uint64_t i = 0; i < 3 * kCap; ++i)
    g.insert(key_of(i));
  // The newest `kCap` keys: nearly all remembered.
  uint64_t recent = 0;
  for (uint64_t i = 2 * kCap; i < 3 * kCap; ++i)
    recent += g.take(key_of(i)) ? 1u : 0u;
  EXPECT_GE(recent, kCap * 95 / 100);
  // Never inserted: only a rare tag collision reads as remembered.
  uint64_t strangers = 0;
  for (uint64_t i = 100 * kCap; i < 101 * kCap; ++i)
    strangers += g.take(key_of(i)) ? 1u : 0u;
  EXPECT_LE(strangers, kCap / 100);
}

TEST(GhostSet, ForgetsOldKeysFarPastCapacity) {
  constexpr uint64_t kCap = 200;
  GhostSet g(kCap);
  for (uint64_t i = 0; i < kCap; ++i)
    g.insert(key_of(i));
  for (uint64_t i = kCap; i < 51 * kCap; ++i)
    g.insert(key_of(i));
  uint64_t early = 0;
  for (uint64_t i = 0; i < kCap; ++i)
    early += g.take(key_of(i)) ? 1u : 0u;
  EXPECT_LE(early, kCap / 50) << "after 50x capacity insertions the first keys are gone";
  // The newest are still there.
  uint64_t late = 0;
  for (uint64_t i = 51 * kCap - kCap / 2; i < 51 * kCap; ++i)
    late += g.take(key_of(i)) ? 1u : 0u;
  EXPECT_GE(late, kCap / 2 * 95 / 100);
}

// Registry ------------------------------------------------------------------------------------

TEST(EvictionPolicy, RegistryNamesEveryPolicyDefaultFirst) {
  const auto names = policy_names();
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[0], kDefaultPolicy);
  std::set<std::string_view> seen;
  for (const std::string_view name : names) {
    EXPECT_TRUE(seen.insert(name).second) << name;
    const auto policy = make_policy(name);
    ASSERT_NE(policy, nullptr) << name;
    EXPECT_EQ(policy->name(), name);
  }
  EXPECT_TRUE(seen.count("lru") && seen.count("s3fifo") && seen.count("prefix"));
  EXPECT_EQ(make_policy("LRU"), nullptr);
  EXPECT_EQ(make_policy(""), nullptr);
  EXPECT_EQ(make_policy("clock"), nullptr);
}

TEST(EvictionPolicy, ContentsKeyIsDeterministicAndSeparatesNamespacesAndHashes) {
  const BlockHash h{12, 34};
  EXPECT_EQ(contents_key(1, h), contents_key(1, h));
  EXPECT_NE(contents_key(1, h), contents_key(2, h));
  EXPECT_NE(contents_key(1, h), contents_key(1, BlockHash{13, 34}));
  EXPECT_NE(contents_key(1, h), contents_key(1, BlockHash{12, 35}));
  std::set<uint64_t> keys;
  for (uint64_t i = 0; i < 1000; ++i)
    keys.insert(key_of(i));
  EXPECT_EQ(keys.size(), 1000u);
}

TEST(EvictionPolicy, EveryPolicyIsEmptyAfterAttachAndQueuesWhatItIsGiven) {
  for (const std::string_view name : policy_names()) {
    SCOPED_TRACE(std::string(name));
    const auto p = make_policy(name);
    p->attach(16);
    EXPECT_EQ(p->victim(), kNoPage);
    EXPECT_EQ(queued(*p), Pages{});
    for (PageId page = 0; page < 16; ++page)
      p->on_cached(page, facts(page));
    Pages q = queued(*p);
    std::sort(q.begin(), q.end());
    ASSERT_EQ(q.size(), 16u);
    for (PageId page = 0; page < 16; ++page)
      EXPECT_EQ(q[page], page);
    p->on_reuse(5);
    p->on_reuse(0);
    Pages v = drain(*p);
    EXPECT_EQ(v.size(), 14u);
    EXPECT_EQ(std::count(v.begin(), v.end(), 5u) + std::count(v.begin(), v.end(), 0u), 0);
    EXPECT_EQ(p->victim(), kNoPage);
    EXPECT_EQ(queued(*p), Pages{});
  }
}

// LRU -----------------------------------------------------------------------------------------

TEST(LruPolicy, EvictsInReleaseOrderWhateverTheFacts) {
  LruPolicy p;
  p.attach(8);
  p.on_cached(3, facts(3, 0, Priority::system));
  p.on_cached(1, facts(1, 200, Priority::conversation));
  p.on_cached(6, facts(6, 0, Priority::one_off));
  p.on_cached(2, facts(2));
  EXPECT_EQ(queued(p), (Pages{3, 1, 6, 2}));
  p.on_reuse(1);  // a hit takes it out
  EXPECT_EQ(queued(p), (Pages{3, 6, 2}));
  p.on_cached(1, facts(1, 201, Priority::none, false));  // released again: newest
  EXPECT_EQ(p.victim(), 3u);
  EXPECT_EQ(drain(p), (Pages{6, 2, 1}));
}

// S3-FIFO -------------------------------------------------------------------------------------
// With 20 pages the small queue's target is 2.

TEST(S3FifoPolicy, NewPagesGoToSmallAndAreEvictedBeforeMain) {
  S3FifoPolicy p;
  p.attach(20);
  // Page 0, hit once, gets promoted to main by the first victim() call; page 1 is the victim.
  p.on_cached(0, facts(0, 1));
  p.on_cached(1, facts(1));
  p.on_cached(2, facts(2));
  EXPECT_EQ(p.victim(), 1u);
  EXPECT_EQ(queued(p), (Pages{2, 0}));  // small [2], main [0]
  // New pages go to small, behind 2 and ahead of main in the queue listing.
  for (const PageId page : {3u, 4u, 5u})
    p.on_cached(page, facts(page));
  EXPECT_EQ(queued(p), (Pages{2, 3, 4, 5, 0}));
  // While small holds at least its target it gives the victims, oldest first...
  EXPECT_EQ(p.victim(), 2u);
  EXPECT_EQ(p.victim(), 3u);
  EXPECT_EQ(p.victim(), 4u);
  // ...below it, main does; with main empty, small again.
  EXPECT_EQ(p.victim(), 0u);
  EXPECT_EQ(p.victim(), 5u);
  EXPECT_EQ(p.victim(), kNoPage);
}

TEST(S3FifoPolicy, HitPageAtTheSmallHeadMovesToMainInsteadOfBeingEvicted) {
  S3FifoPolicy p;
  p.attach(20);
  p.on_cached(0, facts(0, 3));  // hits before it was first cached count too
  p.on_cached(1, facts(1, 1));
  p.on_cached(2, facts(2));
  p.on_cached(3, facts(3));
  EXPECT_EQ(p.victim(), 2u);  // 0 and 1 moved to main on the way
  EXPECT_EQ(queued(p), (Pages{3, 0, 1}));
  // Moved with its frequency reset: once small is below target, main's head goes unhit.
  EXPECT_EQ(p.victim(), 0u);
  EXPECT_EQ(p.victim(), 1u);
  EXPECT_EQ(p.victim(), 3u);
}

TEST(S3FifoPolicy, PageMovedToMainIsNotEvictedByTheCallThatMovedIt) {
  // Small at its target, main empty: the hit page at small's head moves to main and the unhit
  // page behind it is the victim, not the page just moved.
  S3FifoPolicy p;
  p.attach(20);
  p.on_cached(0, facts(0, 1));
  p.on_cached(1, facts(1));
  EXPECT_EQ(p.victim(), 1u);
  EXPECT_EQ(queued(p), Pages{0});
  EXPECT_EQ(p.victim(), 0u);
}

TEST(S3FifoPolicy, HitsWhileInUseCountWhenThePageIsReleasedAgain) {
  S3FifoPolicy p;
  p.attach(20);
  p.on_cached(0, facts(0));
  p.on_cached(1, facts(1));
  p.on_reuse(0);
  EXPECT_EQ(queued(p), Pages{1});
  p.on_cached(0, facts(0, 1, Priority::none, false));  // one hit since: back to small's tail
  p.on_cached(2, facts(2));
  EXPECT_EQ(queued(p), (Pages{1, 0, 2}));
  ASSERT_EQ(p.victim(), 1u);
  ASSERT_EQ(p.victim(), 2u);  // 0 went to main on the way
  ASSERT_EQ(queued(p), Pages{0});
  // A main page released again stays in main; with no hits since, it is evicted unhit.
  p.on_reuse(0);
  p.on_cached(0, facts(0, 1, Priority::none, false));
  p.on_cached(3, facts(3));
  p.on_cached(4, facts(4));
  EXPECT_EQ(queued(p), (Pages{3, 4, 0}));
  EXPECT_EQ(p.victim(), 3u);
  EXPECT_EQ(p.victim(), 0u);
  EXPECT_EQ(p.victim(), 4u);
}

TEST(S3FifoPolicy, KeyEvictedFromSmallComesBackToMain) {
  S3FifoPolicy p;
  p.attach(20);
  p.on_cached(0, facts(100));
  EXPECT_EQ(p.victim(), 0u);   // key 100 remembered
  p.on_cached(7, facts(100));  // its contents, on another page: straight to main
  p.on_cached(8, facts(101));
  EXPECT_EQ(queued(p), (Pages{8, 7}));
  // Small is below target: main's unhit head goes.
  EXPECT_EQ(p.victim(), 7u);
  // Only small's victims are remembered, and a comeback consumed the memory.
  p.on_cached(9, facts(100));
  EXPECT_EQ(queued(p), (Pages{8, 9}));
  // A page released again keeps its queue.
  p.on_cached(10, facts(102));
  EXPECT_EQ(p.victim(), 8u);  // key 101 remembered
  p.on_reuse(10);
  p.on_cached(10, facts(102, 0, Priority::none, false));
  EXPECT_EQ(queued(p), (Pages{9, 10}));
  p.on_cached(11, facts(101));  // comes back: main
  EXPECT_EQ(queued(p), (Pages{9, 10, 11}));
}

TEST(S3FifoPolicy, MainReinsertsPagesWithFrequencyCappedAtThree) {
  S3FifoPolicy p;
  p.attach(20);
  // Keys 1..4 and 50 are evicted from small (main empty), so they all come back to main.
  for (PageId page = 0; page < 5; ++page)
    p.on_cached(page, facts(page == 0 ? 50 : page));
  EXPECT_EQ(drain(p), (Pages{0, 1, 2, 3, 4}));
  p.on_cached(0, facts(50, 10));  // main, frequency min(3, 10)
  p.on_cached(1, facts(1));       // main, frequency 0
  EXPECT_EQ(queued(p), (Pages{0, 1}));
  // Page 0 goes around main once per victim() call that reaches it, one less each time.
  EXPECT_EQ(p.victim(), 1u);
  EXPECT_EQ(queued(p), Pages{0});
  p.on_cached(2, facts(2));
  EXPECT_EQ(p.victim(), 2u);
  p.on_cached(3, facts(3));
  EXPECT_EQ(p.victim(), 3u);
  p.on_cached(4, facts(4));
  EXPECT_EQ(queued(p), (Pages{0, 4}));
  EXPECT_EQ(p.victim(), 0u) << "three rounds spent its capped frequency";
  EXPECT_EQ(p.victim(), 4u);
}

// Prefix --------------------------------------------------------------------------------------

using Seg = PrefixPolicy::Segment;

TEST(PrefixPolicy, PlacesPagesBySegmentFromTheirFacts) {
  PrefixPolicy p;
  p.attach(20);
  p.on_cached(0, facts(0));                             // no evidence
  p.on_cached(1, facts(1, 0, Priority::one_off));       // one-off hint
  p.on_cached(2, facts(2, 1));                          // a hit
  p.on_cached(3, facts(3, 0, Priority::conversation));  // a conversation
  p.on_cached(4, facts(4, 0, Priority::system));        // a system prompt
  p.on_cached(5, facts(5, 2, Priority::one_off));       // hit although one-off
  p.on_cached(6, facts(6, 255, Priority::system));      // system, hits or not
  p.on_cached(7, facts(7));                             // no evidence
  EXPECT_EQ(p.segment_of(0), Seg::kProbation);
  EXPECT_EQ(p.segment_of(1), Seg::kOneOff);
  EXPECT_EQ(p.segment_of(2), Seg::kProtected);
  EXPECT_EQ(p.segment_of(3), Seg::kProtected);
  EXPECT_EQ(p.segment_of(4), Seg::kSystem);
  EXPECT_EQ(p.segment_of(5), Seg::kProtected);
  EXPECT_EQ(p.segment_of(6), Seg::kSystem);
  EXPECT_EQ(p.segment_of(7), Seg::kProbation);
  EXPECT_EQ(p.segment_size(Seg::kOneOff), 1u);
  EXPECT_EQ(p.segment_size(Seg::kProbation), 2u);
  EXPECT_EQ(p.segment_size(Seg::kProtected), 3u);
  EXPECT_EQ(p.segment_size(Seg::kSystem), 2u);
  EXPECT_EQ(queued(p), (Pages{1, 0, 7, 2, 3, 5, 4, 6}));
  p.on_reuse(3);
  EXPECT_EQ(p.segment_size(Seg::kProtected), 2u);
}

TEST(PrefixPolicy, VictimsGoSegmentBySegmentOldestFirst) {
  PrefixPolicy p;
  p.attach(20);
  // Interleaved, so that arrival order alone would give another order.
  p.on_cached(0, facts(0, 0, Priority::system));
  p.on_cached(1, facts(1, 1));
  p.on_cached(2, facts(2));
  p.on_cached(3, facts(3, 0, Priority::one_off));
  p.on_cached(4, facts(4, 0, Priority::system));
  p.on_cached(5, facts(5, 0, Priority::conversation));
  p.on_cached(6, facts(6));
  p.on_cached(7, facts(7, 0, Priority::one_off));
  EXPECT_EQ(drain(p), (Pages{3, 7, 2, 6, 1, 5, 0, 4}));
}

TEST(PrefixPolicy, ContentsThatComeBackAfterEvictionAreProtected) {
  PrefixPolicy p;
  p.attach(20);
  p.on_cached(0, facts(100));
  p.on_cached(1, facts(101, 0, Priority::system));
  EXPECT_EQ(p.victim(), 0u);   // from probation
  EXPECT_EQ(p.victim(), 1u);   // from system: remembered as well
  p.on_cached(5, facts(100));  // the contents again, on another page
  p.on_cached(6, facts(101));
  p.on_cached(7, facts(102));  // never evicted
  EXPECT_EQ(p.segment_of(5), Seg::kProtected);
  EXPECT_EQ(p.segment_of(6), Seg::kProtected);
  EXPECT_EQ(p.segment_of(7), Seg::kProbation);
  // The evidence stays with the page across reuse, without hits.
  p.on_reuse(5);
  p.on_cached(5, facts(100, 0, Priority::none, false));
  EXPECT_EQ(p.segment_of(5), Seg::kProtected);
  // ...but not with the page id once it holds other contents (first again).
  p.on_reuse(6);
  p.on_cached(6, facts(103));
  EXPECT_EQ(p.segment_of(6), Seg::kProbation);
  // One-off pages that come back are protected too.
  p.on_cached(8, facts(104, 0, Priority::one_off));
  EXPECT_EQ(p.victim(), 8u);
  p.on_cached(8, facts(104, 0, Priority::one_off));
  EXPECT_EQ(p.segment_of(8), Seg::kProtected);
}

TEST(PrefixPolicy, CapsDemoteTheOldestPageOfAFullSegment) {
  {
    // 20 pages: system holds at most 10; the 11th pushes the oldest down to protected's tail.
    PrefixPolicy p;
    p.attach(20);
    p.on_cached(19, facts(19, 1));  // protected
    for (PageId page = 0; page < 11; ++page)
      p.on_cached(page, facts(page, 0, Priority::system));
    EXPECT_EQ(p.segment_size(Seg::kSystem), 10u);
    EXPECT_EQ(p.segment_of(0), Seg::kProtected);
    EXPECT_EQ(p.segment_of(1), Seg::kSystem);
    EXPECT_EQ(queued(p), (Pages{19, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  }
  {
    // 10 pages: protected holds at most 9; the 10th pushes the oldest down to probation's tail.
    PrefixPolicy p;
    p.attach(10);
    for (PageId page = 0; page < 10; ++page)
      p.on_cached(page, facts(page, 1));
    EXPECT_EQ(p.segment_size(Seg::kProtected), 9u);
    EXPECT_EQ(p.segment_of(0), Seg::kProbation);
    EXPECT_EQ(p.victim(), 0u);
  }
  {
    // 10 pages: system holds at most 5.
    PrefixPolicy p;
    p.attach(10);
    p.on_cached(9, facts(9));  // probation
    for (PageId page = 0; page < 7; ++page)
      p.on_cached(page, facts(page, 0, Priority::system));
    EXPECT_EQ(p.segment_size(Seg::kSystem), 5u);
    EXPECT_EQ(p.segment_of(0), Seg::kProtected);
    EXPECT_EQ(p.segment_of(1), Seg::kProtected);
    EXPECT_EQ(drain(p), (Pages{9, 0, 1, 2, 3, 4, 5, 6}));
  }
}

TEST(PrefixPolicy, ReleaseRunLiftsAHeadToItsChildsSegmentButNotIntoSystem) {
  PrefixPolicy p;
  p.attach(30);
  // One release, tail first: the hit tail lifts the pages before it (run > 0) to protected,
  // and the lift carries on along the run.
  p.on_cached(0, facts(0, 1, Priority::none, true, 0));
  p.on_cached(1, facts(1, 0, Priority::none, true, 1));
  p.on_cached(2, facts(2, 0, Priority::one_off, true, 2));
  EXPECT_EQ(p.segment_of(1), Seg::kProtected);
  EXPECT_EQ(p.segment_of(2), Seg::kProtected);
  // A system child lifts its head to protected, not to system.
  p.on_cached(3, facts(3, 0, Priority::system, true, 0));
  p.on_cached(4, facts(4, 0, Priority::none, true, 1));
  EXPECT_EQ(p.segment_of(3), Seg::kSystem);
  EXPECT_EQ(p.segment_of(4), Seg::kProtected);
  // A probation child lifts a one-off head to probation.
  p.on_cached(5, facts(5, 0, Priority::none, true, 0));
  p.on_cached(6, facts(6, 0, Priority::one_off, true, 1));
  EXPECT_EQ(p.segment_of(6), Seg::kProbation);
  // A head keeps a higher segment of its own.
  p.on_cached(7, facts(7, 0, Priority::none, true, 0));
  p.on_cached(8, facts(8, 0, Priority::system, true, 1));
  p.on_cached(9, facts(9, 0, Priority::conversation, true, 2));
  EXPECT_EQ(p.segment_of(8), Seg::kSystem);
  EXPECT_EQ(p.segment_of(9), Seg::kProtected);
  // run == 0 starts a new release: nothing is inherited from the last call.
  p.on_cached(10, facts(10, 5, Priority::none, true, 0));
  p.on_cached(11, facts(11, 0, Priority::one_off, true, 0));
  EXPECT_EQ(p.segment_of(11), Seg::kOneOff);
  // A one-off tail does not pull a head down.
  p.on_cached(12, facts(12, 0, Priority::one_off, true, 0));
  p.on_cached(13, facts(13, 0, Priority::none, true, 1));
  EXPECT_EQ(p.segment_of(13), Seg::kProbation);
  // So a chain released tail first loses its tail before its head.
  EXPECT_EQ(p.victim(), 11u);
  EXPECT_EQ(p.victim(), 12u);
  EXPECT_EQ(p.victim(), 5u);
  EXPECT_EQ(p.victim(), 6u);
  EXPECT_EQ(p.victim(), 7u);
  EXPECT_EQ(p.victim(), 13u);
}

}  // namespace
}  // namespace kvpool::core

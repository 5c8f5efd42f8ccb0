// The pool core's quota bound on lookup and publish (references to pages an owner did not hold),
// and close_owner's release of many references at once.
#include <gtest/gtest.h>

#include <vector>

#include "daemon/core/page_pool.h"

namespace kvpool::core {
namespace {

constexpr uint32_t kBatch = uint32_t{1} << 18;  // wire::kMaxBatch, the most one request carries

BlockHash H(uint64_t id) {
  return BlockHash{0xAB0000ull + id, id * 0x9E3779B97F4A7C15ull};
}

PagePool make_pool(uint32_t pages) {
  PoolOptions o;
  o.num_pages = pages;
  o.index_seed = 7;
  return PagePool(std::move(o));
}

std::vector<PageId> alloc(PagePool& pool, OwnerId owner, size_t n) {
  std::vector<PageId> out(n, kNoPage);
  EXPECT_TRUE(pool.alloc(owner, out).ok());
  return out;
}

// Owner `a` publishes hashes 0..n-1 on n fresh pages and releases them: n CACHED pages.
std::vector<PageId> cache_chain(PagePool& pool, OwnerId a, uint32_t n) {
  const std::vector<PageId> pages = alloc(pool, a, n);
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages[i], H(i)});
  std::vector<PublishResult> out(n);
  EXPECT_TRUE(pool.publish(a, 1, items, out).ok());
  EXPECT_TRUE(pool.release(a, pages).ok());
  return pages;
}

std::vector<BlockHash> chain(uint32_t n) {
  std::vector<BlockHash> c;
  for (uint32_t i = 0; i < n; ++i)
    c.push_back(H(i));
  return c;
}

TEST(PagePoolQuota, LookupHitsPastTheAllowanceEndThePrefix) {
  PagePool pool = make_pool(16);
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> cached = cache_chain(pool, a, 6);
  const OwnerId b = pool.open_owner();
  std::vector<PageId> out(6, kNoPage);
  uint32_t hits = 0;
  ASSERT_TRUE(pool.lookup(b, 1, chain(6), out, hits, 2).ok());
  EXPECT_EQ(hits, 2u);
  EXPECT_EQ(pool.owner_pages(b), 2u);
  EXPECT_EQ(pool.state(cached[2]), PageState::cached);  // not taken
  // Pages the owner holds already cost nothing: the first two hit again, then one new one.
  ASSERT_TRUE(pool.lookup(b, 1, chain(6), out, hits, 1).ok());
  EXPECT_EQ(hits, 3u);
  EXPECT_EQ(pool.owner_pages(b), 3u);
  EXPECT_EQ(pool.held(b, cached[0]), 2u);
  // No allowance: only held pages hit.
  ASSERT_TRUE(pool.lookup(b, 1, chain(6), out, hits, 0).ok());
  EXPECT_EQ(hits, 3u);
  EXPECT_EQ(pool.owner_pages(b), 3u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolQuota, PublishDuplicatesPastTheAllowanceAreRefusedAndChangeNothing) {
  PagePool pool = make_pool(16);
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> cached = cache_chain(pool, a, 3);
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> own = alloc(pool, b, 3);
  // Items 0 and 1 duplicate cached pages, item 2 is new; two items name hash 1's page.
  const std::vector<PublishItem> items = {{own[0], H(0)}, {own[1], H(1)}, {own[2], H(9)}};
  std::vector<PublishResult> out(3);
  const Status refused = pool.publish(b, 1, items, out, 1);
  EXPECT_EQ(refused, Status(Errc::quota_exceeded, 1, cached[1]));
  EXPECT_EQ(pool.owner_pages(b), 3u);
  EXPECT_EQ(pool.refcount(cached[0]), 0u);
  EXPECT_FALSE(pool.published(own[2]));
  EXPECT_EQ(pool.stats().counters.duplicates, 0u);
  ASSERT_TRUE(pool.publish(b, 1, items, out, 2).ok());
  EXPECT_EQ(out[0].kind, PublishResult::Kind::duplicate);
  EXPECT_EQ(out[1].page, cached[1]);
  EXPECT_EQ(out[2].kind, PublishResult::Kind::stored);
  EXPECT_EQ(pool.owner_pages(b), 5u);
  // A duplicate of a page the owner holds already needs no allowance.
  const std::vector<PageId> more = alloc(pool, b, 2);
  const std::vector<PublishItem> again = {{more[0], H(0)}, {more[1], H(0)}};
  std::vector<PublishResult> out2(2);
  ASSERT_TRUE(pool.publish(b, 1, again, out2, 0).ok());
  EXPECT_EQ(out2[1].page, cached[0]);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePoolQuota, CloseOwnerDropsEveryReferenceOfAPageAtOnce) {
  PagePool pool = make_pool(4);
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 2);
  std::vector<PublishResult> out(1);
  ASSERT_TRUE(pool.publish(a, 1, std::vector<PublishItem>{{p[0], H(0)}}, out).ok());
  std::vector<PageId> found(1);
  uint32_t hits = 0;
  ASSERT_TRUE(pool.lookup(b, 1, chain(1), found, hits).ok());
  // a holds 1 + 4 × 2^18 references to p[0] and 1 + 2^18 to p[1].
  const std::vector<PageId> batch(kBatch, p[0]);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(pool.retain(a, batch).ok());
  ASSERT_TRUE(pool.retain(a, std::vector<PageId>(kBatch, p[1])).ok());
  EXPECT_EQ(pool.refcount(p[0]), 2 + 4 * kBatch);
  ASSERT_TRUE(pool.close_owner(a).ok());
  EXPECT_EQ(pool.refcount(p[0]), 1u);  // b's
  EXPECT_EQ(pool.state(p[1]), PageState::free);
  EXPECT_EQ(pool.stats().counters.released, 2 + 5 * uint64_t{kBatch});
  ASSERT_TRUE(pool.close_owner(b).ok());
  EXPECT_EQ(pool.state(p[0]), PageState::cached);
  EXPECT_EQ(pool.check_invariants(), "");
}

}  // namespace
}  // namespace kvpool::core

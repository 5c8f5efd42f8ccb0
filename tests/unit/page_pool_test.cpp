#include "daemon/core/page_pool.h"
#include "tests/unit/status_assertions.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/lru_policy.h"

namespace kvpool::core {
namespace {

using kvpool::testing::describe;
using kvpool::testing::is;
using kvpool::testing::ok;

using Kind = PublishResult::Kind;

// Test hashes: distinct ids give distinct hashes.
BlockHash H(uint64_t id) {
  return BlockHash{0xC0FFEE00ull + id, id * 0x9E3779B97F4A7C15ull};
}

PoolOptions opts(uint32_t pages) {
  PoolOptions o;
  o.num_pages = pages;
  o.index_seed = 42;
  return o;
}

// The pages in the eviction queue, first victim first.
std::vector<PageId> queue_of(const PagePool& pool) {
  std::vector<PageId> out;
  pool.policy().for_each_queued([&](PageId p) { out.push_back(p); });
  return out;
}

// Everything the pool shows from outside, flattened: stats, counters, every page's state and
// refcount, what each listed owner holds of every page, and the eviction queue in order.
std::vector<uint64_t> snapshot(const PagePool& pool, const std::vector<OwnerId>& owners) {
  const PoolStats s = pool.stats();
  const PoolCounters& c = s.counters;
  std::vector<uint64_t> out = {s.total,     s.free,          s.in_use,     s.cached,    s.owners,
                               c.lookups,   c.lookup_blocks, c.hit_blocks, c.allocated, c.released,
                               c.published, c.duplicates,    c.evicted,    c.flushed};
  for (PageId p = 0; p < pool.num_pages(); ++p) {
    out.push_back(static_cast<uint64_t>(pool.state(p)));
    out.push_back(pool.refcount(p));
    for (const OwnerId o : owners)
      out.push_back(pool.held(o, p));
  }
  out.push_back(UINT64_MAX);
  for (const PageId p : queue_of(pool))
    out.push_back(p);
  return out;
}

// Allocates n pages that the scenario needs; throws (failing the test, which gtest reports) when
// the pool refuses, so that no scenario goes on with page ids it does not have.
std::vector<PageId> alloc(PagePool& pool, OwnerId owner, size_t n) {
  std::vector<PageId> out(n, kNoPage);
  const Status s = pool.alloc(owner, out);
  if (!s.ok()) throw std::runtime_error("alloc of " + std::to_string(n) + ": " + s.message());
  return out;
}

Status retain(PagePool& pool, OwnerId owner, const std::vector<PageId>& pages) {
  return pool.retain(owner, pages);
}

Status release(PagePool& pool, OwnerId owner, const std::vector<PageId>& pages) {
  return pool.release(owner, pages);
}

struct Published {
  Status status;
  std::vector<PublishResult> results;
};

// items: (page, hash id).
Published publish(PagePool& pool, OwnerId owner, Namespace ns,
                  const std::vector<std::pair<PageId, uint64_t>>& items) {
  std::vector<PublishItem> in;
  for (const auto& [page, id] : items)
    in.push_back(PublishItem{page, H(id)});
  Published r;
  r.results.resize(in.size());
  r.status = pool.publish(owner, ns, in, r.results);
  return r;
}

// Publishes each (page, hash id) and expects every one stored.
void publish_stored(PagePool& pool, OwnerId owner, Namespace ns,
                    const std::vector<std::pair<PageId, uint64_t>>& items) {
  const Published r = publish(pool, owner, ns, items);
  ASSERT_TRUE(ok(r.status));
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(r.results[i].kind, Kind::stored) << "item " << i;
    EXPECT_EQ(r.results[i].page, items[i].first) << "item " << i;
  }
}

struct Found {
  Status status;
  uint32_t hits = 0;
  std::vector<PageId> pages;  // out[0..hits)
};

Found lookup(PagePool& pool, OwnerId owner, Namespace ns, const std::vector<uint64_t>& ids,
             size_t out_size = SIZE_MAX) {
  std::vector<BlockHash> chain;
  for (const uint64_t id : ids)
    chain.push_back(H(id));
  std::vector<PageId> out(out_size == SIZE_MAX ? chain.size() : out_size, kNoPage);
  Found f;
  f.hits = 12345;
  f.status = pool.lookup(owner, ns, chain, out, f.hits);
  if (f.hits <= out.size()) f.pages.assign(out.begin(), out.begin() + f.hits);
  return f;
}

// ---------------------------------------------------------------------------------------------

TEST(PagePool, ConstructionChecksThePageCount) {
  EXPECT_THROW({ PagePool bad(opts(0)); }, std::invalid_argument);
  EXPECT_THROW({ PagePool bad(opts(kMaxPages + 1)); }, std::invalid_argument);

  PagePool pool(opts(8));
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.total, 8u);
  EXPECT_EQ(s.free, 8u);
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.owners, 0u);
  EXPECT_EQ(pool.num_pages(), 8u);
  EXPECT_EQ(pool.policy().name(), "lru");
  for (PageId p = 0; p < 8; ++p) {
    EXPECT_TRUE(pool.valid_page(p));
    EXPECT_EQ(pool.state(p), PageState::free);
    EXPECT_EQ(pool.refcount(p), 0u);
  }
  EXPECT_FALSE(pool.valid_page(8));
  EXPECT_FALSE(pool.valid_page(kNoPage));
  EXPECT_EQ(pool.check_invariants(), "");

  // A policy passed in is the one used.
  PoolOptions o = opts(4);
  o.policy = std::make_unique<LruPolicy>();
  const EvictionPolicy* given = o.policy.get();
  PagePool with_policy(std::move(o));
  EXPECT_EQ(&with_policy.policy(), given);
  EXPECT_EQ(with_policy.check_invariants(), "");
}

TEST(PagePool, OwnersOpenWithDistinctIds) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const OwnerId c = pool.open_owner();
  EXPECT_EQ(std::set<OwnerId>({a, b, c}).size(), 3u);
  EXPECT_EQ(pool.stats().owners, 3u);
  ASSERT_TRUE(ok(pool.close_owner(b)));
  EXPECT_EQ(pool.stats().owners, 2u);
  const OwnerId d = pool.open_owner();
  EXPECT_NE(d, a);
  EXPECT_NE(d, c);
  EXPECT_EQ(pool.stats().owners, 3u);
  // A reopened id starts with an empty ledger.
  EXPECT_TRUE(ok(pool.release(d, std::vector<PageId>{})));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, AllocHandsOutDistinctPagesWithOneReference) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> pa = alloc(pool, a, 5);
  const std::vector<PageId> pb = alloc(pool, b, 3);
  std::set<PageId> all(pa.begin(), pa.end());
  all.insert(pb.begin(), pb.end());
  EXPECT_EQ(all.size(), 8u);
  for (const PageId p : pa) {
    ASSERT_TRUE(pool.valid_page(p));
    EXPECT_EQ(pool.state(p), PageState::in_use);
    EXPECT_EQ(pool.refcount(p), 1u);
    EXPECT_EQ(pool.held(a, p), 1u);
    EXPECT_EQ(pool.held(b, p), 0u);
  }
  for (const PageId p : pb) {
    EXPECT_EQ(pool.refcount(p), 1u);
    EXPECT_EQ(pool.held(b, p), 1u);
    EXPECT_EQ(pool.held(a, p), 0u);
  }
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.free, 0u);
  EXPECT_EQ(s.in_use, 8u);
  EXPECT_EQ(s.counters.allocated, 8u);
  EXPECT_EQ(pool.check_invariants(), "");

  // Zero pages: succeeds and changes nothing.
  const std::vector<uint64_t> before = snapshot(pool, {a, b});
  EXPECT_TRUE(ok(pool.alloc(a, std::span<PageId>{})));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
}

TEST(PagePool, AllocBeyondCapacityChangesNothing) {
  PagePool pool(opts(6));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);
  publish_stored(pool, a, 1, {{p[0], 0}});
  ASSERT_TRUE(ok(release(pool, a, {p[0]})));  // one CACHED, two IN_USE, three FREE
  const std::vector<uint64_t> before = snapshot(pool, {a});

  for (const size_t n : {size_t{7}, size_t{100}}) {
    std::vector<PageId> out(n, kNoPage);
    EXPECT_TRUE(is(pool.alloc(a, out), Status(Errc::exceeds_capacity, kNoItem, n)));
    EXPECT_EQ(snapshot(pool, {a}), before);
    EXPECT_EQ(pool.check_invariants(), "");
  }
  // Exactly the pool's size is not "beyond capacity", only unavailable now.
  std::vector<PageId> six(6, kNoPage);
  EXPECT_TRUE(is(pool.alloc(a, six), Status(Errc::out_of_pages, kNoItem, 6)));
  EXPECT_EQ(snapshot(pool, {a}), before);
}

TEST(PagePool, AdmitAllocCountsWhatAnElasticPoolCouldGrowBy) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> held = alloc(pool, a, 6);  // 2 FREE
  const std::vector<uint64_t> before = snapshot(pool, {a});
  CallHints none;
  // A pool of 8 that may reach 32 and could grow by 10 now: 12 pages are within reach.
  EXPECT_TRUE(ok(pool.admit_alloc(12, none, 32, 10)));
  EXPECT_TRUE(is(pool.admit_alloc(13, none, 32, 10), Status(Errc::out_of_pages, kNoItem, 13)));
  EXPECT_TRUE(is(pool.admit_alloc(33, none, 32, 10), Status(Errc::exceeds_capacity, kNoItem, 33)));
  // A pin past the account's limit is refused before anything else happens.
  CallHints pinned;
  pinned.hints.pin_ttl_ms = 1000;
  pinned.pin_limit = 3;
  EXPECT_TRUE(
      is(pool.admit_alloc(4, pinned, 32, 10), Status(Errc::pin_limit_exceeded, kNoItem, 4)));
  EXPECT_TRUE(ok(pool.admit_alloc(3, pinned, 32, 10)));
  EXPECT_EQ(snapshot(pool, {a}), before);
}

// Release order is eviction order (page_pool.h): a chain released tail first loses its tail to
// evict(1) and keeps a 4-block prefix; released head first it loses its head, and the four tails
// behind it can no longer be reached by a lookup. Under every policy; SequenceCache and the
// Python release() of a sequence release tail first for this reason.
TEST(PagePool, ReleaseOrderIsEvictionOrderForAChain) {
  for (const char* policy : {"lru", "prefix", "s3fifo"}) {
    for (const bool tail_first : {true, false}) {
      PoolOptions o = opts(8);
      o.policy = make_policy(policy);
      PagePool pool(std::move(o));
      const OwnerId a = pool.open_owner();
      const std::vector<PageId> p = alloc(pool, a, 5);
      publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {p[3], 3}, {p[4], 4}});
      std::vector<PageId> order = p;
      if (tail_first) std::reverse(order.begin(), order.end());
      ASSERT_TRUE(ok(release(pool, a, order)));
      ASSERT_EQ(pool.evict(1), 1u);
      const Found f = lookup(pool, a, 1, {0, 1, 2, 3, 4});
      ASSERT_TRUE(ok(f.status));
      EXPECT_EQ(f.hits, tail_first ? 4u : 0u) << policy << (tail_first ? " tail" : " head")
                                             << " first";
    }
  }
}

TEST(PagePool, AllocBeyondFreePlusCachedChangesNothing) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> held = alloc(pool, a, 5);
  const std::vector<PageId> c = alloc(pool, b, 2);
  publish_stored(pool, b, 1, {{c[0], 10}, {c[1], 11}});
  ASSERT_TRUE(ok(release(pool, b, {c[1], c[0]})));  // 2 CACHED, 1 FREE, 5 IN_USE
  ASSERT_EQ(pool.stats().free, 1u);
  ASSERT_EQ(pool.stats().cached, 2u);
  const std::vector<uint64_t> before = snapshot(pool, {a, b});

  std::vector<PageId> four(4, kNoPage);
  const Status s = pool.alloc(b, four);
  EXPECT_TRUE(is(s, Status(Errc::out_of_pages, kNoItem, 4)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(pool.check_invariants(), "");
  // The cached pages are still there: a lookup finds both.
  const Found f = lookup(pool, a, 1, {10, 11});
  EXPECT_TRUE(ok(f.status));
  EXPECT_EQ(f.pages, c);
  ASSERT_TRUE(ok(release(pool, a, {c[1], c[0]})));

  // Free + cached is enough: succeeds, evicting both cached pages.
  const std::vector<PageId> three = alloc(pool, b, 3);
  EXPECT_EQ(pool.stats().counters.evicted, 2u);
  EXPECT_EQ(pool.stats().free, 0u);
  EXPECT_EQ(pool.stats().cached, 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, AllocTakesFreePagesFirstThenEvictsLeastRecentlyReleased) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 4);
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {p[3], 3}});
  ASSERT_TRUE(ok(release(pool, a, {p[2], p[0], p[3], p[1]})));
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[2], p[0], p[3], p[1]}));
  EXPECT_EQ(pool.check_invariants(), "");

  // No FREE page left: the least recently released CACHED page goes.
  EXPECT_EQ(alloc(pool, b, 1), (std::vector<PageId>{p[2]}));
  EXPECT_EQ(pool.stats().counters.evicted, 1u);
  EXPECT_EQ(pool.refcount(p[2]), 1u);
  EXPECT_EQ(pool.held(b, p[2]), 1u);
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[0], p[3], p[1]}));
  // Its hash went with it: not found any more, and the page takes a new hash.
  EXPECT_EQ(lookup(pool, a, 1, {2}).hits, 0u);
  publish_stored(pool, b, 1, {{p[2], 20}});
  EXPECT_EQ(pool.check_invariants(), "");

  EXPECT_EQ(alloc(pool, b, 2), (std::vector<PageId>{p[0], p[3]}));
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[1]}));
  EXPECT_EQ(pool.stats().counters.evicted, 3u);

  // Two of b's pages go FREE (never published), the third CACHED: now alloc takes the two
  // FREE pages before the older CACHED p[1], and then p[1] before the newer p[2].
  ASSERT_TRUE(ok(release(pool, b, {p[0], p[2], p[3]})));
  EXPECT_EQ(pool.state(p[0]), PageState::free);
  EXPECT_EQ(pool.state(p[3]), PageState::free);
  EXPECT_EQ(pool.state(p[2]), PageState::cached);
  const std::vector<PageId> got = alloc(pool, b, 3);
  EXPECT_EQ(std::set<PageId>(got.begin(), got.begin() + 2), (std::set<PageId>{p[0], p[3]}));
  EXPECT_EQ(got[2], p[1]);
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[2]}));
  EXPECT_EQ(pool.stats().counters.evicted, 4u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, RetainAndReleaseCount) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> pq = alloc(pool, a, 2);
  const PageId p = pq[0];
  const PageId q = pq[1];
  ASSERT_TRUE(ok(retain(pool, a, {p, p, q})));
  EXPECT_EQ(pool.refcount(p), 3u);
  EXPECT_EQ(pool.held(a, p), 3u);
  EXPECT_EQ(pool.refcount(q), 2u);
  EXPECT_EQ(pool.held(a, q), 2u);
  EXPECT_TRUE(ok(retain(pool, a, {})));
  EXPECT_EQ(pool.check_invariants(), "");

  ASSERT_TRUE(ok(release(pool, a, {p, q})));
  EXPECT_EQ(pool.refcount(p), 2u);
  EXPECT_EQ(pool.refcount(q), 1u);
  EXPECT_EQ(pool.state(q), PageState::in_use);
  ASSERT_TRUE(ok(release(pool, a, {q, p})));
  EXPECT_EQ(pool.state(q), PageState::free);  // unpublished: FREE on the last release
  EXPECT_EQ(pool.held(a, q), 0u);
  EXPECT_EQ(pool.refcount(p), 1u);
  EXPECT_EQ(pool.stats().counters.released, 4u);
  ASSERT_TRUE(ok(release(pool, a, {p})));
  EXPECT_EQ(pool.state(p), PageState::free);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.free, 4u);
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.counters.released, 5u);
  EXPECT_TRUE(ok(release(pool, a, {})));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, RetainErrorsChangeNothing) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  const PageId theirs = alloc(pool, b, 1)[0];
  const PageId free_page = 7;
  ASSERT_EQ(pool.state(free_page), PageState::free);
  const std::vector<uint64_t> before = snapshot(pool, {a, b});

  EXPECT_TRUE(is(retain(pool, a, {p, theirs}), Status(Errc::not_held, 1, theirs)));
  EXPECT_TRUE(is(retain(pool, a, {free_page}), Status(Errc::not_held, 0, free_page)));
  EXPECT_TRUE(is(retain(pool, a, {p, p, 8}), Status(Errc::invalid_page, 2, 8)));
  EXPECT_TRUE(is(retain(pool, a, {kNoPage, p}), Status(Errc::invalid_page, 0, kNoPage)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(pool.refcount(p), 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

// share(): a reference on a page another owner holds (the remote tier keeps a published page so
// while its bytes are written out); never on a page no one holds, whose bytes may be reused.
TEST(PagePool, ShareTakesAReferenceOnlyOnAPageSomeoneHolds) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId tier = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  const PageId free_page = 7;
  std::vector<PublishResult> out(1);
  const PublishItem item{p, H(1)};
  ASSERT_TRUE(ok(pool.publish(a, 1, std::span(&item, 1), out)));
  ASSERT_TRUE(ok(pool.share(tier, p)));
  EXPECT_EQ(pool.refcount(p), 2u);
  EXPECT_EQ(pool.held(tier, p), 1u);
  // The worker lets go: the tier's reference keeps the page in use, so nothing evicts it.
  ASSERT_TRUE(ok(release(pool, a, {p})));
  EXPECT_EQ(pool.state(p), PageState::in_use);
  EXPECT_EQ(pool.evict(8), 0u);
  ASSERT_TRUE(ok(release(pool, tier, {p})));
  EXPECT_EQ(pool.state(p), PageState::cached);
  // Cached, free, out of range, an unknown owner: refused, nothing changes.
  const std::vector<uint64_t> before = snapshot(pool, {a, tier});
  EXPECT_TRUE(is(pool.share(tier, p), Status(Errc::not_held, 0, p)));
  EXPECT_TRUE(is(pool.share(tier, free_page), Status(Errc::not_held, 0, free_page)));
  EXPECT_TRUE(is(pool.share(tier, 8), Status(Errc::invalid_page, 0, 8)));
  EXPECT_EQ(pool.share(999, p).code(), Errc::invalid_owner);
  EXPECT_EQ(snapshot(pool, {a, tier}), before);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, ReleaseOfPagesNotHeldFails) {
  PagePool pool(opts(16));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  const PageId theirs = alloc(pool, b, 1)[0];
  const std::vector<uint64_t> before = snapshot(pool, {a, b});

  EXPECT_TRUE(is(release(pool, a, {theirs}), Status(Errc::not_held, 0, theirs)));
  EXPECT_TRUE(is(release(pool, a, {13}), Status(Errc::not_held, 0, 13)));  // a FREE page
  EXPECT_TRUE(is(release(pool, a, {p, theirs}), Status(Errc::not_held, 1, theirs)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(pool.check_invariants(), "");

  // Double release: the second finds nothing held.
  ASSERT_TRUE(ok(release(pool, a, {p})));
  const std::vector<uint64_t> after_first = snapshot(pool, {a, b});
  EXPECT_TRUE(is(release(pool, a, {p}), Status(Errc::not_held, 0, p)));
  EXPECT_EQ(snapshot(pool, {a, b}), after_first);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, ReleaseListingAPageMoreOftenThanHeldChangesNothing) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> pq = alloc(pool, a, 2);
  const PageId p = pq[0];
  const PageId q = pq[1];
  ASSERT_TRUE(ok(retain(pool, a, {p})));  // p held twice, q once
  const std::vector<uint64_t> before = snapshot(pool, {a});

  EXPECT_TRUE(is(release(pool, a, {p, p, p}), Status(Errc::not_held, 2, p)));
  EXPECT_EQ(pool.held(a, p), 2u);
  EXPECT_TRUE(is(release(pool, a, {p, q, p, q}), Status(Errc::not_held, 3, q)));
  EXPECT_EQ(pool.held(a, p), 2u);
  EXPECT_EQ(pool.held(a, q), 1u);
  EXPECT_TRUE(is(release(pool, a, {q, p, p, q, p}), Status(Errc::not_held, 3, q)));
  EXPECT_EQ(snapshot(pool, {a}), before);
  EXPECT_EQ(pool.check_invariants(), "");

  // The restored ledger still works: exactly what is held can be released.
  ASSERT_TRUE(ok(release(pool, a, {p, q, p})));
  EXPECT_EQ(pool.held(a, p), 0u);
  EXPECT_EQ(pool.held(a, q), 0u);
  EXPECT_EQ(pool.stats().free, 8u);
  EXPECT_EQ(pool.stats().counters.released, 3u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, FailedReleaseKeepsTheOrderInWhichPagesWereTaken) {
  // close_owner releases newest first. A failed release takes entries out of the ledger and puts
  // them back; they must come back with their original stamps (not as newly taken pages), or
  // close_owner would release in the wrong order.
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const PageId first = alloc(pool, a, 1)[0];
  const PageId second = alloc(pool, a, 1)[0];
  const PageId third = alloc(pool, a, 1)[0];
  ASSERT_TRUE(ok(retain(pool, a, {second})));
  publish_stored(pool, a, 1, {{first, 1}, {second, 2}, {third, 3}});
  EXPECT_TRUE(is(release(pool, a, {first, second, second, third, third}),
                 Status(Errc::not_held, 4, third)));
  EXPECT_EQ(pool.held(a, second), 2u);
  ASSERT_TRUE(ok(pool.close_owner(a)));
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{third, second, first}));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, InvalidPageIdsAreReportedWithTheirItem) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 2);
  const std::vector<uint64_t> before = snapshot(pool, {a});

  EXPECT_TRUE(is(release(pool, a, {p[0], 8}), Status(Errc::invalid_page, 1, 8)));
  EXPECT_TRUE(is(release(pool, a, {kNoPage}), Status(Errc::invalid_page, 0, kNoPage)));
  EXPECT_TRUE(is(release(pool, a, {p[0], p[1], 1000}), Status(Errc::invalid_page, 2, 1000)));
  EXPECT_TRUE(is(retain(pool, a, {p[1], kNoPage}), Status(Errc::invalid_page, 1, kNoPage)));
  EXPECT_TRUE(is(retain(pool, a, {9}), Status(Errc::invalid_page, 0, 9)));
  EXPECT_TRUE(
      is(publish(pool, a, 1, {{p[0], 1}, {8, 2}}).status, Status(Errc::invalid_page, 1, 8)));
  EXPECT_TRUE(
      is(publish(pool, a, 1, {{kNoPage, 1}}).status, Status(Errc::invalid_page, 0, kNoPage)));
  EXPECT_EQ(snapshot(pool, {a}), before);
  // Nothing was published: released, the pages go FREE rather than CACHED.
  ASSERT_TRUE(ok(release(pool, a, p)));
  EXPECT_EQ(pool.stats().free, 8u);
  EXPECT_EQ(pool.stats().counters.published, 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, InvalidOrClosedOwnerFailsEveryOperation) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId c = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{p, 1}});
  const PageId q = alloc(pool, c, 1)[0];
  ASSERT_TRUE(ok(pool.close_owner(c)));
  EXPECT_EQ(pool.state(q), PageState::free);
  const std::vector<uint64_t> before = snapshot(pool, {a});

  for (const OwnerId bad : {c, OwnerId{7}, OwnerId{kNoPage}}) {
    SCOPED_TRACE(bad);
    const Status want(Errc::invalid_owner, kNoItem, bad);
    std::vector<PageId> one(1, kNoPage);
    EXPECT_TRUE(is(pool.alloc(bad, one), want));
    EXPECT_TRUE(is(retain(pool, bad, {p}), want));
    EXPECT_TRUE(is(release(pool, bad, {p}), want));
    const Found f = lookup(pool, bad, 1, {1});
    EXPECT_TRUE(is(f.status, want));
    EXPECT_EQ(f.hits, 0u);
    EXPECT_TRUE(is(publish(pool, bad, 1, {{p, 2}}).status, want));
    EXPECT_TRUE(is(pool.close_owner(bad), want));
    EXPECT_EQ(pool.held(bad, p), 0u);
    EXPECT_EQ(snapshot(pool, {a}), before);
  }
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, PublishOfAPageNotHeldFails) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId mine = alloc(pool, a, 1)[0];
  const PageId theirs = alloc(pool, b, 1)[0];
  const std::vector<uint64_t> before = snapshot(pool, {a, b});
  EXPECT_TRUE(
      is(publish(pool, a, 1, {{mine, 1}, {theirs, 2}}).status, Status(Errc::not_held, 1, theirs)));
  EXPECT_TRUE(is(publish(pool, a, 1, {{6, 3}}).status, Status(Errc::not_held, 0, 6)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  // Neither hash went in: b cannot find them.
  EXPECT_EQ(lookup(pool, b, 1, {1}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 1, {2}).hits, 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, PublishStoresAndReleasedPagesBecomeCachedAndFindable) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);
  publish_stored(pool, a, 1, {{p[0], 100}, {p[1], 101}});
  EXPECT_EQ(pool.stats().counters.published, 2u);
  EXPECT_EQ(pool.state(p[0]), PageState::in_use);  // hashed but still in use
  EXPECT_EQ(pool.stats().cached, 0u);
  EXPECT_EQ(pool.check_invariants(), "");

  ASSERT_TRUE(ok(release(pool, a, {p[1], p[0], p[2]})));
  EXPECT_EQ(pool.state(p[0]), PageState::cached);
  EXPECT_EQ(pool.state(p[1]), PageState::cached);
  EXPECT_EQ(pool.state(p[2]), PageState::free);
  EXPECT_EQ(pool.stats().cached, 2u);
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[1], p[0]}));

  const Found f = lookup(pool, b, 1, {100, 101, 102});
  EXPECT_TRUE(ok(f.status));
  EXPECT_EQ(f.hits, 2u);
  EXPECT_EQ(f.pages, (std::vector<PageId>{p[0], p[1]}));
  EXPECT_EQ(pool.held(b, p[0]), 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, PublishOutputTooSmallIsInvalidArgument) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 2);
  const std::vector<uint64_t> before = snapshot(pool, {a});
  const std::vector<PublishItem> items = {{p[0], H(1)}, {p[1], H(2)}};
  std::vector<PublishResult> out(1);
  EXPECT_TRUE(is(pool.publish(a, 1, items, out), Status(Errc::invalid_argument, kNoItem, 1)));
  EXPECT_EQ(snapshot(pool, {a}), before);
  EXPECT_TRUE(ok(pool.publish(a, 1, std::span<const PublishItem>{}, std::span<PublishResult>{})));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, DuplicatePublishRetainsTheExistingPage) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId pa = alloc(pool, a, 1)[0];
  const PageId pb = alloc(pool, b, 1)[0];
  publish_stored(pool, a, 1, {{pa, 7}});

  const Published r = publish(pool, b, 1, {{pb, 7}});
  ASSERT_TRUE(ok(r.status));
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_EQ(r.results[0].kind, Kind::duplicate);
  EXPECT_EQ(r.results[0].page, pa);
  EXPECT_EQ(pool.refcount(pa), 2u);
  EXPECT_EQ(pool.held(b, pa), 1u);
  EXPECT_EQ(pool.held(a, pa), 1u);
  EXPECT_EQ(pool.held(b, pb), 1u);  // b still holds its own copy, unpublished
  EXPECT_EQ(pool.stats().counters.published, 1u);
  EXPECT_EQ(pool.stats().counters.duplicates, 1u);
  EXPECT_EQ(pool.check_invariants(), "");

  // b drops its copy: it was never published, so it goes FREE.
  ASSERT_TRUE(ok(release(pool, b, {pb})));
  EXPECT_EQ(pool.state(pb), PageState::free);

  // The shared page outlives a's reference; b's is enough to keep it in use.
  ASSERT_TRUE(ok(release(pool, a, {pa})));
  EXPECT_EQ(pool.state(pa), PageState::in_use);
  ASSERT_TRUE(ok(release(pool, b, {pa})));
  EXPECT_EQ(pool.state(pa), PageState::cached);

  // A duplicate of a CACHED page takes it back into use and out of the eviction queue.
  const PageId pc = alloc(pool, b, 1)[0];
  const Published r2 = publish(pool, b, 1, {{pc, 7}});
  ASSERT_TRUE(ok(r2.status));
  EXPECT_EQ(r2.results[0].kind, Kind::duplicate);
  EXPECT_EQ(r2.results[0].page, pa);
  EXPECT_EQ(pool.state(pa), PageState::in_use);
  EXPECT_EQ(pool.refcount(pa), 1u);
  EXPECT_EQ(pool.held(b, pa), 1u);
  EXPECT_TRUE(queue_of(pool).empty());
  EXPECT_EQ(pool.stats().cached, 0u);
  EXPECT_EQ(pool.stats().counters.duplicates, 2u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, OneBatchCanStoreAHashAndThenDuplicateIt) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);
  const Published r = publish(pool, a, 1, {{p[0], 5}, {p[1], 5}, {p[2], 6}});
  ASSERT_TRUE(ok(r.status));
  EXPECT_EQ(r.results[0].kind, Kind::stored);
  EXPECT_EQ(r.results[0].page, p[0]);
  EXPECT_EQ(r.results[1].kind, Kind::duplicate);
  EXPECT_EQ(r.results[1].page, p[0]);
  EXPECT_EQ(r.results[2].kind, Kind::stored);
  EXPECT_EQ(pool.held(a, p[0]), 2u);
  EXPECT_EQ(pool.refcount(p[0]), 2u);
  EXPECT_EQ(pool.stats().counters.published, 2u);
  EXPECT_EQ(pool.stats().counters.duplicates, 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, SamePageTwiceInOneBatchIsDuplicateItem) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 2);
  const std::vector<uint64_t> before = snapshot(pool, {a, b});
  EXPECT_TRUE(is(publish(pool, a, 1, {{p[0], 1}, {p[1], 2}, {p[0], 3}}).status,
                 Status(Errc::duplicate_item, 2, p[0])));
  // Even with the same hash both times.
  EXPECT_TRUE(is(publish(pool, a, 1, {{p[1], 4}, {p[1], 4}}).status,
                 Status(Errc::duplicate_item, 1, p[1])));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(lookup(pool, b, 1, {1}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 1, {2}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 1, {4}).hits, 0u);

  // The failed batches leave no mark behind: each page can be published once per call again.
  publish_stored(pool, a, 1, {{p[0], 1}, {p[1], 2}});
  publish_stored(pool, a, 1, {{p[0], 1}});
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, RepublishingTheSameHashIsANoOpAndAnotherHashFails) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{p, 1}});
  const std::vector<uint64_t> before = snapshot(pool, {a, b});

  publish_stored(pool, a, 1, {{p, 1}});
  EXPECT_EQ(snapshot(pool, {a, b}), before);  // published counter unchanged too

  EXPECT_TRUE(is(publish(pool, a, 1, {{p, 2}}).status, Status(Errc::already_published, 0, p)));
  EXPECT_TRUE(is(publish(pool, a, 2, {{p, 1}}).status, Status(Errc::already_published, 0, p)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(lookup(pool, b, 1, {2}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 2, {1}).hits, 0u);

  // Another owner that retained the page may republish its hash too (no-op).
  const Found f = lookup(pool, b, 1, {1});
  ASSERT_EQ(f.pages, (std::vector<PageId>{p}));
  const Published r = publish(pool, b, 1, {{p, 1}});
  ASSERT_TRUE(ok(r.status));
  EXPECT_EQ(r.results[0].kind, Kind::stored);
  EXPECT_EQ(r.results[0].page, p);
  EXPECT_EQ(pool.refcount(p), 2u);
  EXPECT_EQ(pool.stats().counters.published, 1u);
  EXPECT_EQ(pool.stats().counters.duplicates, 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, FailedPublishRetainsNothing) {
  // A batch that would answer `duplicate` for its first item and then fails must not have
  // retained the existing page for the caller.
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId pa = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{pa, 9}});
  ASSERT_TRUE(ok(release(pool, a, {pa})));
  const std::vector<PageId> pb = alloc(pool, b, 2);
  const std::vector<uint64_t> before = snapshot(pool, {a, b});
  EXPECT_TRUE(is(publish(pool, b, 1, {{pb[0], 9}, {pb[1], 10}, {3, 11}}).status,
                 Status(Errc::not_held, 2, 3)));
  EXPECT_EQ(snapshot(pool, {a, b}), before);
  EXPECT_EQ(pool.state(pa), PageState::cached);
  EXPECT_EQ(pool.held(b, pa), 0u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, LookupReturnsTheLongestCachedPrefix) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 4);
  publish_stored(pool, a, 1, {{p[0], 10}, {p[1], 11}, {p[2], 12}, {p[3], 13}});
  ASSERT_TRUE(ok(release(pool, a, {p[3], p[2], p[1], p[0]})));

  const Found f = lookup(pool, b, 1, {10, 11, 12, 13, 14, 15});
  EXPECT_TRUE(ok(f.status));
  EXPECT_EQ(f.hits, 4u);
  EXPECT_EQ(f.pages, p);
  PoolCounters c = pool.stats().counters;
  EXPECT_EQ(c.lookups, 1u);
  EXPECT_EQ(c.lookup_blocks, 6u);
  EXPECT_EQ(c.hit_blocks, 4u);

  // A chain that starts with an unknown hash finds nothing, however much of the rest is cached.
  const Found miss = lookup(pool, b, 1, {99, 10, 11});
  EXPECT_TRUE(ok(miss.status));
  EXPECT_EQ(miss.hits, 0u);
  // An empty chain is a lookup with no blocks.
  const Found empty = lookup(pool, b, 1, {});
  EXPECT_TRUE(ok(empty.status));
  EXPECT_EQ(empty.hits, 0u);
  c = pool.stats().counters;
  EXPECT_EQ(c.lookups, 3u);
  EXPECT_EQ(c.lookup_blocks, 9u);
  EXPECT_EQ(c.hit_blocks, 4u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, LookupStopsAtTheFirstMiss) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 4);
  // Hash 12 is never published: 10, 11, _, 13, 14.
  publish_stored(pool, a, 1, {{p[0], 10}, {p[1], 11}, {p[2], 13}, {p[3], 14}});
  ASSERT_TRUE(ok(release(pool, a, p)));

  const Found f = lookup(pool, b, 1, {10, 11, 12, 13, 14});
  EXPECT_TRUE(ok(f.status));
  EXPECT_EQ(f.hits, 2u);
  EXPECT_EQ(f.pages, (std::vector<PageId>{p[0], p[1]}));
  // The cached pages past the miss were not touched.
  EXPECT_EQ(pool.state(p[2]), PageState::cached);
  EXPECT_EQ(pool.state(p[3]), PageState::cached);
  EXPECT_EQ(pool.held(b, p[2]), 0u);
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[2], p[3]}));
  EXPECT_EQ(pool.stats().counters.hit_blocks, 2u);
  EXPECT_EQ(pool.stats().counters.lookup_blocks, 5u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, LookupRetainsHitsAndTakesThemOutOfTheEvictionQueue) {
  PagePool pool(opts(3));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);
  publish_stored(pool, a, 1, {{p[0], 1}, {p[1], 2}, {p[2], 3}});
  ASSERT_TRUE(ok(release(pool, a, {p[2], p[1], p[0]})));
  ASSERT_EQ(pool.stats().cached, 3u);

  const Found f = lookup(pool, b, 1, {1, 2});
  ASSERT_EQ(f.pages, (std::vector<PageId>{p[0], p[1]}));
  for (const PageId q : f.pages) {
    EXPECT_EQ(pool.state(q), PageState::in_use);
    EXPECT_EQ(pool.refcount(q), 1u);
    EXPECT_EQ(pool.held(b, q), 1u);
  }
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{p[2]}));
  PoolStats s = pool.stats();
  EXPECT_EQ(s.cached, 1u);
  EXPECT_EQ(s.in_use, 2u);
  EXPECT_EQ(pool.check_invariants(), "");

  // The retained pages cannot be evicted: only one page is available.
  std::vector<PageId> two(2, kNoPage);
  EXPECT_TRUE(is(pool.alloc(a, two), Status(Errc::out_of_pages, kNoItem, 2)));
  EXPECT_EQ(alloc(pool, a, 1), (std::vector<PageId>{p[2]}));

  // A second lookup of an in-use page adds a reference.
  const Found again = lookup(pool, a, 1, {1});
  ASSERT_EQ(again.pages, (std::vector<PageId>{p[0]}));
  EXPECT_EQ(pool.refcount(p[0]), 2u);
  EXPECT_EQ(pool.held(a, p[0]), 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, LookupOutputTooSmallIsInvalidArgument) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{p, 1}});
  ASSERT_TRUE(ok(release(pool, a, {p})));
  const std::vector<uint64_t> before = snapshot(pool, {a});
  const Found f = lookup(pool, a, 1, {1, 2, 3}, 2);
  EXPECT_TRUE(is(f.status, Status(Errc::invalid_argument, kNoItem, 2)));
  EXPECT_EQ(f.hits, 0u);
  EXPECT_EQ(snapshot(pool, {a}), before);  // lookups counter included

  // A larger output is fine.
  const Found big = lookup(pool, a, 1, {1, 2}, 5);
  EXPECT_TRUE(ok(big.status));
  EXPECT_EQ(big.pages, (std::vector<PageId>{p}));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, NamespacesIsolate) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const PageId p1 = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{p1, 42}});
  ASSERT_TRUE(ok(release(pool, a, {p1})));

  EXPECT_EQ(lookup(pool, b, 2, {42}).hits, 0u);
  EXPECT_EQ(pool.state(p1), PageState::cached);

  // The same hash in namespace 2 is a new key: stored, not a duplicate of p1.
  const PageId p2 = alloc(pool, b, 1)[0];
  publish_stored(pool, b, 2, {{p2, 42}});
  EXPECT_EQ(pool.stats().counters.duplicates, 0u);
  ASSERT_TRUE(ok(release(pool, b, {p2})));

  const Found in1 = lookup(pool, a, 1, {42});
  const Found in2 = lookup(pool, b, 2, {42});
  EXPECT_EQ(in1.pages, (std::vector<PageId>{p1}));
  EXPECT_EQ(in2.pages, (std::vector<PageId>{p2}));
  EXPECT_EQ(pool.held(a, p2), 0u);
  EXPECT_EQ(pool.held(b, p1), 0u);
  EXPECT_EQ(lookup(pool, a, 3, {42}).hits, 0u);

  // Evicting one namespace's page leaves the other's.
  ASSERT_TRUE(ok(release(pool, a, {p1})));
  EXPECT_EQ(pool.evict(1), 1u);
  EXPECT_EQ(pool.state(p1), PageState::free);
  EXPECT_EQ(lookup(pool, a, 1, {42}).hits, 0u);
  EXPECT_EQ(lookup(pool, a, 2, {42}).pages, (std::vector<PageId>{p2}));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, TailFirstReleaseEvictsTailsBeforeHeads) {
  for (const bool tail_first : {true, false}) {
    SCOPED_TRACE(tail_first ? "tail first" : "head first");
    PagePool pool(opts(4));
    const OwnerId a = pool.open_owner();
    const OwnerId b = pool.open_owner();
    const std::vector<PageId> p = alloc(pool, a, 4);
    publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {p[3], 3}});
    std::vector<PageId> order = p;
    if (tail_first) std::reverse(order.begin(), order.end());
    ASSERT_TRUE(ok(release(pool, a, order)));
    EXPECT_EQ(queue_of(pool), order);

    // One page is needed: the first released goes.
    EXPECT_EQ(alloc(pool, b, 1), (std::vector<PageId>{order[0]}));
    const Found f = lookup(pool, b, 1, {0, 1, 2, 3});
    EXPECT_TRUE(ok(f.status));
    if (tail_first) {
      // The head survived: three blocks of the chain still hit.
      EXPECT_EQ(f.pages, (std::vector<PageId>{p[0], p[1], p[2]}));
    } else {
      // The head went: the cached tail cannot be reached.
      EXPECT_EQ(f.hits, 0u);
      EXPECT_EQ(pool.stats().cached, 3u);
    }
    EXPECT_EQ(pool.check_invariants(), "");
  }
}

TEST(PagePool, FlushDropsOnlyCachedPages) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 6);
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {p[3], 3}});
  ASSERT_TRUE(ok(release(pool, a, {p[0], p[1]})));
  // p0, p1 CACHED; p2, p3 IN_USE hashed; p4, p5 IN_USE unhashed; two FREE.
  EXPECT_EQ(pool.flush(), 2u);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.free, 4u);
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.in_use, 4u);
  EXPECT_EQ(s.counters.flushed, 2u);
  EXPECT_EQ(s.counters.evicted, 0u);
  EXPECT_EQ(pool.state(p[0]), PageState::free);
  EXPECT_EQ(pool.state(p[1]), PageState::free);
  for (size_t i = 2; i < 6; ++i)
    EXPECT_EQ(pool.refcount(p[i]), 1u);
  EXPECT_TRUE(queue_of(pool).empty());
  EXPECT_EQ(pool.check_invariants(), "");

  // The flushed hashes are gone; the in-use hashed pages are still indexed.
  EXPECT_EQ(lookup(pool, b, 1, {0}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 1, {1}).hits, 0u);
  EXPECT_EQ(lookup(pool, b, 1, {2, 3}).pages, (std::vector<PageId>{p[2], p[3]}));
  ASSERT_TRUE(ok(release(pool, b, {p[3], p[2]})));

  // Released, they become CACHED and stay findable.
  ASSERT_TRUE(ok(release(pool, a, {p[3], p[2], p[4], p[5]})));
  EXPECT_EQ(pool.state(p[2]), PageState::cached);
  EXPECT_EQ(pool.state(p[3]), PageState::cached);
  EXPECT_EQ(pool.state(p[4]), PageState::free);
  const OwnerId c = pool.open_owner();
  EXPECT_EQ(lookup(pool, c, 1, {2, 3}).pages, (std::vector<PageId>{p[2], p[3]}));
  ASSERT_TRUE(ok(pool.close_owner(c)));

  // Nothing in use: flush empties the cache entirely. A second flush finds nothing.
  EXPECT_EQ(pool.flush(), 2u);
  EXPECT_EQ(pool.flush(), 0u);
  s = pool.stats();
  EXPECT_EQ(s.free, 8u);
  EXPECT_EQ(s.counters.flushed, 4u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, EvictDropsUpToNInPolicyOrder) {
  PagePool pool(opts(6));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 6);
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {p[3], 3}, {p[4], 4}, {p[5], 5}});
  ASSERT_TRUE(ok(release(pool, a, {p[3], p[1], p[5]})));

  EXPECT_EQ(pool.evict(0), 0u);
  EXPECT_EQ(pool.evict(2), 2u);
  EXPECT_EQ(pool.state(p[3]), PageState::free);
  EXPECT_EQ(pool.state(p[1]), PageState::free);
  EXPECT_EQ(pool.state(p[5]), PageState::cached);
  EXPECT_EQ(pool.stats().counters.evicted, 2u);
  EXPECT_EQ(lookup(pool, a, 1, {3}).hits, 0u);
  EXPECT_EQ(pool.check_invariants(), "");

  // In-use pages are never evicted, hashed or not.
  EXPECT_EQ(pool.evict(100), 1u);
  EXPECT_EQ(pool.evict(1), 0u);
  const PoolStats s = pool.stats();
  EXPECT_EQ(s.free, 3u);
  EXPECT_EQ(s.in_use, 3u);
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.counters.evicted, 3u);
  EXPECT_EQ(s.counters.flushed, 0u);
  EXPECT_EQ(pool.refcount(p[0]), 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, CloseOwnerReleasesEverything) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 4);
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}});
  ASSERT_TRUE(ok(retain(pool, a, {p[0], p[0], p[3]})));
  ASSERT_EQ(lookup(pool, b, 1, {1}).pages, (std::vector<PageId>{p[1]}));  // b shares p1

  ASSERT_TRUE(ok(pool.close_owner(a)));
  EXPECT_EQ(pool.state(p[0]), PageState::cached);  // published: stays cached
  EXPECT_EQ(pool.refcount(p[0]), 0u);
  EXPECT_EQ(pool.state(p[1]), PageState::in_use);  // b still holds it
  EXPECT_EQ(pool.refcount(p[1]), 1u);
  EXPECT_EQ(pool.state(p[2]), PageState::free);  // unpublished
  EXPECT_EQ(pool.state(p[3]), PageState::free);
  for (const PageId q : p)
    EXPECT_EQ(pool.held(a, q), 0u);
  PoolStats s = pool.stats();
  EXPECT_EQ(s.owners, 1u);
  EXPECT_EQ(s.cached, 1u);
  EXPECT_EQ(s.in_use, 1u);
  EXPECT_EQ(s.free, 6u);
  EXPECT_EQ(s.counters.released, 7u);  // 3 on p0, 1 on p1, 1 on p2, 2 on p3
  EXPECT_EQ(pool.check_invariants(), "");

  // The owner is gone.
  const std::vector<uint64_t> before = snapshot(pool, {b});
  std::vector<PageId> one(1, kNoPage);
  EXPECT_TRUE(is(pool.alloc(a, one), Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_TRUE(is(retain(pool, a, {p[1]}), Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_TRUE(is(release(pool, a, {p[1]}), Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_TRUE(is(lookup(pool, a, 1, {0}).status, Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_TRUE(is(publish(pool, a, 1, {{p[1], 1}}).status, Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_TRUE(is(pool.close_owner(a), Status(Errc::invalid_owner, kNoItem, a)));
  EXPECT_EQ(snapshot(pool, {b}), before);

  // The cached page is still findable by others.
  EXPECT_EQ(lookup(pool, b, 1, {0}).pages, (std::vector<PageId>{p[0]}));
  ASSERT_TRUE(ok(pool.close_owner(b)));
  s = pool.stats();
  EXPECT_EQ(s.owners, 0u);
  EXPECT_EQ(s.cached, 2u);
  EXPECT_EQ(s.in_use, 0u);
  EXPECT_EQ(s.counters.released, 9u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, CloseOwnerReleasesNewestFirst) {
  PagePool pool(opts(8));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);  // taken in order p0, p1, p2
  const PageId later = alloc(pool, a, 1)[0];
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}, {p[2], 2}, {later, 3}});
  // More references to an old page do not make it newer.
  ASSERT_TRUE(ok(retain(pool, a, {p[0], p[0]})));
  ASSERT_TRUE(ok(pool.close_owner(a)));
  EXPECT_EQ(queue_of(pool), (std::vector<PageId>{later, p[2], p[1], p[0]}));
  EXPECT_EQ(pool.check_invariants(), "");

  // So a closed session's chain is evicted tail first.
  const OwnerId b = pool.open_owner();
  ASSERT_EQ(alloc(pool, b, 4).size(), 4u);  // the four FREE pages
  EXPECT_EQ(alloc(pool, b, 1), (std::vector<PageId>{later}));
  EXPECT_EQ(lookup(pool, b, 1, {0, 1, 2, 3}).pages, p);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, CountersMoveAsExpected) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const OwnerId b = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 3);
  publish_stored(pool, a, 1, {{p[0], 0}, {p[1], 1}});
  const PageId q = alloc(pool, b, 1)[0];
  ASSERT_TRUE(ok(publish(pool, b, 1, {{q, 0}}).status));  // duplicate of p0
  ASSERT_TRUE(ok(release(pool, a, {p[2], p[1]})));
  ASSERT_EQ(lookup(pool, b, 1, {0, 1, 2}).hits, 2u);
  ASSERT_TRUE(ok(release(pool, b, {p[1]})));
  EXPECT_EQ(pool.evict(5), 1u);  // p1
  ASSERT_TRUE(ok(release(pool, b, {p[0], p[0]})));
  ASSERT_TRUE(ok(release(pool, a, {p[0]})));
  EXPECT_EQ(pool.flush(), 1u);  // p0

  const PoolCounters c = pool.stats().counters;
  EXPECT_EQ(c.allocated, 4u);
  EXPECT_EQ(c.published, 2u);
  EXPECT_EQ(c.duplicates, 1u);
  EXPECT_EQ(c.lookups, 1u);
  EXPECT_EQ(c.lookup_blocks, 3u);
  EXPECT_EQ(c.hit_blocks, 2u);
  EXPECT_EQ(c.released, 6u);
  EXPECT_EQ(c.evicted, 1u);
  EXPECT_EQ(c.flushed, 1u);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(PagePool, HeldIsZeroForUnknownOwnersAndPages) {
  PagePool pool(opts(4));
  const OwnerId a = pool.open_owner();
  const PageId p = alloc(pool, a, 1)[0];
  EXPECT_EQ(pool.held(a, p), 1u);
  EXPECT_EQ(pool.held(a, 4), 0u);
  EXPECT_EQ(pool.held(a, kNoPage), 0u);
  EXPECT_EQ(pool.held(a + 1, p), 0u);
  EXPECT_EQ(pool.held(kNoPage, p), 0u);
}

TEST(PagePool, StatusMessagesNameTheCause) {
  PagePool pool(opts(32));
  const OwnerId a = pool.open_owner();
  const std::vector<PageId> p = alloc(pool, a, 2);

  const Status not_held = release(pool, a, {p[0], 17});
  EXPECT_TRUE(is(not_held, Status(Errc::not_held, 1, 17)));
  EXPECT_NE(not_held.message().find("not_held"), std::string::npos) << not_held.message();
  EXPECT_NE(not_held.message().find("page 17"), std::string::npos) << not_held.message();
  EXPECT_NE(not_held.message().find("item 1"), std::string::npos) << not_held.message();

  const Status bad_page = retain(pool, a, {1234});
  EXPECT_NE(bad_page.message().find("invalid_page"), std::string::npos) << bad_page.message();
  EXPECT_NE(bad_page.message().find("1234"), std::string::npos) << bad_page.message();

  const Status bad_owner = release(pool, 99, {p[0]});
  EXPECT_NE(bad_owner.message().find("invalid_owner"), std::string::npos);
  EXPECT_NE(bad_owner.message().find("99"), std::string::npos) << bad_owner.message();

  publish_stored(pool, a, 1, {{p[1], 1}});
  const Status again = publish(pool, a, 1, {{p[1], 2}}).status;
  EXPECT_NE(again.message().find("already_published"), std::string::npos) << again.message();
  EXPECT_NE(again.message().find("page " + std::to_string(p[1])), std::string::npos);

  std::vector<PageId> many(33, kNoPage);
  const Status too_many = pool.alloc(a, many);
  EXPECT_NE(too_many.message().find("exceeds_capacity"), std::string::npos);
  EXPECT_NE(too_many.message().find("33"), std::string::npos) << too_many.message();
  EXPECT_EQ(pool.check_invariants(), "");
}

}  // namespace
}  // namespace kvpool::core

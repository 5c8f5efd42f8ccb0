// PagePool hints and pins, step by step on small pools with a fake clock: a pinned CACHED page is
// held out of the policy (never a victim; alloc counts it as unavailable), a pin expires once the
// clock reaches it and its page is queued like any other, a later pin extends it and moves its
// charge to the later account, a per-call pin limit per account refuses a call and changes
// nothing, flush drops pinned pages and evict does not, an unpublished page loses its pin and
// class when freed, the priority class is the highest hint since alloc, and the facts the policy
// is told (hits, first, run, priority) follow the pool's documented rules. check_invariants()
// runs after every step.

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/page_pool.h"
#include "daemon/core/prefix_policy.h"
#include "tests/unit/recording_policy.h"
#include "tests/unit/status_assertions.h"

namespace kvpool::core {
namespace {

using kvpool::testing::describe;
using kvpool::testing::is;
using kvpool::testing::ok;

using test::cached_call;
using test::PolicyCall;
using test::RecordingPolicy;
using test::reuse_call;
using test::victim_call;
using Pages = std::vector<PageId>;
using Calls = std::vector<PolicyCall>;
using Kind = PublishResult::Kind;

constexpr Namespace kNs = 3;
constexpr uint32_t kAccounts = 4;

BlockHash H(uint64_t id) {
  return BlockHash{0x9100ull + id, id * 0x9E3779B97F4A7C15ull + 5};
}
uint64_t key(uint64_t id) {
  return contents_key(kNs, H(id));
}

Status limit_exceeded(uint64_t after) {
  return Status(Errc::pin_limit_exceeded, kNoItem, after);
}

CallHints pin(uint32_t ttl_ms, uint32_t account = 0, uint32_t limit = PagePool::kUnlimited,
              Priority priority = Priority::none) {
  CallHints h;
  h.hints.priority = priority;
  h.hints.pin_ttl_ms = ttl_ms;
  h.pin_account = account;
  h.pin_limit = limit;
  return h;
}
CallHints prio(Priority priority) {
  CallHints h;
  h.hints.priority = priority;
  return h;
}
PageFacts facts(uint64_t id, uint8_t hits, bool first, uint32_t run,
                Priority priority = Priority::none) {
  return PageFacts{key(id), hits, priority, first, run};
}

class PagePoolPin : public ::testing::Test {
 protected:
  void make(uint32_t pages, std::string_view policy = "lru") {
    PoolOptions o;
    o.num_pages = pages;
    o.index_seed = 11;
    o.clock_ms = [this] { return now_; };
    auto rec = std::make_unique<RecordingPolicy>(make_policy(policy));
    rec_ = rec.get();
    o.policy = std::move(rec);
    pool_ = std::make_unique<PagePool>(std::move(o));
    a_ = pool_->open_owner();
    b_ = pool_->open_owner();
  }

  void check() { EXPECT_EQ(pool_->check_invariants(), ""); }

  Pages alloc(OwnerId owner, size_t n, const CallHints& hints = {}) {
    Pages out(n, kNoPage);
    const Status s = pool_->alloc(owner, out, hints);
    if (!s.ok()) throw std::runtime_error("alloc of " + std::to_string(n) + ": " + s.message());
    check();
    return out;
  }
  Status try_alloc(OwnerId owner, size_t n, const CallHints& hints = {}) {
    Pages out(n, kNoPage);
    const Status s = pool_->alloc(owner, out, hints);
    check();
    return s;
  }
  Status retain(OwnerId owner, const Pages& pages, const CallHints& hints = {}) {
    const Status s = pool_->retain(owner, pages, hints);
    check();
    return s;
  }
  Status release(OwnerId owner, const Pages& pages) {
    const Status s = pool_->release(owner, pages);
    check();
    return s;
  }
  // items: (page, hash id).
  Status publish(OwnerId owner, const std::vector<std::pair<PageId, uint64_t>>& items,
                 const CallHints& hints = {}, std::vector<PublishResult>* results = nullptr) {
    std::vector<PublishItem> in;
    for (const auto& [page, id] : items)
      in.push_back(PublishItem{page, H(id)});
    std::vector<PublishResult> out(in.size());
    const Status s = pool_->publish(owner, kNs, in, out, PagePool::kUnlimited, hints);
    if (results != nullptr) *results = out;
    check();
    return s;
  }
  // Looks up hash ids; returns the pages found.
  Pages lookup(OwnerId owner, const std::vector<uint64_t>& ids, const CallHints& hints = {},
               Status* status = nullptr) {
    std::vector<BlockHash> chain;
    for (const uint64_t id : ids)
      chain.push_back(H(id));
    Pages out(chain.size(), kNoPage);
    uint32_t hits = 0;
    const Status s = pool_->lookup(owner, kNs, chain, out, hits, PagePool::kUnlimited, hints);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(ok(s));
    }
    check();
    out.resize(hits);
    return out;
  }
  // Allocates n pages, publishes them under ids first_id.. and releases them tail first.
  Pages cache_chain(OwnerId owner, uint64_t first_id, size_t n, const CallHints& hints = {}) {
    const Pages pages = alloc(owner, n, hints);
    std::vector<std::pair<PageId, uint64_t>> items;
    for (size_t i = 0; i < n; ++i)
      items.emplace_back(pages[i], first_id + i);
    EXPECT_TRUE(ok(publish(owner, items)));
    EXPECT_TRUE(ok(release(owner, Pages(pages.rbegin(), pages.rend()))));
    return pages;
  }

  Pages queue() const {
    Pages out;
    pool_->policy().for_each_queued([&](PageId p) { out.push_back(p); });
    return out;
  }

  // Everything the pool shows: stats and counters, pins per account, and per page its state,
  // refcount, holdings, pin and class; then the eviction queue in order.
  std::vector<uint64_t> snapshot() const {
    const PoolStats s = pool_->stats();
    const PoolCounters& c = s.counters;
    std::vector<uint64_t> out = {
        s.total,         s.free,       s.in_use,        s.cached,     s.owners,    s.pinned,
        s.pinned_cached, c.lookups,    c.lookup_blocks, c.hit_blocks, c.allocated, c.released,
        c.published,     c.duplicates, c.evicted,       c.flushed,    c.pins,      c.pins_expired};
    for (uint32_t acct = 0; acct < kAccounts; ++acct)
      out.push_back(pool_->pinned_by(acct));
    for (PageId p = 0; p < pool_->num_pages(); ++p) {
      out.push_back(static_cast<uint64_t>(pool_->state(p)));
      out.push_back(pool_->refcount(p));
      out.push_back(pool_->held(a_, p));
      out.push_back(pool_->held(b_, p));
      out.push_back(pool_->pinned_until(p));
      out.push_back(static_cast<uint64_t>(pool_->priority(p)));
    }
    out.push_back(UINT64_MAX);
    for (const PageId p : queue())
      out.push_back(p);
    return out;
  }

  uint64_t now_ = 1000;
  RecordingPolicy* rec_ = nullptr;
  std::unique_ptr<PagePool> pool_;
  OwnerId a_ = 0;
  OwnerId b_ = 0;
};

TEST_F(PagePoolPin, PinnedCachedPageIsNeverAVictim) {
  make(4);
  const Pages p = alloc(a_, 4);
  ASSERT_TRUE(ok(publish(a_, {{p[0], 10}, {p[2], 12}, {p[3], 13}})));
  ASSERT_TRUE(ok(publish(a_, {{p[1], 11}}, pin(100))));
  EXPECT_EQ(pool_->pinned_until(p[1]), 1100u);
  ASSERT_TRUE(ok(release(a_, p)));
  PoolStats s = pool_->stats();
  EXPECT_EQ(s.cached, 4u);
  EXPECT_EQ(s.pinned, 1u);
  EXPECT_EQ(s.pinned_cached, 1u);
  EXPECT_EQ(queue(), (Pages{p[0], p[2], p[3]}));
  // The policy never heard of the pinned page.
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[0], facts(10, 0, true, 0)),
                                 cached_call(p[2], facts(12, 0, true, 1)),
                                 cached_call(p[3], facts(13, 0, true, 2))}));

  // Four pages are cached, three can be had.
  const std::vector<uint64_t> before = snapshot();
  EXPECT_TRUE(is(try_alloc(b_, 4), Status(Errc::out_of_pages, kNoItem, 4)));
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(alloc(b_, 3), (Pages{p[0], p[2], p[3]}));
  EXPECT_EQ(pool_->state(p[1]), PageState::cached);
  EXPECT_TRUE(is(try_alloc(b_, 1), Status(Errc::out_of_pages, kNoItem, 1)));
  EXPECT_EQ(pool_->evict(4), 0u);
  EXPECT_EQ(pool_->stats().counters.evicted, 3u);
  // Still findable.
  EXPECT_EQ(lookup(a_, {11}), Pages{p[1]});
  EXPECT_EQ(pool_->stats().pinned_cached, 0u);
}

TEST_F(PagePoolPin, AllocReportsOutOfPagesWhenOnlyPinnedPagesAreCached) {
  make(2);
  cache_chain(a_, 1, 2, pin(30));
  EXPECT_EQ(pool_->stats().pinned_cached, 2u);
  EXPECT_EQ(queue(), Pages{});
  const std::vector<uint64_t> before = snapshot();
  EXPECT_TRUE(is(try_alloc(b_, 1), Status(Errc::out_of_pages, kNoItem, 1)));
  EXPECT_TRUE(is(try_alloc(b_, 2), Status(Errc::out_of_pages, kNoItem, 2)));
  EXPECT_TRUE(is(try_alloc(b_, 3), Status(Errc::exceeds_capacity, kNoItem, 3)));
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(rec_->take(), Calls{});
}

TEST_F(PagePoolPin, PinExpiresOnceTheClockReachesIt) {
  make(4);
  const PageId p = alloc(a_, 1, pin(50))[0];
  EXPECT_EQ(pool_->pinned_until(p), 1050u);
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  EXPECT_EQ(pool_->stats().pinned, 1u);
  EXPECT_EQ(pool_->stats().counters.pins, 1u);
  ASSERT_TRUE(ok(publish(a_, {{p, 1}})));
  ASSERT_TRUE(ok(release(a_, {p})));
  EXPECT_EQ(pool_->state(p), PageState::cached);
  EXPECT_EQ(pool_->stats().pinned_cached, 1u);
  EXPECT_EQ(queue(), Pages{});

  now_ = 1049;
  EXPECT_EQ(pool_->evict(1), 0u);
  check();
  EXPECT_EQ(pool_->pinned_until(p), 1050u);

  // Expiry is lazy: at its time the pin is still shown until something expires it.
  now_ = 1050;
  EXPECT_EQ(pool_->stats().pinned, 1u);
  EXPECT_EQ(rec_->take(), Calls{});
  pool_->expire_pins();
  check();
  const PoolStats s = pool_->stats();
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_EQ(s.pinned_cached, 0u);
  EXPECT_EQ(s.counters.pins_expired, 1u);
  EXPECT_EQ(pool_->pinned_until(p), 0u);
  EXPECT_EQ(pool_->pinned_by(0), 0u);
  EXPECT_EQ(queue(), Pages{p});
  // The policy hears of it now, as a first caching.
  EXPECT_EQ(rec_->take(), Calls{cached_call(p, facts(1, 0, true, 0))});
  EXPECT_EQ(pool_->evict(1), 1u);
  EXPECT_EQ(pool_->state(p), PageState::free);
}

TEST_F(PagePoolPin, AllocAndEvictExpirePinsBeforeChoosing) {
  make(2);
  const Pages p = cache_chain(a_, 1, 2, pin(10));
  EXPECT_TRUE(is(try_alloc(b_, 1), Status(Errc::out_of_pages, kNoItem, 1)));
  now_ += 10;
  // alloc expires both pins (in page order: same expiry), then evicts the first queued.
  const Pages got = alloc(b_, 1);
  EXPECT_EQ(pool_->stats().counters.pins_expired, 2u);
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[0], facts(1, 0, true, 0)),
                                 cached_call(p[1], facts(2, 0, true, 1)), victim_call(p[0])}));
  EXPECT_EQ(got, Pages{p[0]});
  EXPECT_EQ(pool_->stats().counters.evicted, 1u);
  ASSERT_TRUE(ok(release(b_, got)));  // unpublished: FREE again
  // evict expires too.
  const PageId q = alloc(a_, 1, pin(5))[0];
  ASSERT_TRUE(ok(publish(a_, {{q, 9}})));
  ASSERT_TRUE(ok(release(a_, {q})));
  EXPECT_EQ(pool_->evict(2), 1u);  // p[1]
  now_ += 5;
  EXPECT_EQ(pool_->evict(2), 1u);  // q, expired first
  EXPECT_EQ(pool_->stats().cached, 0u);
}

TEST_F(PagePoolPin, PinsExpireInExpiryOrderAsOneRun) {
  make(4);
  const Pages p = alloc(a_, 3);
  ASSERT_TRUE(ok(publish(a_, {{p[0], 1}, {p[1], 2}, {p[2], 3}})));
  ASSERT_TRUE(ok(retain(a_, {p[2]}, pin(10))));
  ASSERT_TRUE(ok(retain(a_, {p[0]}, pin(20))));
  ASSERT_TRUE(ok(retain(a_, {p[1]}, pin(15))));
  ASSERT_TRUE(ok(release(a_, {p[0], p[1], p[2], p[0], p[1], p[2]})));
  EXPECT_EQ(rec_->take(), Calls{});
  now_ += 30;
  pool_->expire_pins();
  check();
  EXPECT_EQ(rec_->take(),
            (Calls{cached_call(p[2], facts(3, 0, true, 0)), cached_call(p[1], facts(2, 0, true, 1)),
                   cached_call(p[0], facts(1, 0, true, 2))}));
  EXPECT_EQ(queue(), (Pages{p[2], p[1], p[0]}));
}

TEST_F(PagePoolPin, PinThatExpiresWhileInUseLeavesThePageInUse) {
  make(2);
  const PageId p = alloc(a_, 1, pin(10))[0];
  ASSERT_TRUE(ok(publish(a_, {{p, 1}})));
  now_ += 20;
  pool_->expire_pins();
  check();
  EXPECT_EQ(pool_->stats().pinned, 0u);
  EXPECT_EQ(pool_->stats().counters.pins_expired, 1u);
  EXPECT_EQ(pool_->state(p), PageState::in_use);
  EXPECT_EQ(queue(), Pages{});
  EXPECT_EQ(rec_->take(), Calls{});
  ASSERT_TRUE(ok(release(a_, {p})));
  EXPECT_EQ(queue(), Pages{p});
  EXPECT_EQ(rec_->take(), Calls{cached_call(p, facts(1, 0, true, 0))});
}

TEST_F(PagePoolPin, LaterPinExtendsAnEarlierOneDoesNot) {
  make(4);
  const PageId p = alloc(a_, 1, pin(100))[0];
  EXPECT_EQ(pool_->pinned_until(p), 1100u);
  now_ = 1010;
  ASSERT_TRUE(ok(retain(a_, {p}, pin(50))));  // would end at 1060: no change
  EXPECT_EQ(pool_->pinned_until(p), 1100u);
  EXPECT_EQ(pool_->stats().counters.pins, 1u);
  ASSERT_TRUE(ok(retain(a_, {p}, pin(90))));  // 1100 exactly: no change
  EXPECT_EQ(pool_->stats().counters.pins, 1u);
  ASSERT_TRUE(ok(retain(a_, {p}, pin(200))));
  EXPECT_EQ(pool_->pinned_until(p), 1210u);
  EXPECT_EQ(pool_->stats().counters.pins, 2u);
  EXPECT_EQ(pool_->stats().pinned, 1u);
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  EXPECT_EQ(pool_->refcount(p), 4u);
  ASSERT_TRUE(ok(publish(a_, {{p, 1}})));
  ASSERT_TRUE(ok(release(a_, {p, p, p, p})));
  now_ = 1100;
  pool_->expire_pins();
  EXPECT_EQ(pool_->stats().counters.pins_expired, 0u);
  EXPECT_EQ(pool_->stats().pinned_cached, 1u);
  // A lookup with a pin extends it too, and the page is found while held out of the policy.
  EXPECT_EQ(lookup(b_, {1}, pin(500)), Pages{p});
  EXPECT_EQ(pool_->pinned_until(p), 1600u);
  EXPECT_EQ(pool_->stats().counters.pins, 3u);
  now_ = 1210;
  pool_->expire_pins();
  EXPECT_EQ(pool_->stats().counters.pins_expired, 0u);
  now_ = 1600;
  pool_->expire_pins();
  check();
  EXPECT_EQ(pool_->stats().counters.pins_expired, 1u);
  EXPECT_EQ(pool_->stats().pinned, 0u);
}

TEST_F(PagePoolPin, LaterPinMovesTheChargeToItsAccount) {
  make(4);
  const Pages p = cache_chain(a_, 1, 1, pin(100, 0));
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  EXPECT_EQ(lookup(b_, {1}, pin(200, 1)), p);
  EXPECT_EQ(pool_->pinned_by(0), 0u);
  EXPECT_EQ(pool_->pinned_by(1), 1u);
  EXPECT_EQ(pool_->pinned_until(p[0]), 1200u);
  EXPECT_EQ(pool_->stats().pinned, 1u);
  // A shorter pin by a third account leaves it where it is.
  EXPECT_EQ(lookup(a_, {1}, pin(50, 2)), p);
  EXPECT_EQ(pool_->pinned_by(1), 1u);
  EXPECT_EQ(pool_->pinned_by(2), 0u);
  EXPECT_EQ(pool_->stats().counters.pins, 2u);
  // Expiry frees the charge of the account that holds it.
  ASSERT_TRUE(ok(release(a_, p)));
  ASSERT_TRUE(ok(release(b_, p)));
  now_ = 1200;
  pool_->expire_pins();
  check();
  EXPECT_EQ(pool_->pinned_by(1), 0u);
  EXPECT_EQ(queue(), p);
}

TEST_F(PagePoolPin, PinLimitRefusesAllocAndRetainChangingNothing) {
  make(8);
  const Pages x = alloc(a_, 2, pin(100, 0, 2));
  EXPECT_EQ(pool_->pinned_by(0), 2u);
  std::vector<uint64_t> before = snapshot();
  EXPECT_TRUE(is(try_alloc(a_, 1, pin(100, 0, 2)), limit_exceeded(3)));
  EXPECT_TRUE(is(try_alloc(a_, 3, pin(100, 0, 4)), limit_exceeded(5)));
  EXPECT_EQ(snapshot(), before);
  // The limit is per account and per call.
  const Pages y = alloc(a_, 1, pin(100, 1, 1));
  EXPECT_EQ(pool_->pinned_by(1), 1u);
  const Pages z = alloc(a_, 1, pin(100, 0, 3));
  EXPECT_EQ(pool_->pinned_by(0), 3u);
  // Extending the account's own pins adds nothing.
  ASSERT_TRUE(ok(retain(a_, {x[0], x[1], z[0], x[0]}, pin(300, 0, 3))));
  EXPECT_EQ(pool_->pinned_until(x[0]), 1300u);
  EXPECT_EQ(pool_->pinned_by(0), 3u);
  // A page listed twice counts once; a page pinned by another account would move.
  const Pages w = alloc(a_, 1);
  before = snapshot();
  EXPECT_TRUE(is(retain(a_, {w[0], w[0]}, pin(100, 0, 3)), limit_exceeded(4)));
  EXPECT_TRUE(is(retain(a_, {y[0], w[0]}, pin(500, 0, 4)), limit_exceeded(5)));
  EXPECT_EQ(snapshot(), before);
  ASSERT_TRUE(ok(retain(a_, {w[0], w[0]}, pin(100, 0, 4))));
  EXPECT_EQ(pool_->pinned_by(0), 4u);
  // Hints without a pin are never refused.
  ASSERT_TRUE(ok(retain(a_, {x[0]}, [] {
    CallHints h = prio(Priority::system);
    h.pin_limit = 0;
    return h;
  }())));
  EXPECT_EQ(pool_->priority(x[0]), Priority::system);
}

TEST_F(PagePoolPin, PinLimitRefusesLookupForThePagesItWouldPinAndPublishChangingNothing) {
  make(8);
  const Pages cached = cache_chain(a_, 1, 2);  // hashes 1, 2
  const Pages mine = alloc(b_, 1, pin(100, 2, 1));
  EXPECT_EQ(pool_->pinned_by(2), 1u);
  rec_->take();
  const std::vector<uint64_t> before = snapshot();
  // Charged for the two pages found, not for the miss: 1 + 2 > 2.
  Status s;
  EXPECT_EQ(lookup(b_, {1, 2, 7}, pin(100, 2, 2), &s), Pages{});
  EXPECT_TRUE(is(s, limit_exceeded(3)));
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(rec_->take(), Calls{});
  // A duplicate publish pins the existing page: refused past the limit as well.
  EXPECT_TRUE(is(publish(b_, {{mine[0], 2}}, pin(100, 3, 0)), limit_exceeded(1)));
  EXPECT_EQ(snapshot(), before);
  EXPECT_EQ(rec_->take(), Calls{});

  EXPECT_EQ(lookup(b_, {1, 2, 7}, pin(100, 2, 3)), cached);
  EXPECT_EQ(pool_->pinned_by(2), 3u);
  // Renewing pins the account already holds costs nothing: at its limit, the same lookup again.
  EXPECT_EQ(lookup(b_, {1, 2}, pin(150, 2, 3)), cached);
  EXPECT_EQ(pool_->pinned_by(2), 3u);
  std::vector<PublishResult> out;
  ASSERT_TRUE(ok(publish(a_, {{alloc(a_, 1)[0], 2}}, pin(200, 3, 1), &out)));
  EXPECT_EQ(out[0].kind, Kind::duplicate);
  EXPECT_EQ(out[0].page, cached[1]);
  EXPECT_EQ(pool_->pinned_by(3), 1u);
  EXPECT_EQ(pool_->pinned_by(2), 2u);
}

TEST_F(PagePoolPin, PoolWideCapCountsEveryAccountsPins) {
  make(8);
  CallHints one = pin(100, 1);
  one.pool_pin_limit = 3;
  CallHints two = pin(100, 2);
  two.pool_pin_limit = 3;
  alloc(a_, 2, one);
  const std::vector<uint64_t> before = snapshot();
  // Account 2 is far from its own limit, but the pool would have 4 pinned pages.
  EXPECT_TRUE(
      is(try_alloc(b_, 2, two), Status(Errc::pin_limit_exceeded, PagePool::kPoolPinItem, 4)));
  EXPECT_EQ(snapshot(), before);
  alloc(b_, 1, two);
  EXPECT_EQ(pool_->pinned_by(2), 1u);
  // Unpinned allocs are not limited by it.
  EXPECT_EQ(alloc(b_, 5).size(), 5u);
}

TEST_F(PagePoolPin, PinLimitCountsOnlyChargesThatMove) {
  make(8);
  const Pages p = alloc(a_, 1, pin(1000, 1));  // account 1 until 2000
  alloc(a_, 1, pin(10, 0));                    // account 0 is at its limit of 1
  // A shorter pin by account 0 leaves p's charge with account 1: nothing to refuse.
  ASSERT_TRUE(ok(retain(a_, p, pin(100, 0, 1))));
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  EXPECT_EQ(pool_->pinned_by(1), 1u);
  EXPECT_EQ(pool_->pinned_until(p[0]), 2000u);
  ASSERT_TRUE(ok(publish(a_, {{p[0], 1}}, pin(100, 0, 1))));
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  // A longer one would move it: refused.
  EXPECT_TRUE(is(retain(a_, p, pin(2000, 0, 1)), limit_exceeded(2)));
  EXPECT_EQ(pool_->pinned_by(1), 1u);
}

TEST_F(PagePoolPin, PublishPinLimitCountsAHashListedTwiceOnce) {
  make(8);
  const Pages p = alloc(a_, 2);
  // The second item duplicates the first: the caller ends up with p[0] twice, one pin.
  std::vector<PublishResult> out;
  ASSERT_TRUE(ok(publish(a_, {{p[0], 5}, {p[1], 5}}, pin(100, 0, 1), &out)));
  EXPECT_EQ(out[0].kind, Kind::stored);
  EXPECT_EQ(out[1].kind, Kind::duplicate);
  EXPECT_EQ(out[1].page, p[0]);
  EXPECT_EQ(pool_->pinned_by(0), 1u);
  EXPECT_EQ(pool_->pinned_until(p[0]), 1100u);
  EXPECT_EQ(pool_->pinned_until(p[1]), 0u);
}

TEST_F(PagePoolPin, FlushDropsPinnedCachedPagesEvictDoesNot) {
  make(6);
  const Pages pinned = cache_chain(a_, 1, 2, pin(100, 1));
  const Pages plain = cache_chain(a_, 10, 1);
  const Pages held = alloc(b_, 1, pin(100, 1));
  ASSERT_TRUE(ok(publish(b_, {{held[0], 20}})));
  EXPECT_EQ(pool_->pinned_by(1), 3u);
  EXPECT_EQ(pool_->evict(10), 1u);  // plain only
  EXPECT_EQ(pool_->state(plain[0]), PageState::free);
  EXPECT_EQ(pool_->stats().pinned_cached, 2u);
  EXPECT_EQ(pool_->flush(), 2u);
  check();
  const PoolStats s = pool_->stats();
  EXPECT_EQ(s.cached, 0u);
  EXPECT_EQ(s.pinned, 1u);  // the page in use keeps its pin
  EXPECT_EQ(s.pinned_cached, 0u);
  EXPECT_EQ(s.counters.flushed, 2u);
  EXPECT_EQ(s.counters.evicted, 1u);
  EXPECT_EQ(s.counters.pins_expired, 0u);
  EXPECT_EQ(pool_->pinned_by(1), 1u);
  for (const PageId page : pinned) {
    EXPECT_EQ(pool_->state(page), PageState::free);
    EXPECT_EQ(pool_->pinned_until(page), 0u);
  }
  EXPECT_EQ(lookup(a_, {1}), Pages{});
  EXPECT_EQ(pool_->state(held[0]), PageState::in_use);
  EXPECT_EQ(pool_->pinned_until(held[0]), 1100u);
}

TEST_F(PagePoolPin, UnpublishedPinnedPageReleasedBecomesFreeAndUnpinned) {
  make(2);
  const PageId p = alloc(a_, 1, pin(100, 2, PagePool::kUnlimited, Priority::system))[0];
  EXPECT_EQ(pool_->priority(p), Priority::system);
  ASSERT_TRUE(ok(retain(a_, {p}, pin(200, 2))));
  ASSERT_TRUE(ok(release(a_, {p})));
  EXPECT_EQ(pool_->pinned_until(p), 1200u);  // still held once
  ASSERT_TRUE(ok(release(a_, {p})));
  EXPECT_EQ(pool_->state(p), PageState::free);
  EXPECT_EQ(pool_->pinned_until(p), 0u);
  EXPECT_EQ(pool_->priority(p), Priority::none);
  EXPECT_EQ(pool_->pinned_by(2), 0u);
  const PoolStats s = pool_->stats();
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_EQ(s.counters.pins, 2u);
  EXPECT_EQ(s.counters.pins_expired, 0u);
  EXPECT_EQ(rec_->take(), Calls{});
  // Handed out again, it starts with no class and no pin.
  const Pages again = alloc(b_, 2);
  for (const PageId page : again) {
    EXPECT_EQ(pool_->priority(page), Priority::none);
    EXPECT_EQ(pool_->pinned_until(page), 0u);
  }
}

TEST_F(PagePoolPin, PriorityIsTheHighestHintSinceAlloc) {
  make(8, "prefix");
  const Pages p = alloc(a_, 2, prio(Priority::conversation));
  EXPECT_EQ(pool_->priority(p[0]), Priority::conversation);
  ASSERT_TRUE(ok(retain(a_, {p[0]}, prio(Priority::one_off))));
  EXPECT_EQ(pool_->priority(p[0]), Priority::conversation);
  ASSERT_TRUE(ok(retain(a_, {p[0]}, prio(Priority::system))));
  EXPECT_EQ(pool_->priority(p[0]), Priority::system);
  EXPECT_EQ(pool_->priority(p[1]), Priority::conversation);
  ASSERT_TRUE(ok(publish(a_, {{p[0], 1}, {p[1], 2}})));
  ASSERT_TRUE(ok(release(a_, {p[1], p[0], p[0], p[0]})));
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[1], facts(2, 0, true, 0, Priority::conversation)),
                                 cached_call(p[0], facts(1, 0, true, 1, Priority::system))}));
  const auto& prefix = static_cast<const PrefixPolicy&>(rec_->inner());
  EXPECT_EQ(prefix.segment_of(p[0]), PrefixPolicy::kSystem);
  EXPECT_EQ(prefix.segment_of(p[1]), PrefixPolicy::kProtected);

  // A lookup's class goes to the pages found; a duplicate publish's to the existing page.
  EXPECT_EQ(lookup(b_, {2, 9}, prio(Priority::system)), Pages{p[1]});
  EXPECT_EQ(pool_->priority(p[1]), Priority::system);
  const PageId mine = alloc(b_, 1, prio(Priority::one_off))[0];
  std::vector<PublishResult> out;
  ASSERT_TRUE(ok(publish(b_, {{mine, 1}}, prio(Priority::conversation), &out)));
  EXPECT_EQ(out[0].page, p[0]);
  EXPECT_EQ(pool_->priority(mine), Priority::one_off);
  EXPECT_EQ(pool_->priority(p[0]), Priority::system);

  // Evicted and handed out again: the class is gone.
  ASSERT_TRUE(ok(release(b_, {mine, p[1], p[0]})));
  EXPECT_EQ(pool_->flush(), 2u);
  for (const PageId page : alloc(a_, 8))
    EXPECT_EQ(pool_->priority(page), Priority::none);
}

TEST_F(PagePoolPin, PinnedCachedPageIsTakenAndReturnedWithoutThePolicy) {
  make(4);
  const Pages p = cache_chain(a_, 1, 1, pin(100));
  rec_->take();
  EXPECT_EQ(lookup(b_, {1}), p);
  EXPECT_EQ(pool_->stats().pinned_cached, 0u);
  EXPECT_EQ(pool_->state(p[0]), PageState::in_use);
  ASSERT_TRUE(ok(release(b_, p)));
  EXPECT_EQ(pool_->stats().pinned_cached, 1u);
  EXPECT_EQ(rec_->take(), Calls{});
  now_ += 100;
  pool_->expire_pins();
  // Its first time in the policy: first, with the hit it got meanwhile.
  EXPECT_EQ(rec_->take(), Calls{cached_call(p[0], facts(1, 1, true, 0))});
}

TEST_F(PagePoolPin, PolicyIsToldHitsFirstCachingAndReleaseRuns) {
  make(8);
  const Pages p = alloc(a_, 3);
  ASSERT_TRUE(ok(publish(a_, {{p[0], 1}, {p[1], 2}, {p[2], 3}})));
  // Hits since alloc, also while the page is in use: a lookup by b, a duplicate publish by b.
  EXPECT_EQ(lookup(b_, {1, 2}), (Pages{p[0], p[1]}));
  const PageId mine = alloc(b_, 1)[0];
  ASSERT_TRUE(ok(publish(b_, {{mine, 1}})));
  // retain is no hit.
  ASSERT_TRUE(ok(retain(a_, {p[2]})));
  ASSERT_TRUE(ok(release(a_, {p[2], p[2], p[1], p[0]})));  // tail first
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[2], facts(3, 0, true, 0))}));
  // close_owner releases newest first: mine (unpublished: FREE, no run), p[1], p[0].
  ASSERT_TRUE(ok(pool_->close_owner(b_)));
  check();
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[1], facts(2, 1, true, 0)),
                                 cached_call(p[0], facts(1, 2, true, 1))}));
  // Taken again: on_reuse, and no longer first when released; run starts again per call.
  const OwnerId c = pool_->open_owner();
  EXPECT_EQ(lookup(c, {1, 2, 3}), (Pages{p[0], p[1], p[2]}));
  EXPECT_EQ(rec_->take(), (Calls{reuse_call(p[0]), reuse_call(p[1]), reuse_call(p[2])}));
  ASSERT_TRUE(ok(release(c, {p[2]})));
  ASSERT_TRUE(ok(release(c, {p[1], p[0]})));
  EXPECT_EQ(rec_->take(), (Calls{cached_call(p[2], facts(3, 1, false, 0)),
                                 cached_call(p[1], facts(2, 2, false, 0)),
                                 cached_call(p[0], facts(1, 3, false, 1))}));
  // Evicted and published again: hits start over, first again.
  EXPECT_EQ(pool_->evict(3), 3u);
  rec_->take();
  const Pages again = alloc(c, 1);
  ASSERT_TRUE(ok(publish(c, {{again[0], 1}})));
  ASSERT_TRUE(ok(release(c, again)));
  EXPECT_EQ(rec_->take(), (Calls{cached_call(again[0], facts(1, 0, true, 0))}));
}

}  // namespace
}  // namespace kvpool::core

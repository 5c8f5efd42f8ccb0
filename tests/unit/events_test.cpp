// The daemon's operations pieces in process: the pool core's index observer, the event ring
// with its gaps and filters, flush → cleared, prefix hit counters and their ranking, latency
// names and the metrics listen address.
#include <gtest/gtest.h>

#include <vector>

#include "daemon/config/listen_address.h"
#include "daemon/core/page_pool.h"
#include "daemon/telemetry/events.h"
#include "daemon/telemetry/index_events.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/prefix_stats.h"

namespace kvpool::daemon {
namespace {

struct Recorder : core::IndexObserver {
  std::vector<std::string> calls;
  void stored(Namespace ns, const BlockHash& h, PageId p) override {
    calls.push_back("stored " + std::to_string(ns) + ":" + std::to_string(h.lo) + "@" +
                    std::to_string(p));
  }
  void removed(Namespace ns, const BlockHash& h, PageId p, Removal why) override {
    calls.push_back(std::string(why == Removal::flushed ? "flushed " : "evicted ") +
                    std::to_string(ns) + ":" + std::to_string(h.lo) + "@" + std::to_string(p));
  }
};

TEST(IndexObserver, SeesStoresEvictionsAndFlushesInOrder) {
  core::PoolOptions o;
  o.num_pages = 4;
  core::PagePool pool(std::move(o));
  Recorder rec;
  pool.set_observer(&rec);
  const auto a = pool.open_owner();
  std::vector<PageId> pages(3);
  ASSERT_TRUE(pool.alloc(a, pages).ok());
  std::vector<PublishItem> items = {{pages[0], {10, 0}}, {pages[1], {11, 0}}};
  std::vector<PublishResult> res(2);
  ASSERT_TRUE(pool.publish(a, 1, items, res).ok());
  ASSERT_TRUE(pool.publish(a, 1, items, res).ok());  // republish: no new event
  EXPECT_EQ(pool.indexed(), 2u);
  Namespace ns = 0;
  BlockHash h;
  EXPECT_TRUE(pool.indexed_key(pages[1], ns, h));
  EXPECT_EQ(h.lo, 11u);
  EXPECT_FALSE(pool.indexed_key(pages[2], ns, h));
  ASSERT_TRUE(pool.release(a, std::vector<PageId>{pages[1], pages[0]}).ok());  // both cached
  std::vector<PageId> more(2);
  ASSERT_TRUE(pool.alloc(a, more).ok());  // one free page, then evicts pages[1] (released first)
  EXPECT_EQ(pool.flush(), 1u);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"stored 1:10@0", "stored 1:11@1", "evicted 1:11@1",
                                                 "flushed 1:10@0"}));
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(EventLog, RingKeepsTheNewestAndReportsGaps) {
  EventLog log(16, 7);
  EXPECT_EQ(log.next_seq(), 1u);
  EXPECT_EQ(log.oldest_seq(), 1u);
  for (int i = 0; i < 40; ++i)
    log.append(LoggedEvent{BlockHash{uint64_t(i), 0}, 0, 0, 1, 0, wire::Event::kStored});
  EXPECT_EQ(log.next_seq(), 41u);
  EXPECT_EQ(log.oldest_seq(), 25u);
  Subscription sub;
  sub.cursor = 3;
  std::vector<uint64_t> seqs;
  uint64_t lost = 0, resume = 0;
  log.drain(
      sub, 5,
      [&](uint64_t seq, const LoggedEvent& e) {
        EXPECT_EQ(e.hash.lo, seq - 1);
        seqs.push_back(seq);
      },
      [&](uint64_t l, uint64_t r) { lost = l, resume = r; });
  EXPECT_EQ(lost, 22u);
  EXPECT_EQ(resume, 25u);
  EXPECT_EQ(seqs, (std::vector<uint64_t>{25, 26, 27, 28}));  // the gap counts as one of 5
  EXPECT_EQ(sub.cursor, 29u);
  EXPECT_EQ(log.lost(), 22u);
}

TEST(EventLog, SubscribersSeeTheirPoolAndTenant) {
  EventLog log(64, 1);
  log.append(LoggedEvent{{1, 0}, 0, 0, 1, 0, wire::Event::kStored});     // pool 0, tenant ns 1
  log.append(LoggedEvent{{2, 0}, 0, 0, 2, 0, wire::Event::kStored});     // pool 0, tenant ns 2
  log.append(LoggedEvent{{3, 0}, 0, 0, 1, 1, wire::Event::kStored});     // pool 1
  log.append(LoggedEvent{{}, 5, kNoPage, 0, 0, wire::Event::kCleared});  // pool 0, everyone
  auto seen = [&](Subscription sub) {
    std::vector<uint64_t> out;
    log.drain(
        sub, 100, [&](uint64_t seq, const LoggedEvent&) { out.push_back(seq); },
        [](uint64_t, uint64_t) { ADD_FAILURE() << "no gap expected"; });
    return out;
  };
  EXPECT_EQ(seen(Subscription{1, 0, 1, 0}), (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(seen(Subscription{1, 0, 0, 0}), (std::vector<uint64_t>{1, 2, 4}));  // admin
  EXPECT_EQ(seen(Subscription{1, 1, 0, 0}), (std::vector<uint64_t>{3}));
}

TEST(PoolIndexEvents, FlushThatEmptiesTheIndexIsOneClearedEvent) {
  core::PoolOptions o;
  o.num_pages = 8;
  core::PagePool pool(std::move(o));
  EventLog log(64, 1);
  PrefixStats stats(8);
  uint32_t now = 5;
  PoolIndexEvents events(0, log, stats, now);
  pool.set_observer(&events);
  const auto a = pool.open_owner();
  std::vector<PageId> pages(3);
  ASSERT_TRUE(pool.alloc(a, pages).ok());
  std::vector<PublishItem> items = {{pages[0], {1, 0}}, {pages[1], {2, 0}}, {pages[2], {3, 0}}};
  std::vector<PublishResult> res(3);
  ASSERT_TRUE(pool.publish(a, 1, items, res).ok());
  EXPECT_EQ(stats.of(pages[0]).published, 5u);
  ASSERT_TRUE(pool.release(a, std::vector<PageId>{pages[1], pages[2]}).ok());
  // pages[0] is still in use: a flush removes the other two one by one.
  events.begin_flush();
  EXPECT_EQ(pool.flush(), 2u);
  events.end_flush(pool.indexed() == 0);
  EXPECT_EQ(log.next_seq(), 6u);
  auto all = [&] {
    std::vector<LoggedEvent> out;
    Subscription sub{1, 0, 0, 0};
    log.drain(
        sub, 100, [&](uint64_t, const LoggedEvent& e) { out.push_back(e); },
        [](uint64_t, uint64_t) {});
    return out;
  };
  auto e = all();
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(e[3].kind, wire::Event::kRemoved);
  EXPECT_EQ(e[3].cause, wire::Event::kFlushed);
  // Now nothing is in use: the flush empties the index and is logged as one cleared event.
  ASSERT_TRUE(pool.release(a, std::vector<PageId>{pages[0]}).ok());
  events.begin_flush();
  EXPECT_EQ(pool.flush(), 1u);
  events.end_flush(pool.indexed() == 0);
  e = all();
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[5].kind, wire::Event::kCleared);
  EXPECT_EQ(e[5].count, 1u);
}

TEST(PrefixStats, RanksByHitsThenDepth) {
  core::PoolOptions o;
  o.num_pages = 8;
  core::PagePool pool(std::move(o));
  PrefixStats stats(8);
  const auto a = pool.open_owner();
  std::vector<PageId> pages(4);
  ASSERT_TRUE(pool.alloc(a, pages).ok());
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < 4; ++i)
    items.push_back({pages[i], {i + 1, 0}});
  std::vector<PublishResult> res(4);
  ASSERT_TRUE(pool.publish(a, 1, items, res).ok());
  for (const PageId p : pages)
    stats.stored(p, 1);
  const std::vector<PageId> chain = {pages[0], pages[1], pages[2]};
  stats.hit(chain, 3);                                    // 0,1,2 at depths 0,1,2
  stats.hit(std::span<const PageId>(chain).first(2), 4);  // 0,1 again
  EXPECT_EQ(stats.of(pages[0]).hits, 2u);
  EXPECT_EQ(stats.of(pages[1]).depth, 1u);
  EXPECT_EQ(stats.of(pages[1]).last_hit, 4u);
  EXPECT_EQ(stats.of(pages[3]).depth, PrefixStats::kUnknownDepth);
  uint32_t indexed = 0;
  auto top = stats.top(
      pool, 3, [](Namespace) { return true; }, indexed);
  EXPECT_EQ(indexed, 4u);
  EXPECT_EQ(top, (std::vector<PageId>{pages[1], pages[0], pages[2]}));
  top = stats.top(
      pool, 10, [](Namespace ns) { return ns == 99; }, indexed);
  EXPECT_EQ(indexed, 0u);
  EXPECT_TRUE(top.empty());
  stats.stored(pages[1], 9);  // a new hash on the page: counters start again
  EXPECT_EQ(stats.of(pages[1]).hits, 0u);
}

TEST(Latency, RecorderNamesOperationsAndIgnoresUnknownOpcodes) {
  LatencyRecorder r(true);
  r.record(2, 700);
  r.record(60000, 5);
  EXPECT_STREQ(r.ops()[2].name, "alloc");
  EXPECT_STREQ(r.ops()[20].name, "prefixes");
  EXPECT_STREQ(r.ops()[12].name, "copy");
  EXPECT_STREQ(r.ops()[13].name, "");
  EXPECT_EQ(r.ops()[2].count, 1u);
}

TEST(ListenAddress, ParsesLiteralAddressesAndKnowsLoopback) {
  ListenAddress a;
  EXPECT_EQ(parse_listen_address("127.0.0.1:9464", a), "");
  EXPECT_TRUE(a.loopback);
  EXPECT_EQ(a.port, 9464);
  EXPECT_EQ(parse_listen_address("localhost:0", a), "");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(parse_listen_address("[::1]:80", a), "");
  EXPECT_TRUE(a.loopback && a.v6);
  EXPECT_EQ(parse_listen_address("[::ffff:127.0.0.2]:80", a), "");
  EXPECT_TRUE(a.loopback);
  EXPECT_EQ(parse_listen_address("0.0.0.0:9464", a), "");
  EXPECT_FALSE(a.loopback);
  EXPECT_EQ(parse_listen_address("[::]:9464", a), "");
  EXPECT_FALSE(a.loopback);
  EXPECT_NE(parse_listen_address("127.0.0.1", a), "");
  EXPECT_NE(parse_listen_address("127.0.0.1:65536", a), "");
  EXPECT_NE(parse_listen_address("127.0.0.1:-1", a), "");
  EXPECT_NE(parse_listen_address("example.com:80", a), "");
  EXPECT_NE(parse_listen_address("[::1:80", a), "");
}

}  // namespace
}  // namespace kvpool::daemon

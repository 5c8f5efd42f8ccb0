// Integration: static reservations (reserve, unreserve) in a real kvpoold with real worker
// processes. A reservation holds the pages of a whole sequence at once and keeps its block table
// fixed: release cannot take its pages, only unreserve (or the session's end) does; it counts
// against the session's quota; it may start from a prefix hit, sharing those pages with the
// sequence that published them; kvpoolctl status shows it; a worker killed with SIGKILL while
// holding one leaves nothing behind. Bad requests are refused naming the cause, changing
// nothing.
#include <gtest/gtest.h>

#include <signal.h>

#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// 64 pages of 16 tokens; a session may hold 20.
constexpr char kConfig[] =
    "backend: host\nlimits: {max_pages_per_session: 20}\npools:\n  - name: default\n"
    "    capacity: 64 pages\n"
    "    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n";

BlockHash block(uint32_t i) {
  return BlockHash{0x5E5E'0000ull + i, 77};
}

TEST(StaticReservation, HoldsAFixedTableUntilUnreserved) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  auto r = c->reserve(150);  // 10 pages of 16 tokens
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<PageId> table = r.value().pages;
  ASSERT_EQ(table.size(), 10u);
  EXPECT_EQ(pool_stats(*c).reserved, 10u);
  EXPECT_EQ(pool_stats(*c).in_use, 10u);

  // release cannot take a reserved page, however it is asked.
  auto rel = c->release(std::span(&table[3], 1));
  ASSERT_FALSE(rel.ok());
  EXPECT_EQ(rel.error().status.code(), Errc::not_held);
  EXPECT_NE(rel.error().message.find("static reservation"), std::string::npos);
  // A reference of the session's own on top of the reservation's can go.
  ASSERT_TRUE(c->retain(std::span(&table[3], 1)).ok());
  const PageId twice[] = {table[3], table[3]};
  EXPECT_FALSE(c->release(twice).ok());
  ASSERT_TRUE(c->release(std::span(&table[3], 1)).ok());

  // Quota, capacity and nonsense are refused, and change nothing.
  auto over = c->reserve(11 * 16);  // 10 + 11 > 20
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().status.code(), Errc::quota_exceeded) << over.error().message;
  auto huge = c->reserve(100 * 16);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().status.code(), Errc::exceeds_capacity);
  EXPECT_NE(huge.error().message.find("max_tokens 1600 needs 100 pages"), std::string::npos)
      << huge.error().message;
  auto zero = c->reserve(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("max_tokens must be at least 1"), std::string::npos);
  const PageId foreign[] = {63};
  auto not_held = c->reserve(32, foreign);
  ASSERT_FALSE(not_held.ok());
  EXPECT_EQ(not_held.error().status.code(), Errc::not_held);
  const PageId hole[] = {kNoPage};
  auto bad_hole = c->reserve(32, hole);  // a full pool's hit has no holes
  ASSERT_FALSE(bad_hole.ok());
  EXPECT_EQ(bad_hole.error().status.code(), Errc::invalid_page);
  EXPECT_FALSE(c->unreserve(r.value().reservation + 1).ok());
  EXPECT_EQ(pool_stats(*c).reserved, 10u);
  EXPECT_EQ(pool_stats(*c).in_use, 10u);

  ASSERT_TRUE(c->unreserve(r.value().reservation).ok());
  EXPECT_EQ(pool_stats(*c).reserved, 0u);
  EXPECT_EQ(pool_stats(*c).in_use, 0u);
  EXPECT_FALSE(c->unreserve(r.value().reservation).ok());  // once only
}

// What no reply could carry, and reservations that cost no quota (seeds only) beyond a bound,
// are refused too: each is daemon memory.
TEST(StaticReservation, SizesAndCountsHaveBounds) {
  {
    // A pool that could hold the pages still refuses what no reply could carry.
    Daemon big(
        "backend: host\npools:\n  - name: default\n    capacity: 262200 pages\n"
        "    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 1, dtype: fp16}\n");
    ASSERT_TRUE(big.start()) << big.log();
    auto c = attach(big, "w");
    ASSERT_TRUE(c);
    auto huge = c->reserve(wire::kMaxBatch + 1);
    ASSERT_FALSE(huge.ok());
    EXPECT_NE(huge.error().message.find("more than one reply carries"), std::string::npos)
        << huge.error().message;
  }
  // The count bound, on a small pool (the sanitizer build checks every page after each call).
  Daemon d(
      "backend: host\npools:\n  - name: default\n    capacity: 64 pages\n"
      "    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 1, dtype: fp16}\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  auto page = c->alloc(1);
  ASSERT_TRUE(page.ok());
  uint32_t made = 0;
  for (; made < 5000; ++made) {
    auto r = c->reserve(1, page.value());
    if (!r.ok()) {
      EXPECT_EQ(r.error().status.code(), Errc::quota_exceeded) << r.error().message;
      break;
    }
  }
  EXPECT_EQ(made, 4096u);
}

TEST(StaticReservation, StartsFromAPrefixHitAndKvpoolctlShowsIt) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "publisher");
  auto b = attach(d, "reserver");
  ASSERT_TRUE(a && b);
  // A publishes a 3-block prefix and keeps it.
  auto pages = a->alloc(3);
  ASSERT_TRUE(pages.ok());
  std::vector<PublishItem> items;
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < 3; ++i) {
    items.push_back({pages.value()[i], block(i)});
    chain.push_back(block(i));
  }
  ASSERT_TRUE(a->publish(items).ok());
  // B looks it up and reserves 8 blocks starting from the hit.
  auto hit = b->lookup(chain);
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit.value().size(), 3u);
  auto r = b->reserve(8 * 16, hit.value());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r.value().pages.size(), 8u);
  for (uint32_t i = 0; i < 3; ++i)
    EXPECT_EQ(r.value().pages[i], pages.value()[i]);
  // The lookup's own references may go; the reservation keeps the prefix.
  ASSERT_TRUE(b->release(hit.value()).ok());
  ASSERT_TRUE(a->release(pages.value()).ok());
  stats::PoolStats p = pool_stats(*b);
  EXPECT_EQ(p.in_use, 8u);
  EXPECT_EQ(p.reserved, 8u);

  std::string out;
  ASSERT_EQ(
      run_command(std::string(KVPOOLCTL_BIN) + " --socket " + d.socket() + " --no-shm status", out),
      0)
      << out;
  EXPECT_NE(out.find("reserved  8 pages held by static reservations"), std::string::npos) << out;
  ASSERT_EQ(
      run_command(
          std::string(KVPOOLCTL_BIN) + " --socket " + d.socket() + " --no-shm status --json", out),
      0);
  EXPECT_NE(out.find("\"reserved\":8"), std::string::npos) << out;

  // Unreserved, the prefix stays cached for the next sequence; the rest is free.
  ASSERT_TRUE(b->unreserve(r.value().reservation).ok());
  p = pool_stats(*b);
  EXPECT_EQ(p.in_use, 0u);
  EXPECT_EQ(p.cached, 3u);
  EXPECT_EQ(p.reserved, 0u);
}

TEST(StaticReservation, AWorkerKilledHoldingOneLeaksNothing) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  Pipe reserved;
  const pid_t worker = spawn_worker([&] {
    auto c = Connection::attach(d.socket(), "doomed");
    if (!c.ok()) return 1;
    if (!c.value()->reserve(20 * 16).ok()) return 2;
    reserved.signal();
    ::pause();
    return 0;
  });
  ASSERT_TRUE(reserved.wait());
  auto c = attach(d, "observer");
  ASSERT_TRUE(c);
  EXPECT_EQ(pool_stats(*c).reserved, 20u);
  ::kill(worker, SIGKILL);
  EXPECT_EQ(wait_worker(worker), 128 + SIGKILL);
  // The daemon sees the connection close and takes everything back.
  stats::PoolStats p{};
  for (int i = 0; i < 200; ++i) {
    p = pool_stats(*c);
    if (p.in_use == 0) break;
    ::usleep(10000);
  }
  EXPECT_EQ(p.in_use, 0u);
  EXPECT_EQ(p.reserved, 0u);
  EXPECT_EQ(p.free, 64u);
  // And its pages serve the next reservation.
  EXPECT_TRUE(c->reserve(20 * 16).ok());
}

}  // namespace
}  // namespace kvpool::testing

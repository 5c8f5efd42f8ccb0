// Integration: elastic pools (pools[i].max_capacity, memory_budget) in a real kvpoold with real
// worker processes, on fake-device (the cuda-vmm sequence on memfd memory) and host. A pool grows
// when an alloc finds no free page; a worker attached before the growth learns of the new
// segments by the daemon's notice and reads, in a page of a new segment, the bytes another
// worker wrote. Two pools under one budget trade segments: the one under pressure takes them
// from the one whose pages are only cached, whose cached blocks survive (moved below) with
// their bytes. A shrink is refused while a page past the new end is held, and goes through once
// it is released; the worker's mapping then drops the segment. The stats snapshot records the
// size over time.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// 2 layers × 2 KV heads × head dim 32 × 16 tokens × fp16 = 8 KiB a page; 2 MiB segments (the
// fake-device granularity) hold 256 pages.
constexpr uint32_t kPerSegment = 256;
constexpr char kGeometry[] =
    "{layers: 2, kv_heads: 2, head_dim: 32, tokens_per_page: 16, dtype: fp16}";

// Segments come only when an alloc needs them unless `grow_ahead`, so that sizes are exact.
std::string elastic_pool(const std::string& name, uint32_t segments, uint32_t max_segments,
                         const std::string& dtype_geometry = kGeometry, bool grow_ahead = false) {
  return "  - name: " + name + "\n    geometry: " + dtype_geometry +
         "\n    capacity: " + std::to_string(segments * kPerSegment) +
         " pages\n    max_capacity: " + std::to_string(max_segments * kPerSegment) +
         " pages\n    segment_size: 2MiB\n    grow_ahead: " + (grow_ahead ? "true" : "false") +
         "\n";
}

BlockHash block(uint64_t i) {
  return BlockHash{0xE1A5'0000 + i, i};
}

void fill(const Connection& c, PageId p, uint64_t id) {
  std::byte* b = c.page(p);
  for (uint64_t i = 0; i < c.pool().page_stride; ++i)
    b[i] = static_cast<std::byte>((id * 151 + i * 13 + (i >> 9)) & 0xff);
}
uint64_t wrong(const Connection& c, PageId p, uint64_t id) {
  const std::byte* b = c.page(p);
  uint64_t n = 0;
  for (uint64_t i = 0; i < c.pool().page_stride; ++i)
    n += b[i] != static_cast<std::byte>((id * 151 + i * 13 + (i >> 9)) & 0xff);
  return n;
}

class Elastic : public ::testing::TestWithParam<const char*> {};

TEST_P(Elastic, GrowsOnDemandAndEveryWorkerMapsTheNewSegments) {
  Daemon d(std::string("backend: ") + GetParam() + "\npools:\n" + elastic_pool("default", 1, 4));
  ASSERT_TRUE(d.start()) << d.log();
  auto reader = attach(d, "reader");  // attached while the pool has one segment
  ASSERT_TRUE(reader);
  ASSERT_EQ(reader->pool().num_pages, kPerSegment);
  ASSERT_EQ(reader->pool().max_pages, 4 * kPerSegment);

  // Another process takes every page and 300 more: the pool grows by two segments.
  Pipe written;
  Pipe done;
  const pid_t writer = spawn_worker([&] {
    auto c = attach(d, "writer");
    if (!c) return 1;
    auto all = c->alloc(kPerSegment + 300);
    if (!all.ok()) return 2;
    if (c->pool().num_pages != 3 * kPerSegment) return 3;
    std::vector<PublishItem> items;
    for (uint32_t i = 0; i < all.value().size(); ++i) {
      fill(*c, all.value()[i], i);
      items.push_back({all.value()[i], block(i)});
    }
    if (!c->publish(items).ok()) return 4;
    written.signal();
    return done.wait() ? 0 : 5;  // holds its pages until the reader has looked
  });
  ASSERT_TRUE(written.wait());
  // The reader's next call brings the notice; its lookup hits pages of the new segments.
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < kPerSegment + 300; ++i)
    chain.push_back(block(i));
  auto hits = reader->lookup(chain);
  ASSERT_TRUE(hits.ok()) << hits.error().message;
  ASSERT_EQ(hits.value().size(), chain.size());
  EXPECT_EQ(reader->pool().num_pages, 3 * kPerSegment);
  uint64_t bad = 0, in_new = 0;
  for (uint32_t i = 0; i < hits.value().size(); ++i) {
    bad += wrong(*reader, hits.value()[i], i);
    in_new += hits.value()[i] >= kPerSegment;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(in_new, 300u);
  done.signal();
  EXPECT_EQ(wait_worker(writer), 0);
  const stats::PoolStats p = pool_stats(*reader, 0);
  EXPECT_EQ(p.total, 3 * kPerSegment);
  EXPECT_EQ(p.grows, 2u);
  EXPECT_EQ(p.history_len, 2u);
  EXPECT_EQ(p.history[1].pages, 3 * kPerSegment);
}

TEST_P(Elastic, ShrinkIsRefusedWhileAPagePastTheEndIsHeld) {
  Daemon d(std::string("backend: ") + GetParam() + "\npools:\n" + elastic_pool("default", 2, 4));
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  auto pages = c->alloc(kPerSegment + 1);  // the last one is in the second segment
  ASSERT_TRUE(pages.ok());
  const PageId tail = pages.value().back();
  ASSERT_GE(tail, kPerSegment);
  auto r = c->resize(kPerSegment);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status.code(), Errc::pages_in_use) << r.error().message;
  EXPECT_NE(r.error().message.find("in use"), std::string::npos) << r.error().message;
  EXPECT_EQ(c->pool().num_pages, 2 * kPerSegment);  // unchanged
  // Once the page is back, the same resize goes through and the worker's view follows.
  fill(*c, pages.value()[0], 7);
  ASSERT_TRUE(c->release(std::span(&pages.value().back(), 1)).ok());
  auto ok = c->resize(kPerSegment);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok.value(), kPerSegment);
  EXPECT_EQ(c->pool().num_pages, kPerSegment);
  EXPECT_EQ(wrong(*c, pages.value()[0], 7), 0u);  // pages below the end are untouched
  // Below the pool's min (one segment) there is nothing to give.
  EXPECT_FALSE(c->resize(1).ok() && c->pool().num_pages < kPerSegment);
  EXPECT_EQ(c->pool().num_pages, kPerSegment);
}

TEST_P(Elastic, TwoPoolsUnderOneBudgetTradeSegments) {
  // Four segments of budget: "a" starts with three, "b" with one.
  Daemon d(std::string("backend: ") + GetParam() + "\nmemory_budget: 8MiB\npools:\n" +
           elastic_pool("a", 3, 4) + elastic_pool("b", 1, 4));
  ASSERT_TRUE(d.start()) << d.log();
  // Worker A caches 600 blocks in pool a and keeps nothing in use.
  {
    auto a = attach(d, "a-worker", "a");
    ASSERT_TRUE(a);
    auto pages = a->alloc(600);
    ASSERT_TRUE(pages.ok());
    std::vector<PublishItem> items;
    for (uint32_t i = 0; i < 600; ++i) {
      fill(*a, pages.value()[i], 1000 + i);
      items.push_back({pages.value()[i], block(1000 + i)});
    }
    ASSERT_TRUE(a->publish(items).ok());
    ASSERT_TRUE(a->release(pages.value()).ok());
  }
  // Worker B needs more pages than pool b has and none of its own to evict: pressure. The
  // budget is full, so pool a gives back a segment (its cached tail moves below or goes).
  auto b = attach(d, "b-worker", "b");
  ASSERT_TRUE(b);
  auto got = b->alloc(kPerSegment + 100);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(b->pool().num_pages, 2 * kPerSegment);
  for (uint32_t i = 0; i < got.value().size(); ++i)
    fill(*b, got.value()[i], 5000 + i);
  // Pool a kept what still fits: every block it still finds has its bytes.
  auto a = attach(d, "a-reader", "a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->pool().num_pages, 2 * kPerSegment);
  uint32_t found = 0;
  for (uint32_t i = 0; i < 600; ++i) {
    auto h = a->lookup(std::vector<BlockHash>{block(1000 + i)});
    ASSERT_TRUE(h.ok());
    if (h.value().empty()) continue;
    ++found;
    EXPECT_EQ(wrong(*a, h.value()[0], 1000 + i), 0u) << "block " << 1000 + i;
    ASSERT_TRUE(a->release(h.value()).ok());
  }
  EXPECT_EQ(found, 2 * kPerSegment);  // 600 cached, room for 512 after the shrink
  for (uint32_t i = 0; i < got.value().size(); ++i)
    ASSERT_EQ(wrong(*b, got.value()[i], 5000 + i), 0u);
  const stats::PoolStats pa = pool_stats(*b, 0);
  const stats::PoolStats pb = pool_stats(*b, 1);
  EXPECT_EQ(pa.shrinks, 1u);
  EXPECT_EQ(pb.grows, 1u);
  EXPECT_EQ(pa.segment_bytes + pb.segment_bytes, uint64_t{8} << 20);
}

// What a refused request must leave as it was: every pool's size, cached blocks and host tier.
struct PoolsState {
  std::vector<uint64_t> words;
  bool operator==(const PoolsState&) const = default;
};
PoolsState pools_state(Connection& c, size_t pools) {
  PoolsState st;
  for (size_t i = 0; i < pools; ++i) {
    const stats::PoolStats p = pool_stats(c, i);
    st.words.insert(st.words.end(), {p.total, p.free, p.cached, p.evicted, p.grows, p.shrinks,
                                     p.host_held, p.host_demoted, p.host_dropped});
  }
  return st;
}

// A worker of `pool` caches `n` blocks block(first)… and keeps nothing in use; "" or what failed.
std::string cache_blocks(const Daemon& d, const std::string& pool, uint32_t n, uint64_t first) {
  auto c = attach(d, pool + "-worker", pool);
  if (!c) return "attach failed";
  auto pages = c->alloc(n);
  if (!pages.ok()) return pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], block(first + i)});
  if (!c->publish(items).ok()) return "publish failed";
  return c->release(pages.value()).ok() ? "" : "release failed";
}

TEST_P(Elastic, ARefusedAllocChangesNoPool) {
  // Four segments of budget: "a" (a session quota of 1,000 pages, pins up to 100) starts with
  // one, "b" with three and a host tier; b caches 700 blocks and keeps nothing in use.
  Daemon d(std::string("backend: ") + GetParam() +
           "\nmemory_budget: 8MiB\nlimits:\n  max_pages_per_session: 1000\n"
           "  max_pinned_pages_per_tenant: 100\n  max_pin_ttl_ms: 60000\npools:\n" +
           elastic_pool("a", 1, 4) + elastic_pool("b", 3, 4) + "    host_tier: 300 pages\n");
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_EQ(cache_blocks(d, "b", 700, 3000), "");
  auto a = attach(d, "a-worker", "a");
  ASSERT_TRUE(a);
  // a holds its whole first segment: every alloc below needs a to grow into b's memory, of which
  // b can give two segments (512 pages) above its min.
  auto held = a->alloc(kPerSegment);
  ASSERT_TRUE(held.ok());
  const PoolsState before = pools_state(*a, 2);

  struct Refusal {
    const char* why;
    uint32_t count;
    PageHints hints;
    Errc code;
  };
  PageHints pin;
  pin.pin_ttl_ms = 1000;
  const Refusal refusals[] = {
      {"more than the session quota", 800, {}, Errc::quota_exceeded},
      {"pins past the tenant's limit", 300, pin, Errc::pin_limit_exceeded},
      {"more than a can get now", 600, {}, Errc::out_of_pages},
  };
  for (const Refusal& r : refusals) {
    auto got = a->alloc(r.count, r.hints);
    ASSERT_FALSE(got.ok()) << r.why;
    EXPECT_EQ(got.error().status.code(), r.code) << r.why << ": " << got.error().message;
    EXPECT_TRUE(pools_state(*a, 2) == before) << r.why << " changed a pool";
    EXPECT_EQ(a->pool().num_pages, kPerSegment) << r.why;
  }
  // An alloc a can serve goes through: it takes what it needs from b, and no more.
  auto fits = a->alloc(200);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  EXPECT_EQ(a->pool().num_pages, 2 * kPerSegment);
}

TEST_P(Elastic, AnAllocPastMaxCapacityIsRefusedBeforeAnyPoolMoves) {
  // The report that started this: pool a asks for far more than its max while b's cache fills
  // the budget; nothing may be shrunk, evicted or demoted for a request that must fail.
  Daemon d(std::string("backend: ") + GetParam() + "\nmemory_budget: 8MiB\npools:\n" +
           elastic_pool("a", 1, 4) + elastic_pool("b", 3, 4) + "    host_tier: 300 pages\n");
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_EQ(cache_blocks(d, "b", 700, 4000), "");
  auto a = attach(d, "a-worker", "a");
  ASSERT_TRUE(a);
  const PoolsState before = pools_state(*a, 2);
  auto got = a->alloc(262144);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().status.code(), Errc::exceeds_capacity);
  EXPECT_NE(got.error().message.find("holds at most 1024 pages (max_capacity)"), std::string::npos)
      << got.error().message;
  EXPECT_TRUE(pools_state(*a, 2) == before) << "a refused alloc moved memory";
  // Past what a could reach even by taking all of b above its min (one segment): refused too.
  auto too_many = a->alloc(4 * kPerSegment);
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().status.code(), Errc::out_of_pages) << too_many.error().message;
  EXPECT_TRUE(pools_state(*a, 2) == before) << "a refused alloc moved memory";
}

TEST_P(Elastic, GrowsAheadOfNeedInTheBackground) {
  // One segment of two mapped, the budget room for exactly one more; pool b shows that a pool
  // growing ahead takes nothing from another.
  Daemon d(std::string("backend: ") + GetParam() + "\nmemory_budget: 6MiB\npools:\n" +
           elastic_pool("a", 1, 4, kGeometry, true) + elastic_pool("b", 1, 4, kGeometry, true));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a-worker", "a");
  auto idle = attach(d, "idle", "a");
  ASSERT_TRUE(a && idle);
  // Half a segment's pages free or more: nothing happens.
  auto few = a->alloc(kPerSegment / 2 - 1);
  ASSERT_TRUE(few.ok());
  ::usleep(100 * 1000);
  EXPECT_EQ(pool_stats(*a, 0).total, kPerSegment);
  // Below the low-water mark the next segment comes without any alloc asking for it.
  auto more = a->alloc(kPerSegment / 2);
  ASSERT_TRUE(more.ok());
  uint32_t total = 0;
  for (int i = 0; i < 500 && total != 2 * kPerSegment; ++i) {
    ::usleep(10 * 1000);
    total = pool_stats(*a, 0).total;
  }
  ASSERT_EQ(total, 2 * kPerSegment) << d.log();
  EXPECT_EQ(pool_stats(*a, 0).grows, 1u);
  // Every session of the pool is told, the idle one too, and maps the new segment.
  auto st = idle->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(idle->pool().num_pages, 2 * kPerSegment);
  // The rest of the first segment and the whole second one are there without a grow on demand.
  auto rest = a->alloc(2 * kPerSegment - (kPerSegment - 1));
  ASSERT_TRUE(rest.ok()) << rest.error().message;
  fill(*a, rest.value().back(), 7);
  EXPECT_EQ(wrong(*idle, rest.value().back(), 7), 0u);
  // The budget (6 MiB: a's two segments and b's one) has no room for a third: it does not come
  // ahead, and pool b is not shrunk for it.
  ::usleep(100 * 1000);
  EXPECT_EQ(pool_stats(*a, 0).total, 2 * kPerSegment);
  EXPECT_EQ(pool_stats(*a, 1).total, kPerSegment);
}

TEST_P(Elastic, GrowAheadTurnsOnByReload) {
  const std::string head = std::string("backend: ") + GetParam() + "\npools:\n";
  Daemon d(head + elastic_pool("a", 1, 4));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a-worker", "a");
  ASSERT_TRUE(a);
  auto most = a->alloc(kPerSegment - 1);  // one page free: far below the low-water mark
  ASSERT_TRUE(most.ok());
  ::usleep(100 * 1000);
  EXPECT_EQ(pool_stats(*a, 0).total, kPerSegment);  // off: no segment comes ahead
  std::ofstream(d.config_path()) << head + elastic_pool("a", 1, 4, kGeometry, true);
  ::kill(d.pid(), SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 500 && !reloaded; ++i) {
    reloaded = d.log().find("event=reloaded") != std::string::npos;
    if (!reloaded) ::usleep(10 * 1000);
  }
  ASSERT_TRUE(reloaded) << d.log();
  EXPECT_EQ(d.log().find("event=reload_needs_restart"), std::string::npos) << d.log();
  // The next call finds the pool below the mark and starts the segment.
  ASSERT_TRUE(a->stats().ok());
  uint32_t total = 0;
  for (int i = 0; i < 500 && total != 2 * kPerSegment; ++i) {
    ::usleep(10 * 1000);
    total = pool_stats(*a, 0).total;
  }
  EXPECT_EQ(total, 2 * kPerSegment) << d.log();
}

TEST_P(Elastic, ABudgetThatFundsPartOfASegmentFundsNone) {
  // 5 MiB of budget, one 2 MiB segment mapped: room for one more segment and a half. A pool
  // grows by whole segments, so 300 pages (more than one segment's 256) are out of reach.
  Daemon d(std::string("backend: ") + GetParam() + "\nmemory_budget: 5MiB\npools:\n" +
           elastic_pool("a", 1, 4));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a-worker", "a");
  ASSERT_TRUE(a);
  auto held = a->alloc(kPerSegment);
  ASSERT_TRUE(held.ok());
  const PoolsState before = pools_state(*a, 1);
  auto got = a->alloc(300);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().status.code(), Errc::out_of_pages) << got.error().message;
  EXPECT_NE(got.error().message.find("can grow by at most 256"), std::string::npos)
      << got.error().message;
  EXPECT_TRUE(pools_state(*a, 1) == before) << "a refused alloc grew the pool";
  EXPECT_EQ(a->pool().num_pages, kPerSegment);
  auto fits = a->alloc(200);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  EXPECT_EQ(a->pool().num_pages, 2 * kPerSegment);
}

INSTANTIATE_TEST_SUITE_P(Backends, Elastic, ::testing::Values("fake-device", "host"));

TEST(ElasticConfig, InitialSizesAboveTheBudgetAreRefused) {
  Daemon d(std::string("backend: fake-device\nmemory_budget: 4MiB\npools:\n") +
           elastic_pool("a", 2, 4) + elastic_pool("b", 1, 4));
  EXPECT_FALSE(d.start());
  EXPECT_NE(d.log().find("memory_budget"), std::string::npos) << d.log();
  // --check-config says the same, at the key's line, instead of calling the file valid.
  std::string out;
  EXPECT_NE(run_command(kvpoold_binary() + " --check-config " + d.config_path(), out), 0) << out;
  EXPECT_NE(out.find(d.config_path() + ":2: memory_budget: is 4.0 MiB, less than the 6.0 MiB"),
            std::string::npos)
      << out;
}

// Configs --check-config used to call valid and the start refused (or the start accepted though
// they cannot mean anything on this machine): both now refuse them with the same FILE:LINE: KEY.
TEST(ElasticConfig, CheckConfigAndTheStartRefuseTheSameConfigs) {
  const std::string pool = "pools:\n" + elastic_pool("a", 1, 4);
  struct Bad {
    std::string yaml;
    std::string where;  // ":LINE: KEY"
    std::string what;
  };
  const Bad bad[] = {
      {"backend: host\n" + pool + "    host_tier: 4TiB\n", ":9: pools[0].host_tier",
       "of memory available here (MemAvailable)"},
      {"backend: host\nmemory_budget: 4TiB\n" + pool, ":2: memory_budget",
       "of memory available here"},
      {"backend: fake-device\nmemory_budget: 4TiB\n" + pool, ":2: memory_budget",
       "of memory available here"},
      {"backend: host\n" + std::string("pools:\n") + "  - name: a\n    geometry: " + kGeometry +
           "\n    capacity: 256 pages\n    max_capacity: 1024 pages\n    segment_size: 1\n",
       ":7: pools[0].segment_size", "1024 segments of 8.0 KiB; a pool has at most 253"},
      {"backend: host\n" + std::string("pools:\n") + "  - name: a\n    geometry: " + kGeometry +
           "\n    capacity: 256 pages\n    max_capacity: 94GiB\n",
       ":6: pools[0].max_capacity", "segments of 64.0 MiB; a pool has at most 253"},
      // layer_major: a 12 KiB segment holds one 8 KiB page whole (page_major would fit 1.5),
      // so 300 pages take 300 segments.
      {"backend: host\n" + std::string("pools:\n") +
           "  - name: a\n    layout: layer_major\n    geometry: " + kGeometry +
           "\n    capacity: 2 pages\n    max_capacity: 300 pages\n    segment_size: 12KiB\n",
       ":8: pools[0].segment_size", "300 segments of 12.0 KiB; a pool has at most 253"},
  };
  for (const Bad& b : bad) {
    Daemon d(b.yaml);
    std::string out;
    EXPECT_EQ(run_command(kvpoold_binary() + " --check-config " + d.config_path(), out), 1)
        << b.yaml << out;
    EXPECT_NE(out.find(d.config_path() + b.where + ": "), std::string::npos) << b.yaml << out;
    EXPECT_NE(out.find(b.what), std::string::npos) << b.yaml << out;
    EXPECT_FALSE(d.start()) << b.yaml;
    EXPECT_NE(d.log().find(d.config_path() + b.where + ": "), std::string::npos)
        << b.yaml << d.log();
  }
}

}  // namespace
}  // namespace kvpool::testing

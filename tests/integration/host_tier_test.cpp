// Integration: a real kvpoold whose pools have a host tier (pools[i].host_tier). Worker processes
// fill pages with bytes and scales that name the block, publish them, and push them out of the
// pool with other blocks; a later lookup, in another process, finds them in the host tier
// (tier "host"), promoted into pages whose every byte and scale is what was written, in both
// layouts. A worker killed with SIGKILL while its lookups promote leaves no page held, no slot
// claimed and no block lost. kvpoolctl status and the stats snapshot show the tier. Each runs
// twice: with the tier's copies on the event loop (the default for small ones) and with every
// copy on the daemon's copy thread (--inline-copy-bytes 1B), where the caller's reply waits for it.
#include <signal.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// fp8 pages carry scales; 2 layers × 2 KV heads × 8 tokens × head dim 32: 2 KiB a page and 32
// bytes of scales. The pool holds 4 pages, its host tier 64.
std::string pool_yaml(const char* layout, uint32_t pages = 4, uint32_t host = 64) {
  return std::string("pools:\n  - name: default\n    layout: ") + layout +
         "\n    geometry: {layers: 2, kv_heads: 2, head_dim: 32, tokens_per_page: 8, dtype: "
         "fp8_e4m3}\n    capacity: " +
         std::to_string(pages) + " pages\n    host_tier: " + std::to_string(host) + " pages\n";
}

BlockHash block(uint64_t i) {
  return BlockHash{0x5151'0000 + i, i * 7 + 1};
}

std::vector<BlockHash> chain(uint64_t first, uint64_t n) {
  std::vector<BlockHash> c;
  for (uint64_t i = 0; i < n; ++i)
    c.push_back(block(first + i));
  return c;
}

// Calls fn(byte address, index within the page) for every byte of page p's KV and scales, in the
// order the host tier packs them.
template <typename Fn>
void for_each_byte(const Connection& c, PageId p, Fn&& fn) {
  const kernels::PagedKv kv = client::PoolKernels(c).paged_kv();
  const kernels::PageChunks ch = kernels::page_chunks(kv);
  uint64_t at = 0;
  auto* base = static_cast<std::byte*>(kv.base);
  for (uint32_t k = 0; k < ch.chunks; ++k) {
    std::byte* run = base + ch.at(p) + k * ch.chunk;
    for (uint64_t b = 0; b < ch.chunk_bytes; ++b)
      fn(run + b, at++);
  }
  auto* scales = reinterpret_cast<std::byte*>(c.page_scales(p));
  for (uint64_t b = 0; b < page_scale_bytes(kv.geometry); ++b)
    fn(scales + b, at++);
}

std::byte pattern(uint64_t block_id, uint64_t at) {
  return static_cast<std::byte>((block_id * 131 + at * 7 + (at >> 8)) & 0xff);
}

// Allocates one page per block of [first, first + n), writes its pattern, publishes, releases.
// Returns "" or what went wrong.
std::string cache_blocks(Connection& c, uint64_t first, uint64_t n) {
  auto pages = c.alloc(static_cast<uint32_t>(n));
  if (!pages.ok()) return "alloc: " + pages.error().message;
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < n; ++i) {
    const PageId p = pages.value()[i];
    for_each_byte(c, p, [&](std::byte* b, uint64_t at) { *b = pattern(first + i, at); });
    items.push_back({p, block(first + i)});
  }
  auto pub = c.publish(items);
  if (!pub.ok()) return "publish: " + pub.error().message;
  std::vector<PageId> back(pages.value().rbegin(), pages.value().rend());  // tail first
  auto rel = c.release(back);
  return rel.ok() ? "" : "release: " + rel.error().message;
}

// How many bytes of page p differ from block_id's pattern.
uint64_t wrong_bytes(const Connection& c, PageId p, uint64_t block_id) {
  uint64_t wrong = 0;
  for_each_byte(c, p, [&](std::byte* b, uint64_t at) { wrong += *b != pattern(block_id, at); });
  return wrong;
}

// (layout, whether every tier copy runs off the event loop)
class HostTier : public ::testing::TestWithParam<std::tuple<const char*, bool>> {
 protected:
  const char* layout() const { return std::get<0>(GetParam()); }
  std::string args() const { return std::get<1>(GetParam()) ? "--inline-copy-bytes 1B" : ""; }
};

TEST_P(HostTier, DemotedBlocksComeBackByteForByte) {
  Daemon d(pool_yaml(layout()), args());
  ASSERT_TRUE(d.start()) << d.log();
  // Worker 1 caches blocks 0..3, then 4..7, which pushes 0..3 down to the host tier.
  const int writer = run_worker([&] {
    auto c = attach(d, "writer");
    if (!c) return 1;
    if (std::string e = cache_blocks(*c, 0, 4); !e.empty()) return 2;
    if (std::string e = cache_blocks(*c, 4, 4); !e.empty()) return 3;
    return 0;
  });
  ASSERT_EQ(writer, 0);

  auto c = attach(d, "reader");
  ASSERT_TRUE(c);
  auto r = c->lookup_with_tiers(chain(0, 4));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r.value().pages.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.value().tiers[i], wire::kTierHost) << "block " << i;
    EXPECT_EQ(wrong_bytes(*c, r.value().pages[i], i), 0u) << "block " << i;
  }
  // The promoted blocks are device blocks again: a second lookup hits them there.
  auto again = c->lookup_with_tiers(chain(0, 4));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().pages, r.value().pages);
  EXPECT_EQ(again.value().tiers, std::vector<uint8_t>(4, wire::kTierDevice));
  // Their promotion needed room, so 4..7 went down in turn, and nothing was lost on the way.
  ASSERT_TRUE(c->release(again.value().pages).ok());
  ASSERT_TRUE(c->release(r.value().pages).ok());
  auto later = c->lookup_with_tiers(chain(4, 4));
  ASSERT_TRUE(later.ok());
  ASSERT_EQ(later.value().pages.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(later.value().tiers[i], wire::kTierHost);
    EXPECT_EQ(wrong_bytes(*c, later.value().pages[i], 4 + i), 0u) << "block " << 4 + i;
  }
  auto snap = c->snapshot();
  ASSERT_TRUE(snap.ok());
  stats::Snapshot s;
  ASSERT_EQ(stats::decode(snap.value().bytes, snap.value().layout_version, s), "");
  const stats::PoolStats& p = s.pools.at(0);
  EXPECT_EQ(p.host_slots, 64u);
  EXPECT_EQ(p.host_promoted, 8u);
  // 0..3 went down three times in all: at the start, and again when 4..7 came back up.
  EXPECT_EQ(p.host_demoted, 12u);
  EXPECT_EQ(p.host_held, 4u);
  EXPECT_EQ(p.host_copy_failures, 0u);
}

TEST_P(HostTier, PromotionStopsAtTheFirstBlockNeitherTierHolds) {
  Daemon d(pool_yaml(layout()), args());
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  ASSERT_EQ(cache_blocks(*c, 0, 4), "");
  ASSERT_EQ(cache_blocks(*c, 10, 4), "");  // 0..3 demoted
  // 0, 1 are in the host tier; 2 is asked for after a hole (block 99), so it is not reached.
  std::vector<BlockHash> ask{block(0), block(1), block(99), block(2)};
  auto r = c->lookup_with_tiers(ask);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().pages.size(), 2u);
  EXPECT_EQ(r.value().tiers, (std::vector<uint8_t>{wire::kTierHost, wire::kTierHost}));
  // A chain whose head is on the device and whose rest is in the host tier comes back whole.
  ASSERT_TRUE(c->release(r.value().pages).ok());
  auto mixed = c->lookup_with_tiers(std::vector<BlockHash>{block(0), block(1), block(2)});
  ASSERT_TRUE(mixed.ok());
  EXPECT_EQ(mixed.value().tiers,
            (std::vector<uint8_t>{wire::kTierDevice, wire::kTierDevice, wire::kTierHost}));
  EXPECT_EQ(wrong_bytes(*c, mixed.value().pages[2], 2), 0u);
}

TEST_P(HostTier, AnOperatorsEvictDemotesAndThenFreesThePages) {
  Daemon d(pool_yaml(layout()), args());
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  ASSERT_EQ(cache_blocks(*c, 0, 4), "");
  auto evicted = c->evict(4);  // the daemon holds the pages until their bytes are down
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  ASSERT_EQ(evicted.value(), 4u);
  auto st = c->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().in_use, 0u);  // and gives them back once they are
  EXPECT_EQ(st.value().free, 4u);
  // Another worker takes and overwrites all four pages; the blocks come back from the tier.
  const int scribbler = run_worker([&] {
    auto w = attach(d, "scribbler");
    if (!w) return 1;
    auto pages = w->alloc(4);
    if (!pages.ok()) return 2;
    for (const PageId p : pages.value())
      for_each_byte(*w, p, [](std::byte* b, uint64_t) { *b = std::byte{0xee}; });
    return w->release(pages.value()).ok() ? 0 : 3;
  });
  ASSERT_EQ(scribbler, 0);
  auto r = c->lookup_with_tiers(chain(0, 4));
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r.value().pages.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.value().tiers[i], wire::kTierHost) << "block " << i;
    EXPECT_EQ(wrong_bytes(*c, r.value().pages[i], i), 0u) << "block " << i;
  }
}

TEST_P(HostTier, KillNineDuringPromotionsLeaksNothing) {
  // 8 device pages and a host tier holding every block: blocks 0..31 all fit in the two tiers.
  Daemon d(pool_yaml(layout(), 8, 64), args());
  ASSERT_TRUE(d.start()) << d.log();
  {
    auto c = attach(d, "writer");
    ASSERT_TRUE(c);
    for (uint64_t first = 0; first < 32; first += 8)
      ASSERT_EQ(cache_blocks(*c, first, 8), "");
  }
  // Two workers look up alternating halves in a loop, each lookup promoting up to 8 blocks and
  // demoting as many; both are killed while they run.
  std::vector<pid_t> workers;
  Pipe ready;
  for (uint64_t half = 0; half < 2; ++half) {
    workers.push_back(spawn_worker([&, half] {
      auto c = attach(d, "promoter");
      if (!c) return 1;
      ready.signal();
      for (uint64_t round = 0;; ++round) {
        const uint64_t first = ((round + half) % 4) * 8;
        auto r = c->lookup(chain(first, 8));
        if (!r.ok()) return 2;
        if (!c->release(r.value()).ok()) return 3;
      }
    }));
  }
  ASSERT_TRUE(ready.wait());
  ASSERT_TRUE(ready.wait());
  ::usleep(200 * 1000);
  for (pid_t w : workers) {
    ::kill(w, SIGKILL);
    EXPECT_EQ(wait_worker(w), 128 + SIGKILL);
  }
  // The daemon noticed both sessions close; then no page is held and every block is in one tier
  // or the other, with its bytes.
  auto c = attach(d, "checker");
  ASSERT_TRUE(c);
  bool closed = false;
  for (int i = 0; i < 500 && !closed; ++i) {
    auto st = c->stats();
    ASSERT_TRUE(st.ok());
    closed = st.value().sessions == 1 && st.value().in_use == 0;
    if (!closed) ::usleep(10 * 1000);
  }
  ASSERT_TRUE(closed) << "a killed worker's pages are still held";
  {
    // The workers were promoting when they died (not idle or refused).
    auto snap = c->snapshot();
    ASSERT_TRUE(snap.ok());
    stats::Snapshot s;
    ASSERT_EQ(stats::decode(snap.value().bytes, snap.value().layout_version, s), "");
    EXPECT_GT(s.pools.at(0).host_promoted, 16u);
  }
  uint64_t found = 0;
  for (uint64_t first = 0; first < 32; first += 8) {
    auto r = c->lookup(chain(first, 8));
    ASSERT_TRUE(r.ok()) << r.error().message;
    found += r.value().size();
    for (size_t i = 0; i < r.value().size(); ++i)
      EXPECT_EQ(wrong_bytes(*c, r.value()[i], first + i), 0u) << "block " << first + i;
    ASSERT_TRUE(c->release(r.value()).ok());
  }
  EXPECT_EQ(found, 32u);
  auto st = c->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().in_use, 0u);
  EXPECT_TRUE(d.running());
}

INSTANTIATE_TEST_SUITE_P(Layouts, HostTier,
                         ::testing::Combine(::testing::Values("page_major", "layer_major"),
                                            ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param)) +
                                  (std::get<1>(param_info.param) ? "_OffTheLoop" : "_OnTheLoop");
                         });

TEST(HostTierConfig, RefusesATierThatHoldsNoPage) {
  Daemon d(
      "pools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 2, head_dim: 32, "
      "tokens_per_page: 8, dtype: fp16}\n    capacity: 4 pages\n    host_tier: 100B\n");
  EXPECT_FALSE(d.start());
  EXPECT_NE(d.log().find("host_tier"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace kvpool::testing

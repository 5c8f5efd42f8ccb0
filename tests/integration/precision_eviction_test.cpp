// Integration: precision before eviction (pools[].convert_evictions_to) with a real kvpoold and
// real worker processes. A bf16 pool's evictions become fp8 pages of its 8-bit pool under the same
// hashes: a worker of the 8-bit pool finds them and reads, byte for byte and scale for scale, what
// the convert-pages kernel makes of the bf16 bytes the writer published (both layouts, on the
// event loop and on the copy thread). A full 8-bit pool makes room by its own policy (its host
// tier, when it has one, takes those pages down), or keeps what it can and counts the rest lost;
// a block the 8-bit pool holds already is not converted again. A lookup of the bf16 pool that
// misses continues in the fp8 pool: its run comes back converted (tier kTierConverted) and leaves
// the fp8 pool. kill -9 of a worker whose call is
// converting leaves no page held. kvpoolctl status shows where the evictions went.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "common/stats_layout.h"
#include "kernels/cpu/kernels_cpu.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;

// recent: bf16, 4 pages; older: fp8, `older_pages` (and a host tier of `older_host` pages).
std::string config(const char* recent_layout, const char* older_layout, uint32_t older_pages,
                   uint32_t older_host = 0) {
  const std::string geometry =
      "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: ";
  std::string y = std::string("backend: host\npools:\n  - name: recent\n    layout: ") +
                  recent_layout + "\n" + geometry +
                  "bf16}\n    capacity: 4 pages\n    convert_evictions_to: older\n"
                  "  - name: older\n    layout: " +
                  older_layout + "\n" + geometry +
                  "fp8_e4m3}\n    capacity: " + std::to_string(older_pages) + " pages\n";
  if (older_host != 0) y += "    host_tier: " + std::to_string(older_host) + " pages\n";
  return y;
}

BlockHash block(uint64_t i) {
  return BlockHash{0xC0DE'0000 + i, i * 13 + 5};
}

std::vector<BlockHash> chain(uint64_t first, uint64_t n) {
  std::vector<BlockHash> c;
  for (uint64_t i = 0; i < n; ++i)
    c.push_back(block(first + i));
  return c;
}

// Calls fn(address, index) for every byte of page p's data runs in `kv`, in chunk order.
template <typename Fn>
void for_each_data_byte(const kernels::PagedKv& kv, PageId p, Fn&& fn) {
  const kernels::PageChunks ch = kernels::page_chunks(kv);
  auto* base = static_cast<std::byte*>(kv.base);
  uint64_t at = 0;
  for (uint32_t k = 0; k < ch.chunks; ++k) {
    std::byte* run = base + ch.at(p) + k * ch.chunk;
    for (uint64_t b = 0; b < ch.chunk_bytes; ++b)
      fn(run + b, at++);
  }
}

// Block `id`'s bf16 values, element by element in chunk order: smooth, with outlier channels.
uint16_t bf16_value(uint64_t id, uint64_t element) {
  float x = std::sin(0.013f * float(element) + 0.7f * float(id));
  if (element % 37 == 0) x *= 20.0f;
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

void fill_bf16(const kernels::PagedKv& kv, PageId p, uint64_t id) {
  uint16_t value = 0;
  for_each_data_byte(kv, p, [&](std::byte* b, uint64_t at) {
    if (at % 2 == 0) value = bf16_value(id, at / 2);
    *b = static_cast<std::byte>(at % 2 == 0 ? value & 0xff : value >> 8);
  });
}

// Allocates one page per block of [first, first + n) in c's (bf16) pool, writes its values,
// publishes, releases. "" or what went wrong.
std::string cache_blocks(Connection& c, uint64_t first, uint64_t n) {
  auto pages = c.alloc(static_cast<uint32_t>(n));
  if (!pages.ok()) return "alloc: " + pages.error().message;
  const kernels::PagedKv kv = PoolKernels(c).paged_kv();
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < n; ++i) {
    fill_bf16(kv, pages.value()[i], first + i);
    items.push_back({pages.value()[i], block(first + i)});
  }
  auto pub = c.publish(items);
  if (!pub.ok()) return "publish: " + pub.error().message;
  auto rel = c.release(pages.value());
  return rel.ok() ? "" : "release: " + rel.error().message;
}

// A worker process caches `rounds` rounds of 4 blocks in the bf16 pool (blocks 4r .. 4r + 3); its
// exit status (0: every round cached).
int cache_rounds(const Daemon& d, uint64_t rounds) {
  return run_worker([&] {
    auto c = attach(d, "writer", "recent");
    if (!c) return 1;
    for (uint64_t round = 0; round < rounds; ++round) {
      if (!cache_blocks(*c, 4 * round, 4).empty()) return 2;
    }
    return 0;
  });
}

// What convert_pages makes of block `id`'s bf16 page: a one-page bf16 pool shaped as `recent`
// converted into a one-page pool shaped as `older`, in local memory.
struct Expected {
  std::vector<std::byte> data;
  std::vector<float> scales;
  kernels::PagedKv kv;
};

Expected expected_fp8(const Connection& recent, const Connection& older, uint64_t id) {
  kernels::PagedKv src = PoolKernels(recent).paged_kv();
  std::vector<std::byte> src_data(page_data_bytes(src.geometry) + src.page_stride);
  src.base = src_data.data();
  src.num_pages = 1;
  fill_bf16(src, 0, id);
  Expected e;
  e.kv = PoolKernels(older).paged_kv();
  e.data.resize(page_data_bytes(e.kv.geometry) + e.kv.page_stride);
  e.scales.resize(page_scale_bytes(e.kv.geometry) / sizeof(float));
  e.kv.base = e.data.data();
  e.kv.scales = e.scales.data();
  e.kv.num_pages = 1;
  const PageId zero = 0;
  kernels::ConvertPagesArgs a{src, e.kv, 1, &zero, &zero};
  EXPECT_EQ(kernels::cpu::convert_pages(a, 1, 1), "");
  return e;
}

// What converting that fp8 page back makes of it, in local memory shaped as `recent`.
std::vector<std::byte> expected_back(const Connection& recent, const Connection& older,
                                     uint64_t id) {
  const Expected e = expected_fp8(recent, older, id);
  kernels::PagedKv dst = PoolKernels(recent).paged_kv();
  std::vector<std::byte> data(page_data_bytes(dst.geometry) + dst.page_stride);
  dst.base = data.data();
  dst.num_pages = 1;
  const PageId zero = 0;
  kernels::ConvertPagesArgs a{e.kv, dst, 1, &zero, &zero};
  EXPECT_EQ(kernels::cpu::convert_pages(a, 1, 1), "");
  std::vector<std::byte> want;
  for_each_data_byte(dst, 0, [&](std::byte* b, uint64_t) { want.push_back(*b); });
  return want;
}

// Bytes of `recent`'s page p that differ from block `id` converted to fp8 and back.
uint64_t wrong_back_bytes(const Connection& recent, const Connection& older, PageId p,
                          uint64_t id) {
  const std::vector<std::byte> want = expected_back(recent, older, id);
  uint64_t wrong = 0;
  for_each_data_byte(PoolKernels(recent).paged_kv(), p,
                     [&](std::byte* b, uint64_t at) { wrong += *b != want[at]; });
  return wrong;
}

// Bytes and scales of `older`'s page p that differ from the conversion of block `id`.
uint64_t wrong_bytes(const Connection& recent, const Connection& older, PageId p, uint64_t id) {
  const Expected e = expected_fp8(recent, older, id);
  std::vector<std::byte> want;
  for_each_data_byte(e.kv, 0, [&](std::byte* b, uint64_t) { want.push_back(*b); });
  uint64_t wrong = 0;
  for_each_data_byte(PoolKernels(older).paged_kv(), p,
                     [&](std::byte* b, uint64_t at) { wrong += *b != want[at]; });
  const float* scales = older.page_scales(p);
  for (size_t i = 0; i < e.scales.size(); ++i)
    wrong += std::memcmp(&scales[i], &e.scales[i], sizeof(float)) != 0;
  return wrong;
}

// (recent's layout, older's layout, whether every conversion runs on the copy thread)
class PrecisionEviction
    : public ::testing::TestWithParam<std::tuple<const char*, const char*, bool>> {
 protected:
  std::string yaml(uint32_t older_pages, uint32_t older_host = 0) const {
    return config(std::get<0>(GetParam()), std::get<1>(GetParam()), older_pages, older_host);
  }
  std::string args() const { return std::get<2>(GetParam()) ? "--inline-copy-bytes 1B" : ""; }
};

TEST_P(PrecisionEviction, EvictedBlocksAreFoundInEightBits) {
  Daemon d(yaml(16), args());
  ASSERT_TRUE(d.start()) << d.log();
  // Blocks 0..3 fill the bf16 pool; 4..7 push them out, into the fp8 pool.
  const int writer = run_worker([&] {
    auto c = attach(d, "writer", "recent");
    if (!c) return 1;
    if (!cache_blocks(*c, 0, 4).empty()) return 2;
    if (!cache_blocks(*c, 4, 4).empty()) return 3;
    return 0;
  });
  ASSERT_EQ(writer, 0);

  auto recent = attach(d, "reader16", "recent");
  auto older = attach(d, "reader8", "older");
  ASSERT_TRUE(recent && older);
  auto found = older->lookup(chain(0, 4));
  ASSERT_TRUE(found.ok()) << found.error().message;
  ASSERT_EQ(found.value().size(), 4u);
  for (uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(wrong_bytes(*recent, *older, found.value()[i], i), 0u) << "block " << i;
  // Blocks 4..7 are still bf16 only.
  auto not8 = older->lookup(chain(4, 1));
  ASSERT_TRUE(not8.ok());
  EXPECT_TRUE(not8.value().empty());
  auto hot = recent->lookup(chain(4, 4));
  ASSERT_TRUE(hot.ok());
  EXPECT_EQ(hot.value().size(), 4u);

  const stats::PoolStats p16 = pool_stats(*recent, 0);
  const stats::PoolStats p8 = pool_stats(*recent, 1);
  EXPECT_EQ(p16.convert_into, 2u);
  EXPECT_EQ(p16.converted, 4u);
  EXPECT_EQ(p16.convert_skipped, 0u);
  EXPECT_EQ(p16.convert_failures, 0u);
  EXPECT_EQ(p8.indexed, 4u);
  EXPECT_EQ(p8.in_use, 4u);  // the reader's lookup holds them
  ASSERT_TRUE(older->release(found.value()).ok());
  ASSERT_TRUE(recent->release(hot.value()).ok());
  EXPECT_EQ(pool_stats(*recent, 1).cached, 4u);

  // A lookup of the bf16 pool continues its chain in the fp8 pool: blocks 0..3 come back into
  // bf16 pages (tier converted), whose allocation pushed 4..7 down first.
  auto back = recent->lookup_with_tiers(chain(0, 4));
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_EQ(back.value().pages.size(), 4u);
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(back.value().tiers[i], wire::kTierConverted) << "block " << i;
    EXPECT_EQ(wrong_back_bytes(*recent, *older, back.value().pages[i], i), 0u) << "block " << i;
  }
  auto again = recent->lookup_with_tiers(chain(0, 4));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().pages, back.value().pages);
  EXPECT_EQ(again.value().tiers, std::vector<uint8_t>(4, wire::kTierDevice));
  // The tiers are exclusive: blocks 0..3 left the fp8 pool when they came back.
  auto left = older->lookup(chain(0, 1));
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left.value().empty());
  auto down = older->lookup(chain(4, 4));
  ASSERT_TRUE(down.ok());
  ASSERT_EQ(down.value().size(), 4u);
  for (uint64_t i = 0; i < 4; ++i)
    EXPECT_EQ(wrong_bytes(*recent, *older, down.value()[i], 4 + i), 0u) << "block " << 4 + i;
  const stats::PoolStats after = pool_stats(*recent, 0);
  EXPECT_EQ(after.converted, 8u);
  EXPECT_EQ(after.converted_back, 4u);
  ASSERT_TRUE(recent->release(again.value().pages).ok());
  ASSERT_TRUE(recent->release(back.value().pages).ok());
  ASSERT_TRUE(older->release(down.value()).ok());
  EXPECT_NE(d.log().find("event=eviction_converter_ready pool=recent into=older"),
            std::string::npos)
      << d.log();
#ifdef KVPOOLCTL_BIN
  // --no-shm: the snapshot op, current, not the stats segment, which trails.
  std::string out;
  ASSERT_EQ(run_command(std::string(KVPOOLCTL_BIN) + " --socket " + d.socket() +
                            " --no-shm status --pool recent",
                        out),
            0)
      << out;
  EXPECT_NE(out.find("precision evictions converted into older (fp8_e4m3): 8 converted"),
            std::string::npos)
      << out;
  ASSERT_EQ(run_command(std::string(KVPOOLCTL_BIN) + " --socket " + d.socket() +
                            " --no-shm status --pool older",
                        out),
            0)
      << out;
  EXPECT_NE(out.find("precision holds the evictions of recent (bf16) in fp8_e4m3: 8 converted"),
            std::string::npos)
      << out;
#endif
}

TEST_P(PrecisionEviction, AFullEightBitPoolKeepsTheNewestAndItsHostTierTheRest) {
  // The fp8 pool holds 2 pages: of each 4 evictions 2 fit; its host tier takes what it evicts.
  Daemon d(yaml(2, 16), args());
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_EQ(cache_rounds(d, 3), 0);
  auto recent = attach(d, "reader16", "recent");
  auto older = attach(d, "reader8", "older");
  ASSERT_TRUE(recent && older);
  const stats::PoolStats p16 = pool_stats(*recent, 0);
  EXPECT_EQ(p16.converted, 4u);  // two rounds of evictions, two blocks each
  EXPECT_EQ(p16.convert_skipped, 4u);
  const stats::PoolStats p8 = pool_stats(*recent, 1);
  EXPECT_EQ(p8.cached, 2u);
  EXPECT_EQ(p8.host_demoted, 2u);  // the first round's two, pushed out by the second's
  // Every block of blocks 0..7 the fp8 pool or its host tier holds reads as its conversion.
  uint32_t held = 0;
  for (uint64_t i = 0; i < 8; ++i) {
    auto r = older->lookup_with_tiers(chain(i, 1));
    ASSERT_TRUE(r.ok()) << r.error().message;
    if (r.value().pages.empty()) continue;
    ++held;
    EXPECT_EQ(wrong_bytes(*recent, *older, r.value().pages[0], i), 0u) << "block " << i;
    ASSERT_TRUE(older->release(r.value().pages).ok());
  }
  EXPECT_EQ(held, 4u);
}

// A lookup of the bf16 pool whose run the fp8 pool keeps only in its host tier: promoted into
// fp8 pages, then converted back (tier converted), bytes as fp8 and back make them.
TEST_P(PrecisionEviction, ALookupReachesTheEightBitPoolsHostTier) {
  Daemon d(yaml(2, 16), args());
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_EQ(cache_rounds(d, 3), 0);
  auto recent = attach(d, "reader16", "recent");
  auto older = attach(d, "reader8", "older");
  ASSERT_TRUE(recent && older);
  // The fp8 pool holds four of blocks 0..7: two on its device, two in its host tier. Its
  // operator evict sends the two on the device down too.
  auto evicted = older->evict(2);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  ASSERT_EQ(evicted.value(), 2u);
  EXPECT_EQ(pool_stats(*recent, 1).host_demoted, 4u);
  EXPECT_EQ(pool_stats(*recent, 1).cached, 0u);
  uint32_t back = 0;
  for (uint64_t i = 0; i < 8; ++i) {
    auto r = recent->lookup_with_tiers(chain(i, 1));
    ASSERT_TRUE(r.ok()) << r.error().message;
    if (r.value().pages.empty()) continue;
    ++back;
    EXPECT_EQ(r.value().tiers[0], wire::kTierConverted) << "block " << i;
    EXPECT_EQ(wrong_back_bytes(*recent, *older, r.value().pages[0], i), 0u) << "block " << i;
    ASSERT_TRUE(recent->release(r.value().pages).ok());
  }
  EXPECT_EQ(back, 4u) << d.log();
  EXPECT_EQ(pool_stats(*recent, 0).converted_back, 4u);
}

TEST_P(PrecisionEviction, ABlockTheEightBitPoolHoldsIsNotConvertedAgain) {
  Daemon d(yaml(16), args());
  ASSERT_TRUE(d.start()) << d.log();
  // A worker of the fp8 pool publishes block 0 there first, with bytes of its own.
  auto older = attach(d, "own8", "older");
  ASSERT_TRUE(older);
  auto mine = older->alloc(1);
  ASSERT_TRUE(mine.ok());
  for_each_data_byte(PoolKernels(*older).paged_kv(), mine.value()[0],
                     [](std::byte* b, uint64_t at) { *b = static_cast<std::byte>(at * 5 + 1); });
  const std::vector<PublishItem> item{{mine.value()[0], block(0)}};
  ASSERT_TRUE(older->publish(item).ok());
  ASSERT_TRUE(older->release(mine.value()).ok());
  const int writer = run_worker([&] {
    auto c = attach(d, "writer", "recent");
    if (!c) return 1;
    if (!cache_blocks(*c, 0, 4).empty() || !cache_blocks(*c, 4, 4).empty()) return 2;
    return 0;
  });
  ASSERT_EQ(writer, 0);
  const stats::PoolStats p16 = pool_stats(*older, 0);
  EXPECT_EQ(p16.converted, 3u);
  EXPECT_EQ(p16.convert_duplicates, 1u);
  auto r = older->lookup(chain(0, 1));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r.value(), mine.value());  // the worker's own page, untouched
  uint64_t changed = 0;
  for_each_data_byte(PoolKernels(*older).paged_kv(), r.value()[0], [&](std::byte* b, uint64_t at) {
    changed += *b != static_cast<std::byte>(at * 5 + 1);
  });
  EXPECT_EQ(changed, 0u);
}

// An operator's evict converts what it evicts (the daemon holds the pages until then); a flush of
// the 16-bit pool empties its 8-bit pool too, so nothing of the cache before it comes back.
TEST_P(PrecisionEviction, AnOperatorsEvictConvertsAndAFlushEmptiesBothPools) {
  Daemon d(yaml(16), args());
  ASSERT_TRUE(d.start()) << d.log();
  auto recent = attach(d, "op16", "recent");
  auto older = attach(d, "op8", "older");
  ASSERT_TRUE(recent && older);
  ASSERT_EQ(cache_blocks(*recent, 0, 3), "");
  auto evicted = recent->evict(2);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  EXPECT_EQ(evicted.value(), 2u);
  stats::PoolStats p16 = pool_stats(*recent, 0);
  EXPECT_EQ(p16.converted, 2u);
  EXPECT_EQ(p16.in_use, 0u);  // the daemon let go of the evicted pages once converted
  uint32_t found = 0;
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = older->lookup(chain(i, 1));
    ASSERT_TRUE(r.ok());
    if (r.value().empty()) continue;
    ++found;
    EXPECT_EQ(wrong_bytes(*recent, *older, r.value()[0], i), 0u) << "block " << i;
    ASSERT_TRUE(older->release(r.value()).ok());
  }
  EXPECT_EQ(found, 2u);

  auto flushed = recent->flush();
  ASSERT_TRUE(flushed.ok()) << flushed.error().message;
  EXPECT_EQ(flushed.value(), 3u);  // one bf16 page and the two fp8 ones
  for (uint64_t i = 0; i < 3; ++i) {
    auto r = recent->lookup_with_tiers(chain(i, 1));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r.value().pages.empty()) << "block " << i << " came back after the flush";
  }
  EXPECT_EQ(pool_stats(*recent, 1).indexed, 0u);
}

// Tenants change on reload, conversions only at a restart: a reload whose tenants would let a
// tenant read the 8-bit pool but not the converting one, under the running conversion, is
// refused even though its own file converts nothing.
TEST(PrecisionEvictionReload, ATenantChangeThatWouldShowConvertedBlocksIsRefused) {
  Daemon d(config("page_major", "page_major", 16));
  ASSERT_TRUE(d.start()) << d.log();
  std::ofstream(d.config_path()) << "backend: host\npools:\n  - name: recent\n"
                                 << "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, "
                                    "tokens_per_page: 16, dtype: bf16}\n    capacity: 4 pages\n"
                                 << "  - name: older\n"
                                 << "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, "
                                    "tokens_per_page: 16, dtype: fp8_e4m3}\n"
                                    "    capacity: 16 pages\n"
                                 << "tenants:\n  - {name: b, uids: [4242], pools: [older]}\n";
  ::kill(d.pid(), SIGHUP);
  const auto logged = [&](const std::string& what) {
    for (int i = 0; i < 500; ++i) {
      if (d.log().find(what) != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  ASSERT_TRUE(logged("event=reload_failed")) << d.log();
  EXPECT_NE(d.log().find("pools.recent.convert_evictions_to: tenant \\\"b\\\" may use pool"),
            std::string::npos)
      << d.log();
  EXPECT_EQ(d.log().find("event=reloaded"), std::string::npos) << d.log();
  // The running config stays: this process is still the default tenant of both pools.
  EXPECT_TRUE(attach(d, "after", "older"));
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndThreads, PrecisionEviction,
                         ::testing::Values(std::make_tuple("page_major", "page_major", false),
                                           std::make_tuple("page_major", "layer_major", true),
                                           std::make_tuple("layer_major", "page_major", false),
                                           std::make_tuple("layer_major", "layer_major", true)),
                         [](const auto& p) {
                           return std::string(std::get<0>(p.param)) + "_into_" +
                                  std::get<1>(p.param) +
                                  (std::get<2>(p.param) ? "_off_loop" : "_on_loop");
                         });

// A worker killed while its calls convert (every conversion on the copy thread, larger pages so
// that one takes a while): nothing stays held in either pool, and each fp8 block is a whole one.
TEST(PrecisionEvictionKill, AWorkerKilledMidConversionLeaksNothing) {
  const std::string geometry =
      "    geometry: {layers: 8, kv_heads: 8, head_dim: 128, tokens_per_page: 64, dtype: ";
  Daemon d("backend: host\npools:\n  - name: recent\n" + geometry +
               "bf16}\n    capacity: 8 pages\n    convert_evictions_to: older\n"
               "  - name: older\n" +
               geometry + "fp8_e4m3}\n    capacity: 32 pages\n",
           "--inline-copy-bytes 1B");
  ASSERT_TRUE(d.start()) << d.log();
  const pid_t worker = spawn_worker([&] {
    auto c = attach(d, "churn", "recent");
    if (!c) return 1;
    for (uint64_t round = 0;; ++round) {
      if (!cache_blocks(*c, 8 * round, 8).empty()) return 2;
    }
  });
  auto recent = attach(d, "watch", "recent");
  ASSERT_TRUE(recent);
  // Kill it once conversions are under way.
  ASSERT_TRUE([&] {
    for (int i = 0; i < 500; ++i) {
      if (pool_stats(*recent, 0).converted >= 8) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }()) << d.log();
  ::kill(worker, SIGKILL);
  (void)wait_worker(worker);
  stats::PoolStats p16, p8;
  for (int i = 0; i < 200; ++i) {  // the session's close and the last job finish on the loop
    p16 = pool_stats(*recent, 0);
    p8 = pool_stats(*recent, 1);
    if (p16.in_use == 0 && p8.in_use == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(p16.in_use, 0u);
  EXPECT_EQ(p8.in_use, 0u);
  EXPECT_EQ(p8.indexed, p8.cached);
  EXPECT_EQ(p16.convert_failures, 0u);
  // Every block the fp8 pool holds is a whole conversion: look each up and check it.
  auto older = attach(d, "check", "older");
  ASSERT_TRUE(older);
  uint64_t checked = 0;
  // Block ids run in eviction order: every evicted one is below evicted + 8.
  for (uint64_t i = 0; i < p16.evicted + 8 && checked < p8.indexed; ++i) {
    auto r = older->lookup(chain(i, 1));
    ASSERT_TRUE(r.ok());
    if (r.value().empty()) continue;
    ++checked;
    EXPECT_EQ(wrong_bytes(*recent, *older, r.value()[0], i), 0u) << "block " << i;
    ASSERT_TRUE(older->release(r.value()).ok());
  }
  EXPECT_EQ(checked, p8.indexed);
}

}  // namespace
}  // namespace kvpool::testing

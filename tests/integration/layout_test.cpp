// Integration: a real kvpoold serving a layer_major pool (common/geometry.h, KvLayout). Workers
// learn the layout in the hello reply (Connection::layout, the C API's kvpool_pool_info), write
// KV with the append kernel through PoolKernels (host memory: the CPU kernel), and read it back, in
// another process, at the layer_major offsets; a daemon-side copy (Connection::copy) moves all 2 ·
// layers runs of a page and nothing else. A reload that changes the layout waits for a restart.
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "kernels/kv_dtype.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// 2 layers × 2 KV heads × 16 tokens × head dim 64 × fp16: 16 KiB a page, 12 pages.
constexpr char kLayerMajorPool[] = R"(
pools:
  - name: default
    layout: layer_major
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 12 pages
)";
constexpr uint32_t kPages = 12, kLayers = 2, kHeads = 2, kDim = 64, kTokensPerPage = 16;

bool log_has(const Daemon& d, const std::string& needle) {
  for (int i = 0; i < 300; ++i) {
    if (d.log().find(needle) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// An integer in [−1000, 1039), which fp16 holds exactly, mixing every coordinate so that an
// element written or read at a wrong place shows up.
float value(uint32_t token, uint32_t layer, uint32_t head, uint32_t dim, int kind) {
  const uint32_t mix =
      token * 131 + layer * 37 + head * 17 + dim * 3 + static_cast<uint32_t>(kind) * 1001;
  return static_cast<float>(mix % 2039) - 1000.0f;
}

float element(const Connection& c, uint64_t elem) {
  uint16_t bits = 0;
  std::memcpy(&bits, c.base() + elem * 2, 2);
  return kernels::fp16_to_f32(bits);
}

// Appends tokens [0, n) of every layer into `pages` (token t at pages[t / T], slot t % T).
std::string append(const Connection& c, const std::vector<PageId>& pages, uint32_t n) {
  std::vector<int64_t> slots(n);
  for (uint32_t t = 0; t < n; ++t)
    slots[t] = int64_t{pages[t / kTokensPerPage]} * kTokensPerPage + t % kTokensPerPage;
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> k(size_t{n} * kHeads * kDim), v(k.size());
    for (uint32_t t = 0; t < n; ++t) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t d = 0; d < kDim; ++d) {
          k[(t * kHeads + h) * kDim + d] = value(t, l, h, d, 0);
          v[(t * kHeads + h) * kDim + d] = value(t, l, h, d, 1);
        }
      }
    }
    kernels::AppendArgs a;
    a.layer = l;
    a.num_tokens = n;
    a.k = k.data();
    a.v = v.data();
    a.slots = slots.data();
    if (std::string e = client::PoolKernels(c).append_kv(a); !e.empty()) return e;
  }
  return {};
}

// How many elements of tokens [0, n) in `pages` differ from value() at the layer_major offsets.
uint64_t mismatches(const Connection& c, const std::vector<PageId>& pages, uint32_t n) {
  const Geometry& g = c.pool().geometry;
  uint64_t bad = 0;
  for (uint32_t t = 0; t < n; ++t) {
    const PageId p = pages[t / kTokensPerPage];
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t d = 0; d < kDim; ++d) {
          const uint32_t slot = t % kTokensPerPage;
          bad +=
              element(c, layer_major_k_offset(g, kPages, p, l, h, slot, d)) != value(t, l, h, d, 0);
          bad +=
              element(c, layer_major_v_offset(g, kPages, p, l, h, slot, d)) != value(t, l, h, d, 1);
        }
      }
    }
  }
  return bad;
}

TEST(LayerMajorPool, WorkersSeeTheLayoutAndItsOffsets) {
  Daemon d(kLayerMajorPool);
  ASSERT_TRUE(d.start()) << d.log();
  EXPECT_NE(d.log().find("layout=layer_major"), std::string::npos) << d.log();
  auto attached = Connection::attach(d.socket(), "writer");
  ASSERT_TRUE(attached.ok()) << attached.error().message;
  const Connection& c = *attached.value();
  ASSERT_EQ(c.layout(), KvLayout::layer_major);
  ASSERT_EQ(c.pool().num_pages, kPages);
  const uint64_t plane = uint64_t{kPages} * kTokensPerPage * kHeads * kDim * 2;  // bytes
  EXPECT_EQ(c.layer_stride(), 2 * plane);
  const kernels::PagedKv kv = client::PoolKernels(c).paged_kv();
  EXPECT_EQ(kv.layout, KvLayout::layer_major);
  EXPECT_EQ(kv.num_pages, kPages);

  // Fill the whole pool with a byte pattern first, so untouched bytes are recognisable.
  std::memset(c.base(), 0x7c, uint64_t{kPages} * page_data_bytes(c.pool().geometry));
  auto pages = attached.value()->alloc(2);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  const uint32_t tokens = kTokensPerPage + 5;  // a whole page and part of the next
  ASSERT_EQ(append(c, pages.value(), tokens), "");
  EXPECT_EQ(mismatches(c, pages.value(), tokens), 0u);

  // Another process (its own mapping) reads the same values at the same offsets.
  const std::vector<PageId> written = pages.value();
  const int reader = run_worker([&] {
    auto r = Connection::attach(d.socket(), "reader");
    if (!r.ok() || r.value()->layout() != KvLayout::layer_major) return 2;
    return mismatches(*r.value(), written, tokens) == 0 ? 0 : 1;
  });
  EXPECT_EQ(reader, 0);

  // The C API reports the layout and the layer stride at the end of kvpool_pool_info.
  kvpool_conn* cc = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c", nullptr, &cc, err, sizeof err), KVPOOL_OK)
      << err;
  kvpool_pool_info info{};
  kvpool_get_pool_info(cc, &info);
  EXPECT_EQ(info.layout, 1);
  EXPECT_EQ(info.layer_stride, 2 * plane);
  EXPECT_EQ(info.num_pages, kPages);
  kvpool_detach(cc);
}

TEST(LayerMajorPool, DaemonCopyMovesEveryLayerOfAPageAndNothingElse) {
  Daemon d(kLayerMajorPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto attached = Connection::attach(d.socket(), "w");
  ASSERT_TRUE(attached.ok()) << attached.error().message;
  Connection& c = *attached.value();
  const uint64_t pool_bytes = uint64_t{kPages} * page_data_bytes(c.pool().geometry);
  std::memset(c.base(), 0x7c, pool_bytes);
  auto src = c.alloc(2);
  auto dst = c.alloc(2);
  ASSERT_TRUE(src.ok() && dst.ok());
  const uint32_t tokens = 2 * kTokensPerPage;
  ASSERT_EQ(append(c, src.value(), tokens), "");
  const std::vector<std::byte> before(c.base(), c.base() + pool_bytes);

  const std::vector<wire::PageCopy> pairs{{src.value()[0], dst.value()[0]},
                                          {src.value()[1], dst.value()[1]}};
  auto copied = c.copy(pairs);
  ASSERT_TRUE(copied.ok()) << copied.error().message;
  EXPECT_EQ(copied.value(), 2u);
  EXPECT_EQ(mismatches(c, dst.value(), tokens), 0u);
  EXPECT_EQ(mismatches(c, src.value(), tokens), 0u);

  // Every byte outside the destinations' 2 · layers runs is as it was.
  const Geometry& g = c.pool().geometry;
  const uint64_t run = uint64_t{kTokensPerPage} * kHeads * kDim * 2;
  std::vector<bool> in_dst(pool_bytes, false);
  for (const PageId p : dst.value()) {
    for (uint32_t l = 0; l < kLayers; ++l) {
      for (int kind = 0; kind < 2; ++kind) {
        const uint64_t at = 2 * (kind == 0 ? layer_major_k_offset(g, kPages, p, l, 0, 0, 0)
                                           : layer_major_v_offset(g, kPages, p, l, 0, 0, 0));
        for (uint64_t b = 0; b < run; ++b)
          in_dst[at + b] = true;
      }
    }
  }
  uint64_t changed_outside = 0;
  for (uint64_t b = 0; b < pool_bytes; ++b)
    changed_outside += !in_dst[b] && c.base()[b] != before[b];
  EXPECT_EQ(changed_outside, 0u);
}

TEST(LayerMajorPool, PageMajorIsTheDefaultAndALayoutChangeWaitsForARestart) {
  Daemon d(R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 12 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  auto before = Connection::attach(d.socket(), "w");
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(before.value()->layout(), KvLayout::page_major);
  EXPECT_EQ(before.value()->layer_stride(), 0u);
  kvpool_conn* cc = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c", nullptr, &cc, err, sizeof err), KVPOOL_OK)
      << err;
  kvpool_pool_info info{};
  info.layout = 9;
  info.layer_stride = 9;
  kvpool_get_pool_info(cc, &info);
  EXPECT_EQ(info.layout, 0);
  EXPECT_EQ(info.layer_stride, 0u);
  kvpool_detach(cc);

  std::ofstream(d.config_path()) << kLayerMajorPool;
  ::kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_has(d, "event=reload_needs_restart")) << d.log();
  EXPECT_NE(d.log().find("keys=pools"), std::string::npos) << d.log();
  auto after = Connection::attach(d.socket(), "w2");
  ASSERT_TRUE(after.ok()) << after.error().message;
  EXPECT_EQ(after.value()->layout(), KvLayout::page_major);  // the running pool is unchanged
}

}  // namespace
}  // namespace kvpool::testing

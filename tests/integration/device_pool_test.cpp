// Integration tests of the GPU pool's path without a GPU (issue 5): the fake-device backend runs
// the cuda-vmm sequence — create segments, export descriptors, SCM_RIGHTS, import, map back to
// back — on memfd memory, and workers run the kernels on the daemon's pages through PoolKernels
// (the CPU kernels here; the CUDA ones on a GPU, tests/gpu/). Real kvpoold, real worker processes.

#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "client/connection.h"
#include "client/pool_kernels.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;

constexpr uint32_t kLayers = 2;
constexpr uint32_t kKvHeads = 3;
constexpr uint32_t kHeadDim = 64;
constexpr uint32_t kTokensPerPage = 16;
constexpr uint32_t kQHeads = 12;         // groups of 4 query heads per KV head
constexpr uint32_t kPromptTokens = 100;  // 6 full pages and 4 tokens in a 7th
constexpr uint32_t kFullPages = kPromptTokens / kTokensPerPage;

// 2 layers × 3 heads × 16 tokens × 64 × (K, V): 24 KiB pages at bf16, which do not divide the
// 2 MiB segments, so pages straddle segment boundaries in the contiguous mapping.
std::string device_config(const std::string& backend, const std::string& dtype,
                          const std::string& extra = "max_segment_bytes: 2MiB\n") {
  return "backend: " + backend + "\n" + extra +
         "pools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 3, head_dim: 64, "
         "tokens_per_page: 16, dtype: " +
         dtype + "}\n    capacity: 256 pages\n";
}

BlockHash H(uint64_t i) {
  return BlockHash{0x5000 + i, 0xabcdefull * (i + 1)};
}

// The K (kv = 0) or V (kv = 1) value of a prompt token: what a model would compute, here a fixed
// function every worker evaluates the same way.
float kv_value(uint32_t layer, uint32_t token, uint32_t head, uint32_t d, uint32_t kv) {
  uint64_t x = (uint64_t{layer} << 48) ^ (uint64_t{token} << 24) ^ (uint64_t{head} << 16) ^
               (uint64_t{d} << 2) ^ kv;
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  x = (x ^ (x >> 27)) * 0x81dadef4bc2dd44dull;
  return static_cast<float>(static_cast<double>(x >> 40) / double(1 << 24) * 2.0 - 1.0);
}

// Appends prompt tokens [first, last) of every layer into `pages` (page i holds tokens
// 16·i … 16·i + 15 of the prompt, counted from `first_page_token`).
std::string append_tokens(PoolKernels& k, const std::vector<PageId>& pages,
                          uint32_t first_page_token, uint32_t first, uint32_t last) {
  const uint32_t n = last - first;
  std::vector<float> kk(size_t{n} * kKvHeads * kHeadDim);
  std::vector<float> vv(kk.size());
  std::vector<int64_t> slots(n);
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t t = first + i;
      const uint32_t rel = t - first_page_token;
      slots[i] = int64_t{pages[rel / kTokensPerPage]} * kTokensPerPage + rel % kTokensPerPage;
      for (uint32_t h = 0; h < kKvHeads; ++h) {
        for (uint32_t d = 0; d < kHeadDim; ++d) {
          kk[(size_t{i} * kKvHeads + h) * kHeadDim + d] = kv_value(layer, t, h, d, 0);
          vv[(size_t{i} * kKvHeads + h) * kHeadDim + d] = kv_value(layer, t, h, d, 1);
        }
      }
    }
    kernels::AppendArgs a;
    a.layer = layer;
    a.num_tokens = n;
    a.k = kk.data();
    a.v = vv.data();
    a.slots = slots.data();
    if (std::string err = k.append_kv(a); !err.empty()) return err;
  }
  return "";
}

// Decode of one query token over `table` (all 100 prompt tokens) for every layer.
std::vector<float> decode_all_layers(PoolKernels& k, const std::vector<PageId>& table,
                                     std::string& err) {
  std::vector<float> q(size_t{kQHeads} * kHeadDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<float> out(kLayers * q.size());
  const uint32_t context = kPromptTokens;
  for (uint32_t layer = 0; layer < kLayers; ++layer) {
    kernels::DecodeArgs a;
    a.layer = layer;
    a.num_seqs = 1;
    a.num_q_heads = kQHeads;
    a.q = q.data();
    a.out = out.data() + layer * q.size();
    a.block_tables = table.data();
    a.block_table_stride = static_cast<uint32_t>(table.size());
    a.context_lens = &context;
    a.scale = 0.125f;
    a.split_tokens = 32;  // several chunks: the split path and its merge
    err = k.decode(a, context);
    if (!err.empty()) return {};
  }
  return out;
}

// Bytes of page p (data and, for 8-bit pools, its scales).
std::vector<std::byte> page_image(const Connection& c, PageId p) {
  std::vector<std::byte> b(c.page(p), c.page(p) + page_data_bytes(c.pool().geometry));
  if (float* s = c.page_scales(p); s != nullptr) {
    const auto* sb = reinterpret_cast<const std::byte*>(s);
    b.insert(b.end(), sb, sb + page_scale_bytes(c.pool().geometry));
  }
  return b;
}

int open_fds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr)
    ++n;
  ::closedir(d);
  return n;
}

class DevicePool : public ::testing::TestWithParam<std::string> {};

// Worker A computes a prompt's K/V into daemon pages and publishes them; worker B, another
// process, hits the prefix and decodes over A's pages, and that equals B's own recomputation.
TEST_P(DevicePool, SecondWorkerDecodesOverTheFirstWorkersPages) {
  Daemon d(device_config("fake-device", GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  const int a = run_worker([&] {
    auto c = Connection::attach(d.socket(), "worker-a");
    if (!c.ok()) return 1;
    PoolKernels k(*c.value());
    auto pages = c.value()->alloc(kFullPages + 1);
    if (!pages.ok()) return 2;
    if (std::string err = append_tokens(k, pages.value(), 0, 0, kPromptTokens); !err.empty()) {
      std::fprintf(stderr, "worker a: %s\n", err.c_str());
      return 3;
    }
    std::vector<PublishItem> items;
    for (uint32_t i = 0; i < kFullPages; ++i)
      items.push_back({pages.value()[i], H(i)});
    auto r = c.value()->publish(items);
    return r.ok() ? 0 : 4;
  });
  ASSERT_EQ(a, 0) << d.log();
  const int b = run_worker([&] {
    auto c = Connection::attach(d.socket(), "worker-b");
    if (!c.ok()) return 1;
    Connection& conn = *c.value();
    PoolKernels k(conn);
    std::vector<BlockHash> chain;
    for (uint32_t i = 0; i < kFullPages; ++i)
      chain.push_back(H(i));
    auto hits = conn.lookup(chain);
    if (!hits.ok() || hits.value().size() != kFullPages) return 2;
    // The uncached tail goes into a page of B's own; then the whole prompt again, privately.
    auto tail = conn.alloc(1);
    auto own = conn.alloc(kFullPages + 1);
    if (!tail.ok() || !own.ok()) return 3;
    std::string err = append_tokens(k, tail.value(), kFullPages * kTokensPerPage,
                                    kFullPages * kTokensPerPage, kPromptTokens);
    if (err.empty()) err = append_tokens(k, own.value(), 0, 0, kPromptTokens);
    if (!err.empty()) {
      std::fprintf(stderr, "worker b: %s\n", err.c_str());
      return 4;
    }
    for (uint32_t i = 0; i < kFullPages; ++i) {
      if (page_image(conn, hits.value()[i]) != page_image(conn, own.value()[i])) return 5;
    }
    std::vector<PageId> shared_table = hits.value();
    shared_table.push_back(tail.value()[0]);
    const auto shared = decode_all_layers(k, shared_table, err);
    const auto mine = decode_all_layers(k, own.value(), err);
    if (!err.empty() || shared.empty() || shared != mine) return 6;
    for (float x : shared) {
      if (!std::isfinite(x)) return 7;
    }
    return 0;
  });
  EXPECT_EQ(b, 0) << d.log();
  EXPECT_EQ(d.stop(), 0) << d.log();
}

// The daemon copies pages on its side (copy-on-write): bytes and scales arrive; every refused
// request names its cause and copies nothing.
TEST_P(DevicePool, DaemonSideCopyMovesBytesAndScalesAndRefusesBadPairs) {
  for (const std::string backend : {"host", "fake-device"}) {
    Daemon d(device_config(backend, GetParam()));
    ASSERT_TRUE(d.start()) << d.log();
    auto c = Connection::attach(d.socket(), "copier");
    ASSERT_TRUE(c.ok()) << c.error().message;
    Connection& conn = *c.value();
    PoolKernels k(conn);
    auto pages = conn.alloc(4);
    ASSERT_TRUE(pages.ok());
    const std::vector<PageId>& p = pages.value();
    ASSERT_EQ(append_tokens(k, {p[0], p[1]}, 0, 0, 2 * kTokensPerPage), "");
    const auto image0 = page_image(conn, p[0]);
    const auto image1 = page_image(conn, p[1]);
    const auto before2 = page_image(conn, p[2]);
    ASSERT_NE(image0, before2);

    auto refused = [&](std::vector<wire::PageCopy> pairs, Errc code) {
      auto r = conn.copy(pairs);
      EXPECT_FALSE(r.ok()) << backend;
      if (!r.ok()) {
        EXPECT_EQ(r.error().status.code(), code) << r.error().message;
      }
      EXPECT_EQ(page_image(conn, p[2]), before2) << "a refused copy changed a page";
    };
    refused({{p[0], p[2]}, {p[1], p[1]}}, Errc::duplicate_item);  // a page read and written
    refused({{p[0], p[2]}, {p[1], p[2]}}, Errc::duplicate_item);  // written twice
    refused({{p[0], p[2]}, {p[2], p[3]}}, Errc::duplicate_item);  // written, then read
    refused({{p[0], p[2]}, {p[0], 9999}}, Errc::invalid_page);
    auto other = conn.alloc(1);
    ASSERT_TRUE(other.ok());
    ASSERT_TRUE(conn.release(other.value()).ok());
    refused({{p[0], p[2]}, {p[1], other.value()[0]}}, Errc::not_held);
    ASSERT_TRUE(conn.publish(std::vector<PublishItem>{{p[3], H(77)}}).ok());
    refused({{p[0], p[2]}, {p[1], p[3]}}, Errc::already_published);
    const uint64_t too_many = wire::kMaxCopyBytes / page_data_bytes(conn.pool().geometry) + 1;
    refused(std::vector<wire::PageCopy>(too_many, {p[0], p[2]}), Errc::invalid_argument);

    // Two sources to two destinations, one source read twice.
    auto more = conn.alloc(1);
    ASSERT_TRUE(more.ok());
    auto copied = conn.copy(std::vector<wire::PageCopy>{{p[0], p[2]}, {p[1], more.value()[0]}});
    ASSERT_TRUE(copied.ok()) << copied.error().message;
    EXPECT_EQ(copied.value(), 2u);
    EXPECT_EQ(page_image(conn, p[2]), image0);
    EXPECT_EQ(page_image(conn, more.value()[0]), image1);
    c.value().reset();
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DevicePool, ::testing::Values("bf16", "int8", "fp8_e4m3"));

TEST(DevicePoolSegments, PoolIsSeveralSegmentsMappedBackToBackWithoutLeakingDescriptors) {
  Daemon d(device_config("fake-device", "bf16"));
  ASSERT_TRUE(d.start()) << d.log();
  const int fds_before = open_fds();
  {
    auto c = Connection::attach(d.socket(), "segments");
    ASSERT_TRUE(c.ok()) << c.error().message;
    const wire::PoolInfo& info = c.value()->pool();
    EXPECT_EQ(info.backend, "fake-device");
    EXPECT_EQ(info.device, -1);
    EXPECT_EQ(c.value()->device(), -1);
    // 256 pages × 24 KiB = 6 MiB in 2 MiB segments.
    ASSERT_EQ(info.segments.size(), 3u);
    for (const auto& s : info.segments)
      EXPECT_EQ(s.bytes, 2u << 20);
    EXPECT_EQ(info.segment_bytes, 6u << 20);
    // Every byte of the mapping is writable, across the segment boundaries, and the daemon sees
    // what the worker wrote (its copy reads it back into another page).
    auto pages = c.value()->alloc(256);
    ASSERT_TRUE(pages.ok());
    for (PageId p : pages.value())
      std::memset(c.value()->page(p), static_cast<int>(p & 0xff), info.page_stride);
    const PageId straddling = (2u << 20) / static_cast<uint32_t>(info.page_stride);  // 85
    const PageId target = straddling == 0 ? 1 : 0;
    ASSERT_TRUE(c.value()->copy(std::vector<wire::PageCopy>{{straddling, target}}).ok());
    EXPECT_EQ(std::memcmp(c.value()->page(target), c.value()->page(straddling), info.page_stride),
              0);
    EXPECT_GT(open_fds(), fds_before - 1);
  }
  EXPECT_EQ(open_fds(), fds_before) << "attach left descriptors open";
}

// cuda-vmm memory outlives the daemon while workers map it; the fake device shows the same:
// after kill -9 a worker still reads and writes its pages (calls fail cleanly), and a restarted
// daemon starts a fresh pool rather than adopting the old memory.
TEST(DevicePoolSegments, WorkersKeepTheirPagesAcrossADaemonCrash) {
  Daemon d(device_config("fake-device", "bf16"));
  ASSERT_TRUE(d.start()) << d.log();
  auto c = Connection::attach(d.socket(), "survivor");
  ASSERT_TRUE(c.ok()) << c.error().message;
  auto pages = c.value()->alloc(8);
  ASSERT_TRUE(pages.ok());
  for (PageId p : pages.value())
    std::memset(c.value()->page(p), 0x5a, c.value()->pool().page_stride);
  d.kill9();
  for (PageId p : pages.value()) {
    const std::byte* b = c.value()->page(p);
    for (uint64_t i = 0; i < c.value()->pool().page_stride; i += 4099)
      ASSERT_EQ(b[i], std::byte{0x5a});
  }
  auto lost = c.value()->alloc(1);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.error().status.code(), Errc::connection_lost);
  ASSERT_TRUE(d.start()) << d.log();
  auto fresh = Connection::attach(d.socket(), "after-restart");
  ASSERT_TRUE(fresh.ok()) << fresh.error().message;
  auto s = fresh.value()->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().free, 256u);
  EXPECT_EQ(fresh.value()->page(pages.value()[0])[0], std::byte{0}) << "new memory, not the old";
}

// A config that forces a CUDA backend where none is usable stops the daemon at start with the
// cause; auto falls back to host and says why.
TEST(DevicePoolSegments, ForcedCudaBackendWithoutAGpuFailsWithTheCause) {
  for (const std::string backend : {"cuda-vmm", "cuda-ipc"}) {
    Daemon d(device_config(backend, "bf16"));
    if (d.start()) GTEST_SKIP() << backend << " is usable on this machine (tests/gpu/ covers it)";
    const std::string log = d.log();
    EXPECT_NE(log.find(backend), std::string::npos) << log;
    const bool named = log.find("no usable NVIDIA driver") != std::string::npos ||
                       log.find("no CUDA device") != std::string::npos ||
                       log.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(named) << log;
  }
  Daemon d(device_config("auto", "bf16"));
  ASSERT_TRUE(d.start()) << d.log();
  auto c = Connection::attach(d.socket(), "auto");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value()->pool().backend, "host");
  EXPECT_NE(d.log().find("host backend: auto, because cuda-vmm"), std::string::npos) << d.log();
}

TEST(DevicePoolSegments, TooManySegmentsIsAConfigError) {
  Daemon d(device_config("fake-device", "bf16", "max_segment_bytes: 2MiB\n") +
           "  - name: huge\n    geometry: {layers: 2, kv_heads: 3, head_dim: 64, "
           "tokens_per_page: 16, dtype: bf16}\n    capacity: 600MiB\n");
  EXPECT_FALSE(d.start());
  EXPECT_NE(d.log().find("exceed the limit of 253"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace kvpool::testing

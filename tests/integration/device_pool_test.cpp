// Integration tests of the GPU pool's path without a GPU (issue 5): the fake-device backend runs
// the cuda-vmm sequence — create segments, export descriptors, SCM_RIGHTS, import, map back to
// back — on memfd memory. Real kvpoold, real worker processes. The two-worker prompt reuse with
// kernels on the daemon's pages is tests/gpu/pool_check.cpp, run by ctest on fake-device.

#include <dirent.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "tests/gpu/pool_check_util.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;

using gpu_check::append_prompt;
using gpu_check::page_image;
using gpu_check::pool_config;
using gpu_check::prompt_hash;

// 2 layers × 3 heads × 16 tokens × 64 × (K, V): 24 KiB pages at bf16, which do not divide the
// 2 MiB segments, so pages straddle segment boundaries in the contiguous mapping.
std::string straddling_config() {
  return "backend: fake-device\nmax_segment_bytes: 2MiB\n"
         "pools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 3, head_dim: 64, "
         "tokens_per_page: 16, dtype: bf16}\n    capacity: 256 pages\n";
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

// The daemon copies pages on its side (copy-on-write): bytes and scales arrive; every refused
// request names its cause and copies nothing.
TEST_P(DevicePool, DaemonSideCopyMovesBytesAndScalesAndRefusesBadPairs) {
  for (const std::string backend : {"host", "fake-device"}) {
    Daemon d(pool_config(backend, GetParam()));
    ASSERT_TRUE(d.start()) << d.log();
    auto c = Connection::attach(d.socket(), "copier");
    ASSERT_TRUE(c.ok()) << c.error().message;
    Connection& conn = *c.value();
    PoolKernels k(conn);
    auto pages = conn.alloc(4);
    ASSERT_TRUE(pages.ok());
    const std::vector<PageId>& p = pages.value();
    ASSERT_EQ(append_prompt(k, {p[0], p[1]}, 0, 2 * gpu_check::kTokensPerPage), "");
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
    ASSERT_TRUE(conn.publish(std::vector<PublishItem>{{p[3], prompt_hash(77)}}).ok());
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
  Daemon d(straddling_config());
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
  Daemon d(straddling_config());
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
    Daemon d(pool_config(backend, "bf16"));
    if (d.start()) GTEST_SKIP() << backend << " is usable on this machine (tests/gpu/ covers it)";
    const std::string log = d.log();
    EXPECT_NE(log.find(backend), std::string::npos) << log;
    const bool named = log.find("no usable NVIDIA driver") != std::string::npos ||
                       log.find("no CUDA device") != std::string::npos ||
                       log.find("built without CUDA") != std::string::npos;
    EXPECT_TRUE(named) << log;
  }
  Daemon d(pool_config("auto", "bf16"));
  ASSERT_TRUE(d.start()) << d.log();
  auto c = Connection::attach(d.socket(), "auto");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c.value()->pool().backend, "host");
  EXPECT_NE(d.log().find("host backend: auto, because cuda-vmm"), std::string::npos) << d.log();
}

TEST(DevicePoolSegments, TooManySegmentsIsAConfigError) {
  Daemon d(straddling_config() +
           "  - name: huge\n    geometry: {layers: 2, kv_heads: 3, head_dim: 64, "
           "tokens_per_page: 16, dtype: bf16}\n    capacity: 600MiB\n");
  EXPECT_FALSE(d.start());
  EXPECT_NE(d.log().find("exceed the limit of 253"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace kvpool::testing

// PoolKernels on a pool whose geometry is sliding or chunked (common/geometry.h): decode and
// extend take the pool's window without the worker naming it, the same bits as the CPU kernels
// given that mask by hand, and a mask that contradicts the pool's is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "kernels/cpu/kernels_cpu.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;

constexpr uint32_t kT = 16, kHeads = 2, kDim = 64, kTokens = 70, kWindow = 20;

std::string pool_config(const char* kind) {
  return std::string(R"(
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16,
               kind: )") +
         kind + ", window: " + std::to_string(kWindow) + R"(}
    capacity: 16 pages
)";
}

// Writes kTokens tokens of deterministic K/V into `pages` through PoolKernels.
void fill(PoolKernels& k, const std::vector<PageId>& pages) {
  std::vector<int64_t> slots(kTokens);
  std::vector<float> kv(size_t{kTokens} * kHeads * kDim);
  for (uint32_t t = 0; t < kTokens; ++t)
    slots[t] = int64_t{pages[t / kT]} * kT + t % kT;
  for (size_t i = 0; i < kv.size(); ++i)
    kv[i] = std::sin(0.37f * static_cast<float>(i));
  kernels::AppendArgs a;
  a.num_tokens = kTokens;
  a.k = kv.data();
  a.v = kv.data();
  a.slots = slots.data();
  ASSERT_EQ(k.append_kv(a), "");
}

class PoolKernelsMask : public ::testing::TestWithParam<const char*> {};

TEST_P(PoolKernelsMask, DecodeAndExtendTakeThePoolsWindow) {
  Daemon d(pool_config(GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  auto conn = Connection::attach(d.socket(), "w");
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  Connection& c = *conn.value();
  PoolKernels k(c);
  auto pages = c.alloc((kTokens + kT - 1) / kT);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  fill(k, pages.value());

  const uint32_t q_heads = kHeads * 4;
  std::vector<float> q(size_t{kTokens} * q_heads * kDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::cos(0.11f * static_cast<float>(i));
  const uint32_t ctx = kTokens;
  kernels::DecodeArgs a;
  a.num_seqs = 1;
  a.num_q_heads = q_heads;
  a.q = q.data();
  a.block_tables = pages.value().data();
  a.block_table_stride = static_cast<uint32_t>(pages.value().size());
  a.context_lens = &ctx;
  a.scale = 0.125f;
  std::vector<float> pooled(size_t{q_heads} * kDim), by_hand(pooled.size()),
      unmasked(pooled.size());
  a.out = pooled.data();
  ASSERT_EQ(k.decode(a, ctx), "");  // no mask given: the pool's
  kernels::DecodeArgs h = a;
  h.kv = k.paged_kv();
  h.mask = kernels::geometry_mask(c.pool().geometry);
  h.out = by_hand.data();
  ASSERT_EQ(kernels::cpu::decode(h, c.pool().num_pages), "");
  EXPECT_EQ(pooled, by_hand);
  h.mask = kernels::AttentionMask{};
  h.out = unmasked.data();
  ASSERT_EQ(kernels::cpu::decode(h, c.pool().num_pages), "");
  EXPECT_NE(pooled, unmasked);  // the window changed what the query saw
  // Naming the pool's own window is fine; another one is refused, nothing written.
  a.mask = kernels::geometry_mask(c.pool().geometry);
  ASSERT_EQ(k.decode(a, ctx), "");
  std::vector<float> untouched(pooled.size(), 5.0f);
  a.out = untouched.data();
  a.mask = kernels::AttentionMask{};
  a.mask.window_left = 3;
  const std::string e = k.decode(a, ctx);
  EXPECT_NE(e.find("contradicts the pool's " + std::string(GetParam()) + " geometry"),
            std::string::npos)
      << e;
  EXPECT_EQ(untouched, std::vector<float>(pooled.size(), 5.0f));

  // Extend: the last 30 tokens as new ones, against the CPU kernel given the mask by hand.
  const uint32_t offsets[2] = {0, 30};
  kernels::ExtendArgs x;
  x.num_seqs = 1;
  x.num_q_heads = q_heads;
  x.q = q.data();
  x.q_offsets = offsets;
  x.block_tables = a.block_tables;
  x.block_table_stride = a.block_table_stride;
  x.context_lens = &ctx;
  x.scale = 0.125f;
  std::vector<float> ext_pool(size_t{30} * q_heads * kDim), ext_hand(ext_pool.size());
  x.out = ext_pool.data();
  ASSERT_EQ(k.extend(x, 30), "");
  kernels::ExtendArgs xh = x;
  xh.kv = k.paged_kv();
  xh.mask = kernels::geometry_mask(c.pool().geometry);
  xh.out = ext_hand.data();
  ASSERT_EQ(kernels::cpu::extend(xh, c.pool().num_pages), "");
  EXPECT_EQ(ext_pool, ext_hand);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PoolKernelsMask, ::testing::Values("sliding", "chunked"));

}  // namespace
}  // namespace kvpool::testing

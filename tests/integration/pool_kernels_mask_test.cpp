// PoolKernels on a pool whose geometry is sliding or chunked (common/geometry.h): decode and
// extend take the pool's window without the worker naming it, the same bits as the CPU kernels
// given that mask by hand, and a mask that contradicts the pool's is refused. On a sliding pool a
// second worker resumes a sequence whose head was evicted (the lookup answers the blocks the
// window needs, kNoPage before them) and decodes what the first worker decodes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "client/worker/sequence_cache.h"
#include "common/block_hash.h"
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

// The K and V of token t (both heads, K = V): a function of t only, so two workers write the
// same bytes for the same token.
void write_tokens(PoolKernels& k, const client::SequenceCache& seq, uint32_t from, uint32_t to) {
  std::vector<int64_t> slots;
  std::vector<float> kv;
  for (uint32_t t = from; t < to; ++t) {
    const client::SequenceCache::Slot s = seq.slot(t);
    slots.push_back(int64_t{s.page} * kT + s.offset);
    for (uint32_t i = 0; i < kHeads * kDim; ++i)
      kv.push_back(std::sin(0.013f * static_cast<float>(t * kHeads * kDim + i)));
  }
  kernels::AppendArgs a;
  a.num_tokens = to - from;
  a.k = kv.data();
  a.v = kv.data();
  a.slots = slots.data();
  ASSERT_EQ(k.append_kv(a), "");
}

std::vector<float> decode_last(PoolKernels& k, const client::SequenceCache& seq) {
  const uint32_t ctx = seq.tokens();
  std::vector<float> q(size_t{kHeads} * 4 * kDim), out(q.size(), std::nanf(""));
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::cos(0.07f * static_cast<float>(i));
  kernels::DecodeArgs a;
  a.num_seqs = 1;
  a.num_q_heads = kHeads * 4;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = seq.block_table().data();
  a.block_table_stride = static_cast<uint32_t>(seq.block_table().size());
  a.context_lens = &ctx;
  a.scale = 0.125f;
  EXPECT_EQ(k.decode(a, ctx), "");
  return out;
}

// Worker A computes a 128-token prompt on a sliding pool (window 20) and publishes it; its
// SequenceCache lets go of the blocks the window left, and an operator evicts them. Worker B's
// lookup of the same prompt is still a hit of all 8 blocks: the window needs blocks 6 and 7 only
// (the next query, at 128, sees keys 109..128), so B gets those and kNoPage for 0..5, appends one
// token and decodes exactly what A decodes after appending the same token.
TEST(PoolKernelsWindowHit, ASequenceResumesAfterItsHeadWasEvicted) {
  Daemon d(pool_config("sliding"));
  ASSERT_TRUE(d.start()) << d.log();
  auto conn_a = Connection::attach(d.socket(), "a");
  auto conn_b = Connection::attach(d.socket(), "b");
  ASSERT_TRUE(conn_a.ok() && conn_b.ok());
  Connection& a = *conn_a.value();
  Connection& b = *conn_b.value();
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", a.pool().geometry, "", ""});
  std::vector<uint32_t> prompt(128);
  for (uint32_t t = 0; t < 128; ++t)
    prompt[t] = 1000 + t;

  PoolKernels ka(a);
  client::SequenceCache seq_a(a, hasher, root);
  ASSERT_EQ(seq_a.begin(prompt).value(), 0u);
  write_tokens(ka, seq_a, 0, 128);
  ASSERT_TRUE(seq_a.publish_full().ok());
  for (uint32_t blk = 0; blk < 6; ++blk)
    EXPECT_EQ(seq_a.block_table()[blk], kNoPage) << "block " << blk << " is out of the window";
  auto evicted = a.evict(16);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  EXPECT_EQ(evicted.value(), 6u);  // blocks 0..5: A still holds 6 and 7

  // A plain prefix lookup would miss at block 0; the window lookup hits all 8 blocks.
  auto tiers = b.lookup_with_tiers(seq_a.block_hashes());
  ASSERT_TRUE(tiers.ok()) << tiers.error().message;
  ASSERT_EQ(tiers.value().pages.size(), 8u);
  for (uint32_t blk = 0; blk < 6; ++blk) {
    EXPECT_EQ(tiers.value().pages[blk], kNoPage);
    EXPECT_EQ(tiers.value().tiers[blk], wire::kTierNone);
  }
  EXPECT_EQ(tiers.value().pages[6], seq_a.block_table()[6]);
  EXPECT_EQ(tiers.value().pages[7], seq_a.block_table()[7]);
  ASSERT_TRUE(b.release({tiers.value().pages.begin() + 6, tiers.value().pages.end()}).ok());

  PoolKernels kb(b);
  client::SequenceCache seq_b(b, hasher, root);
  ASSERT_EQ(seq_b.begin(prompt).value(), 128u);
  ASSERT_TRUE(seq_a.append(7).ok());
  ASSERT_TRUE(seq_b.append(7).ok());
  write_tokens(ka, seq_a, 128, 129);
  write_tokens(kb, seq_b, 128, 129);
  EXPECT_EQ(decode_last(kb, seq_b), decode_last(ka, seq_a));
  ASSERT_TRUE(seq_b.release().ok());
  ASSERT_TRUE(seq_a.release().ok());
  auto st = a.stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st.value().in_use, 0u);  // nothing leaked, holes included
}

}  // namespace
}  // namespace kvpool::testing

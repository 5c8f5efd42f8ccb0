// A latent (MLA) pool served by a real kvpoold (common/geometry.h, kind latent): worker A writes
// a prompt's vectors through PoolKernels (k only) and publishes its full blocks; worker B,
// another connection, finds them by prefix, appends only its own tail and decodes. Both decodes
// read the same pages, so they agree bit for bit, and both match a dense reference over the
// vectors as bf16 stores them. In both layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "client/worker/sequence_cache.h"
#include "common/block_hash.h"
#include "kernels/kv_dtype.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;
using client::SequenceCache;

constexpr uint32_t kT = 16, kDim = 72, kLatent = 64, kLayers = 2, kPrompt = 40, kHeads = 8;

std::string pool_config(const char* layout) {
  return std::string(R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 1, head_dim: 72, tokens_per_page: 16, dtype: bf16,
               kind: latent}
    capacity: 24 pages
    layout: )") +
         layout + "\n";
}

// The vector of token t in layer l (its latent c, then its rotary key): deterministic.
float element(uint32_t l, uint32_t t, uint32_t x) {
  return std::sin(0.05f * static_cast<float>((l * 131 + t) * kDim + x));
}

// Appends tokens [from, to) of every layer into the cache's slots through PoolKernels.
void write_tokens(PoolKernels& k, const SequenceCache& seq, uint32_t from, uint32_t to) {
  std::vector<int64_t> slots;
  for (uint32_t t = from; t < to; ++t) {
    const SequenceCache::Slot s = seq.slot(t);
    slots.push_back(int64_t{s.page} * kT + s.offset);
  }
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> c_kv;
    for (uint32_t t = from; t < to; ++t) {
      for (uint32_t x = 0; x < kDim; ++x)
        c_kv.push_back(element(l, t, x));
    }
    kernels::AppendArgs a;
    a.layer = l;
    a.num_tokens = to - from;
    a.k = c_kv.data();
    a.slots = slots.data();
    ASSERT_EQ(k.append_kv(a), "");
  }
}

// The bytes of one page (its page_chunks runs) in the attached host pool.
std::vector<std::byte> page_bytes(const PoolKernels& k, PageId page) {
  const kernels::PagedKv kv = k.paged_kv();
  const kernels::PageChunks c = kernels::page_chunks(kv);
  const auto* base = static_cast<const std::byte*>(kv.base) + c.at(page);
  std::vector<std::byte> out;
  for (uint32_t i = 0; i < c.chunks; ++i)
    out.insert(out.end(), base + i * c.chunk, base + i * c.chunk + c.chunk_bytes);
  return out;
}

// Decode of layer 1 for the query at position kPrompt − 1 with kHeads heads, value_dim kLatent.
std::vector<float> decode(PoolKernels& k, const SequenceCache& seq, const std::vector<float>& q) {
  const uint32_t ctx = seq.tokens();
  std::vector<float> out(size_t{kHeads} * kLatent, std::nanf(""));
  kernels::DecodeArgs a;
  a.layer = 1;
  a.num_seqs = 1;
  a.num_q_heads = kHeads;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = seq.block_table().data();
  a.block_table_stride = static_cast<uint32_t>(seq.block_table().size());
  a.context_lens = &ctx;
  a.scale = 1.0f / std::sqrt(float{kDim});
  a.value_dim = kLatent;
  EXPECT_EQ(k.decode(a, ctx), "");
  return out;
}

class PoolKernelsLatent : public ::testing::TestWithParam<const char*> {};

TEST_P(PoolKernelsLatent, APrefixWrittenByOneWorkerDecodesTheSameInAnother) {
  Daemon d(pool_config(GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  auto conn_a = Connection::attach(d.socket(), "a");
  auto conn_b = Connection::attach(d.socket(), "b");
  ASSERT_TRUE(conn_a.ok() && conn_b.ok());
  Connection& a = *conn_a.value();
  Connection& b = *conn_b.value();
  ASSERT_EQ(a.pool().geometry.kind, AttentionKind::latent);
  ASSERT_EQ(page_data_bytes(a.pool().geometry), uint64_t{kLayers} * kT * kDim * 2);
  BlockHasher hasher;
  const BlockHash root = hasher.root({"mla-model", a.pool().geometry, "", ""});
  std::vector<uint32_t> prompt(kPrompt);
  std::iota(prompt.begin(), prompt.end(), 100u);

  PoolKernels ka(a);
  SequenceCache seq_a(a, hasher, root);
  ASSERT_EQ(seq_a.begin(prompt).value(), 0u);
  write_tokens(ka, seq_a, 0, kPrompt);
  ASSERT_TRUE(seq_a.publish_full().ok());

  // A V row is refused on a latent pool, and nothing is written.
  kernels::AppendArgs bad;
  const float row[kDim] = {};
  const int64_t slot = int64_t{seq_a.slot(0).page} * kT;
  bad.num_tokens = 1;
  bad.k = row;
  bad.v = row;
  bad.slots = &slot;
  const std::vector<std::byte> before = page_bytes(ka, seq_a.slot(0).page);
  EXPECT_NE(ka.append_kv(bad).find("v is given for a latent pool"), std::string::npos);
  EXPECT_EQ(page_bytes(ka, seq_a.slot(0).page), before);

  PoolKernels kb(b);
  SequenceCache seq_b(b, hasher, root);
  ASSERT_EQ(seq_b.begin(prompt).value(), 32u);  // two full blocks from worker A
  EXPECT_EQ(seq_b.slot(0).page, seq_a.slot(0).page);
  write_tokens(kb, seq_b, 32, kPrompt);

  std::vector<float> q(size_t{kHeads} * kDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::cos(0.3f * static_cast<float>(i));
  const std::vector<float> out_a = decode(ka, seq_a, q);
  const std::vector<float> out_b = decode(kb, seq_b, q);
  EXPECT_EQ(out_a, out_b);

  // Dense reference over the bf16-rounded vectors: scores over all 72 elements, values the
  // first 64.
  const float scale = 1.0f / std::sqrt(float{kDim});
  for (uint32_t h = 0; h < kHeads; ++h) {
    std::vector<double> s(kPrompt);
    double m = -INFINITY;
    for (uint32_t t = 0; t < kPrompt; ++t) {
      double dot = 0;
      for (uint32_t x = 0; x < kDim; ++x) {
        dot +=
            double{q[h * kDim + x]} * kernels::bf16_to_f32(kernels::f32_to_bf16(element(1, t, x)));
      }
      s[t] = dot * scale;
      m = std::max(m, s[t]);
    }
    double l = 0;
    std::vector<double> o(kLatent, 0.0);
    for (uint32_t t = 0; t < kPrompt; ++t) {
      const double p = std::exp(s[t] - m);
      l += p;
      for (uint32_t x = 0; x < kLatent; ++x)
        o[x] += p * kernels::bf16_to_f32(kernels::f32_to_bf16(element(1, t, x)));
    }
    for (uint32_t x = 0; x < kLatent; ++x)
      ASSERT_NEAR(out_a[h * kLatent + x], o[x] / l, 1e-4) << "head " << h << " element " << x;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PoolKernelsLatent,
                         ::testing::Values("page_major", "layer_major"));

}  // namespace
}  // namespace kvpool::testing

// CPU paged-attention decode and extend against a dense fp64 reference on the gathered,
// dequantised K/V of each sequence. Pools come from a random permutation of three times the pages
// needed, and every slot that holds no real token starts as a NaN bit pattern of the KV dtype (as
// do other layers and the scales of unused pages), so reading outside a sequence shows up.
// Tolerance follows FlashAttention's tests: the kernel's largest error against fp64 may be at most
// twice that of a naive fp32 implementation, plus 1e-5 · max|v|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::kernels {
namespace {

using test::ErrorTally;
using test::TestPool;

constexpr uint32_t kLayers = 2;
constexpr uint32_t kLayer = 1;  // layer 0 of every page stays NaN

// A pool holding num_seqs sequences of the given lengths, with their block tables (unused
// entries kNoPage) and the dequantised K and V each sequence gathers to.
struct Batch {
  explicit Batch(TestPool p) : pool(std::move(p)) {}
  TestPool pool;
  uint32_t stride = 0;
  std::vector<PageId> tables;
  std::vector<uint32_t> ctx;
  std::vector<std::vector<float>> k, v;  // per sequence: [ctx][kv_heads][D]
  double max_abs_v = 0.0;
};

Geometry geometry(KvDtype dtype, uint32_t t_page, uint32_t d, uint32_t kv_heads) {
  Geometry g;
  g.layers = kLayers;
  g.kv_heads = kv_heads;
  g.head_dim = d;
  g.tokens_per_page = t_page;
  g.dtype = dtype;
  return g;
}

uint32_t pages_for(uint32_t tokens, uint32_t t_page) {
  return (tokens + t_page - 1) / t_page;
}

Batch make_batch(const Geometry& g, const std::vector<uint32_t>& ctx, uint64_t seed) {
  uint32_t needed = 0;
  uint32_t widest = 0;
  for (uint32_t c : ctx) {
    needed += pages_for(c, g.tokens_per_page);
    widest = std::max(widest, pages_for(c, g.tokens_per_page));
  }
  Batch b(TestPool(g, 3 * needed + 1, seed));
  b.stride = widest + 2;
  b.tables.assign(ctx.size() * b.stride, kNoPage);
  b.ctx = ctx;
  for (size_t s = 0; s < ctx.size(); ++s) {
    const std::vector<PageId> pages = b.pool.take_pages(pages_for(ctx[s], g.tokens_per_page));
    std::copy(pages.begin(), pages.end(), b.tables.begin() + static_cast<long>(s * b.stride));
    const size_t n = size_t{ctx[s]} * g.kv_heads * g.head_dim;
    const std::vector<float> k = test::random_normal(b.pool.rng(), n, 1.0f);
    const std::vector<float> v = test::random_normal(b.pool.rng(), n, 1.0f);
    b.pool.write_sequence(kLayer, pages, k.data(), v.data(), ctx[s]);
    b.k.push_back(b.pool.gather(kLayer, pages, ctx[s], 0));
    b.v.push_back(b.pool.gather(kLayer, pages, ctx[s], 1));
    for (float x : b.v.back())
      b.max_abs_v = std::max(b.max_abs_v, double{std::fabs(x)});
  }
  return b;
}

std::string dtype_tag(KvDtype d) {
  switch (d) {
    case KvDtype::fp16:
      return "fp16";
    case KvDtype::bf16:
      return "bf16";
    case KvDtype::fp8_e4m3:
      return "fp8";
    case KvDtype::int8:
      return "int8";
  }
  return "?";
}

// Decode -----------------------------------------------------------------------------------------

// The instruction sets this CPU can run: decode is checked in each of them.
std::vector<cpu::Isa> test_isas() {
  std::vector<cpu::Isa> isas{cpu::Isa::baseline};
  if (cpu::isa_supported(cpu::Isa::avx2)) isas.push_back(cpu::Isa::avx2);
  return isas;
}

struct DecodeCase {
  KvDtype dtype;
  uint32_t t_page, d, kv_heads, group;
  std::vector<uint32_t> ctx;
  unsigned threads;
};

std::string decode_name(const testing::TestParamInfo<DecodeCase>& info) {
  const DecodeCase& c = info.param;
  return dtype_tag(c.dtype) + "_T" + std::to_string(c.t_page) + "_D" + std::to_string(c.d) + "_H" +
         std::to_string(c.kv_heads) + "_G" + std::to_string(c.group) + "_B" +
         std::to_string(c.ctx.size()) + "_" + std::to_string(info.index);
}

class DecodeAttention : public testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeAttention, MatchesFp64ReferenceWithAndWithoutSplits) {
  const DecodeCase& c = GetParam();
  const Geometry g = geometry(c.dtype, c.t_page, c.d, c.kv_heads);
  Batch b = make_batch(g, c.ctx, 1234 + c.d + c.t_page);
  const uint32_t num_seqs = static_cast<uint32_t>(c.ctx.size());
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{num_seqs} * hq;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

  std::vector<double> ref(rows * c.d);
  std::vector<float> naive(rows * c.d);
  for (uint32_t s = 0; s < num_seqs; ++s) {
    for (uint32_t h = 0; h < hq; ++h) {
      const size_t r = size_t{s} * hq + h;
      test::reference_attention(q.data() + r * c.d, b.k[s].data(), b.v[s].data(), c.kv_heads, c.d,
                                h / c.group, b.ctx[s], scale, ref.data() + r * c.d,
                                naive.data() + r * c.d);
    }
  }

  for (const cpu::Isa isa : test_isas()) {
    if (isa == cpu::Isa::avx2 && c.d % 8 != 0) continue;  // the AVX2 loops need d % 8 == 0
    for (uint32_t split : {0u, c.t_page, 2 * c.t_page, 1u << 20}) {
      SCOPED_TRACE("isa " + std::string(cpu::isa_name(isa)) + ", split_tokens " +
                   std::to_string(split));
      std::vector<float> out(rows * c.d, std::nanf(""));
      DecodeArgs a;
      a.kv = b.pool.kv();
      a.layer = kLayer;
      a.num_seqs = num_seqs;
      a.num_q_heads = hq;
      a.q = q.data();
      a.out = out.data();
      a.block_tables = b.tables.data();
      a.block_table_stride = b.stride;
      a.context_lens = b.ctx.data();
      a.scale = scale;
      a.split_tokens = split;
      ASSERT_EQ(cpu::decode(a, b.pool.num_pages(), c.threads, isa), "");
      ErrorTally tally;
      tally.max_abs_v = b.max_abs_v;
      for (size_t r = 0; r < rows; ++r) {
        tally.add(out.data() + r * c.d, naive.data() + r * c.d, ref.data() + r * c.d, c.d);
      }
      EXPECT_TRUE(tally.ok()) << "non-finite " << tally.non_finite << ", kernel error "
                              << tally.kernel_err << " > bound " << tally.bound()
                              << " (naive fp32 error " << tally.naive_err << ")";
    }
  }
}

// Context lengths straddle page boundaries (1, T−1, T, T+1, several pages) and include long ones.
INSTANTIATE_TEST_SUITE_P(
    Cases, DecodeAttention,
    testing::Values(DecodeCase{KvDtype::fp16, 16, 128, 2, 4, {1, 15, 16, 17, 53, 100, 32}, 3},
                    DecodeCase{KvDtype::bf16, 8, 64, 1, 8, {9, 39, 3000}, 2},
                    DecodeCase{KvDtype::int8, 32, 256, 2, 1, {31, 33, 200}, 3},
                    DecodeCase{KvDtype::fp8_e4m3, 16, 128, 2, 4, {1, 15, 16, 17, 64, 90, 1500}, 4},
                    DecodeCase{KvDtype::bf16, 32, 128, 4, 1, {3000}, 4},
                    DecodeCase{KvDtype::fp16, 8, 256, 1, 4, {7, 8, 9}, 1},
                    DecodeCase{KvDtype::int8, 16, 64, 2, 8, {1, 15, 16, 17, 48, 49, 130}, 2},
                    DecodeCase{KvDtype::fp8_e4m3, 8, 64, 1, 1, {2999}, 3},
                    DecodeCase{KvDtype::bf16, 32, 256, 1, 8, {31, 32, 33}, 2},
                    // A head dim that is not a multiple of the kernels' vector width.
                    DecodeCase{KvDtype::fp16, 16, 72, 2, 4, {33, 70, 5}, 2}),
    decode_name);

DecodeArgs decode_args(Batch& b, uint32_t hq, const std::vector<float>& q, std::vector<float>& out,
                       uint32_t split) {
  DecodeArgs a;
  a.kv = b.pool.kv();
  a.layer = kLayer;
  a.num_seqs = static_cast<uint32_t>(b.ctx.size());
  a.num_q_heads = hq;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = b.tables.data();
  a.block_table_stride = b.stride;
  a.context_lens = b.ctx.data();
  a.scale = 0.125f;
  a.split_tokens = split;
  return a;
}

TEST(DecodeAttentionDeterminism, SameBitsForAnyThreadCount) {
  for (const KvDtype dtype : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    const Geometry g = geometry(dtype, 16, 64, 2);
    Batch b = make_batch(g, {700, 5, 333}, 7);
    const uint32_t hq = 8;
    const std::vector<float> q = test::random_normal(b.pool.rng(), 3 * hq * 64, 1.0f);
    for (const cpu::Isa isa : test_isas()) {
      std::vector<float> first(q.size());
      ASSERT_EQ(cpu::decode(decode_args(b, hq, q, first, 64), b.pool.num_pages(), 1, isa), "");
      for (unsigned threads : {2u, 3u, 8u}) {
        std::vector<float> out(q.size());
        ASSERT_EQ(cpu::decode(decode_args(b, hq, q, out, 64), b.pool.num_pages(), threads, isa),
                  "");
        EXPECT_EQ(std::memcmp(out.data(), first.data(), out.size() * sizeof(float)), 0)
            << cpu::isa_name(isa) << ", " << threads << " threads";
      }
    }
  }
}

TEST(DecodeAttentionDeterminism, EmptyBatchWritesNothing) {
  const Geometry g = geometry(KvDtype::fp16, 16, 64, 2);
  Batch b = make_batch(g, {5}, 8);
  DecodeArgs a;
  a.kv = b.pool.kv();
  a.num_q_heads = 2;
  EXPECT_EQ(cpu::decode(a, b.pool.num_pages()), "");
}

// Extend -----------------------------------------------------------------------------------------

struct ExtendCase {
  KvDtype dtype;
  uint32_t t_page, d, kv_heads, group;
  std::vector<std::pair<uint32_t, uint32_t>> seqs;  // (cached prefix, new tokens)
  unsigned threads;
};

std::string extend_name(const testing::TestParamInfo<ExtendCase>& info) {
  const ExtendCase& c = info.param;
  return dtype_tag(c.dtype) + "_T" + std::to_string(c.t_page) + "_D" + std::to_string(c.d) + "_H" +
         std::to_string(c.kv_heads) + "_G" + std::to_string(c.group) + "_B" +
         std::to_string(c.seqs.size()) + "_" + std::to_string(info.index);
}

class ExtendAttention : public testing::TestWithParam<ExtendCase> {};

TEST_P(ExtendAttention, MatchesCausalFp64Reference) {
  const ExtendCase& c = GetParam();
  const Geometry g = geometry(c.dtype, c.t_page, c.d, c.kv_heads);
  std::vector<uint32_t> ctx;
  std::vector<uint32_t> q_offsets{0};
  for (auto [prefix, n_new] : c.seqs) {
    ctx.push_back(prefix + n_new);
    q_offsets.push_back(q_offsets.back() + n_new);
  }
  Batch b = make_batch(g, ctx, 99 + c.d + c.t_page);
  const auto num_seqs = static_cast<uint32_t>(ctx.size());
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{q_offsets.back()} * hq;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));

  std::vector<float> out(rows * c.d, std::nanf(""));
  ExtendArgs a;
  a.kv = b.pool.kv();
  a.layer = kLayer;
  a.num_seqs = num_seqs;
  a.num_q_heads = hq;
  a.q = q.data();
  a.out = out.data();
  a.q_offsets = q_offsets.data();
  a.block_tables = b.tables.data();
  a.block_table_stride = b.stride;
  a.context_lens = b.ctx.data();
  a.scale = scale;
  ASSERT_EQ(cpu::extend(a, b.pool.num_pages(), c.threads), "");

  ErrorTally tally;
  tally.max_abs_v = b.max_abs_v;
  std::vector<double> ref(c.d);
  std::vector<float> naive(c.d);
  for (uint32_t s = 0; s < num_seqs; ++s) {
    const uint32_t n_new = q_offsets[s + 1] - q_offsets[s];
    for (uint32_t i = 0; i < n_new; ++i) {
      const uint32_t pos = ctx[s] - n_new + i;
      for (uint32_t h = 0; h < hq; ++h) {
        const size_t r = (size_t{q_offsets[s]} + i) * hq + h;
        test::reference_attention(q.data() + r * c.d, b.k[s].data(), b.v[s].data(), c.kv_heads, c.d,
                                  h / c.group, pos + 1, scale, ref.data(), naive.data());
        tally.add(out.data() + r * c.d, naive.data(), ref.data(), c.d);
      }
    }
  }
  EXPECT_TRUE(tally.ok()) << "non-finite " << tally.non_finite << ", kernel error "
                          << tally.kernel_err << " > bound " << tally.bound()
                          << " (naive fp32 error " << tally.naive_err << ")";
}

// New-token counts 1, 5 and T+3, with and without a cached prefix (prefixes on both sides of page
// boundaries), a sequence with no new tokens, and one new-token run longer than a query block.
INSTANTIATE_TEST_SUITE_P(
    Cases, ExtendAttention,
    testing::Values(ExtendCase{KvDtype::fp16,
                               16,
                               128,
                               2,
                               4,
                               {{0, 1}, {0, 5}, {0, 19}, {16, 5}, {17, 19}, {40, 1}, {3, 0}},
                               3},
                    ExtendCase{KvDtype::bf16, 8, 64, 1, 8, {{0, 11}, {7, 1}, {8, 5}}, 2},
                    ExtendCase{KvDtype::int8, 32, 256, 2, 1, {{31, 35}, {0, 35}, {64, 1}}, 3},
                    ExtendCase{KvDtype::fp8_e4m3, 16, 64, 2, 4, {{3000, 5}, {15, 19}, {0, 1}}, 2},
                    ExtendCase{KvDtype::bf16, 16, 256, 1, 4, {{100, 19}}, 1},
                    ExtendCase{KvDtype::fp16, 8, 72, 1, 1, {{0, 40}, {9, 11}}, 2}),
    extend_name);

TEST(ExtendAttentionDeterminism, SameBitsForAnyThreadCount) {
  const Geometry g = geometry(KvDtype::fp8_e4m3, 8, 64, 2);
  Batch b = make_batch(g, {70, 40}, 11);
  const std::vector<uint32_t> q_offsets{0, 37, 40};
  const uint32_t hq = 4;
  const std::vector<float> q = test::random_normal(b.pool.rng(), 40 * hq * 64, 1.0f);
  auto run = [&](unsigned threads) {
    std::vector<float> out(q.size());
    ExtendArgs a;
    a.kv = b.pool.kv();
    a.layer = kLayer;
    a.num_seqs = 2;
    a.num_q_heads = hq;
    a.q = q.data();
    a.out = out.data();
    a.q_offsets = q_offsets.data();
    a.block_tables = b.tables.data();
    a.block_table_stride = b.stride;
    a.context_lens = b.ctx.data();
    a.scale = 0.125f;
    EXPECT_EQ(cpu::extend(a, b.pool.num_pages(), threads), "");
    return out;
  };
  const std::vector<float> first = run(1);
  for (unsigned threads : {2u, 5u}) {
    const std::vector<float> out = run(threads);
    EXPECT_EQ(std::memcmp(out.data(), first.data(), out.size() * sizeof(float)), 0) << threads;
  }
}

// Argument validation ----------------------------------------------------------------------------

// A valid two-sequence int8 problem for both kernels; each test breaks one argument.
class AttentionValidation : public testing::Test {
 protected:
  AttentionValidation()
      : b_(make_batch(geometry(KvDtype::int8, 8, 64, 2), {5, 20}, 3)),
        q_(25 * kHq * 64, 1.0f),
        out_(q_.size(), 7.0f) {}

  static constexpr uint32_t kHq = 4;

  DecodeArgs decode() {
    DecodeArgs a = decode_args(b_, kHq, q_, out_, 0);
    a.num_seqs = 2;
    return a;
  }
  ExtendArgs extend() {
    ExtendArgs a;
    a.kv = b_.pool.kv();
    a.layer = kLayer;
    a.num_seqs = 2;
    a.num_q_heads = kHq;
    a.q = q_.data();
    a.out = out_.data();
    a.q_offsets = q_offsets_.data();
    a.block_tables = b_.tables.data();
    a.block_table_stride = b_.stride;
    a.context_lens = b_.ctx.data();
    a.scale = 0.125f;
    return a;
  }
  // Runs both kernels (as far as the argument applies) and expects an error naming `what` and
  // an untouched output.
  void expect_decode_error(const DecodeArgs& a, const std::string& what) {
    const std::string e = cpu::decode(a, b_.pool.num_pages(), 2);
    EXPECT_NE(e.find(what), std::string::npos) << "message: '" << e << "'";
    expect_untouched();
  }
  void expect_extend_error(const ExtendArgs& a, const std::string& what) {
    const std::string e = cpu::extend(a, b_.pool.num_pages(), 2);
    EXPECT_NE(e.find(what), std::string::npos) << "message: '" << e << "'";
    expect_untouched();
  }
  void expect_untouched() {
    for (float x : out_)
      ASSERT_EQ(x, 7.0f);
  }

  Batch b_;
  std::vector<float> q_;
  std::vector<float> out_;
  std::vector<uint32_t> q_offsets_{0, 5, 25};
};

TEST_F(AttentionValidation, ValidArgumentsPass) {
  EXPECT_EQ(cpu::decode(decode(), b_.pool.num_pages()), "");
  EXPECT_EQ(cpu::extend(extend(), b_.pool.num_pages()), "");
}

TEST_F(AttentionValidation, BadLayer) {
  DecodeArgs d = decode();
  d.layer = kLayers;
  expect_decode_error(d, "layer");
  ExtendArgs x = extend();
  x.layer = 9;
  expect_extend_error(x, "layer");
}

TEST_F(AttentionValidation, QueryHeadsNotAMultipleOfKvHeads) {
  DecodeArgs d = decode();
  d.num_q_heads = 3;
  expect_decode_error(d, "num_q_heads");
  d.num_q_heads = 0;
  expect_decode_error(d, "num_q_heads");
  ExtendArgs x = extend();
  x.num_q_heads = 5;
  expect_extend_error(x, "num_q_heads");
}

TEST_F(AttentionValidation, PageIdOutOfRange) {
  // The second sequence's third page (its last): everything before it is valid.
  b_.tables[b_.stride + 2] = b_.pool.num_pages();
  expect_decode_error(decode(), "block_tables[1][2]");
  expect_extend_error(extend(), "block_tables[1][2]");
}

TEST_F(AttentionValidation, ZeroContext) {
  b_.ctx[1] = 0;
  expect_decode_error(decode(), "context_lens[1]");
  q_offsets_ = {0, 5, 5};
  expect_extend_error(extend(), "context_lens[1]");
}

TEST_F(AttentionValidation, ContextBeyondBlockTable) {
  b_.ctx[0] = 8 * b_.stride + 1;
  expect_decode_error(decode(), "block_table_stride");
  expect_extend_error(extend(), "block_table_stride");
}

TEST_F(AttentionValidation, MissingScalesForAnEightBitPool) {
  DecodeArgs d = decode();
  d.kv.scales = nullptr;
  expect_decode_error(d, "kv.scales");
  ExtendArgs x = extend();
  x.kv.scales = nullptr;
  expect_extend_error(x, "kv.scales");
}

TEST_F(AttentionValidation, PageStrideBelowPageSize) {
  DecodeArgs d = decode();
  d.kv.page_stride = page_data_bytes(d.kv.geometry) - 1;
  expect_decode_error(d, "kv.page_stride");
}

TEST_F(AttentionValidation, ExtendMoreNewTokensThanContext) {
  q_offsets_ = {0, 6, 26};  // sequence 0 holds 5 tokens
  expect_extend_error(extend(), "q_offsets[1]");
  q_offsets_ = {1, 5, 25};
  expect_extend_error(extend(), "q_offsets[0]");
}

}  // namespace
}  // namespace kvpool::kernels

// CPU kernels on a latent (MLA) pool (kernels/paged_kv.h): one vector of head_dim elements per
// token and layer, no V. Decode and extend are MQA over that vector, with the whole vector as the
// key and its first value_dim elements as the value (scores = q_latent·c + q_rope·k_rope, out =
// softmax · c), checked against a dense fp64 reference computed from the definitions, for every
// dtype, both layouts, query groups of 1, 16 and 128 (DeepSeek-V3's heads), DeepSeek-V3's 576 =
// 512 + 64 and a small shape that the AVX2 path does not take. Append writes only the vector,
// copy-pages moves a latent page's runs and scale; every slot no sequence holds is NaN, so a
// read outside a sequence shows up as a non-finite output.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::kernels {
namespace {

using test::ErrorTally;
using test::TestPool;

constexpr uint32_t kLayer = 1;

struct LatentCase {
  KvDtype dtype;
  KvLayout layout;
  uint32_t t_page, d, value_dim, q_heads;
  std::vector<std::pair<uint32_t, uint32_t>> seqs;  // (cached prefix, new tokens ≥ 1)
};

std::string latent_name(const testing::TestParamInfo<LatentCase>& p) {
  const LatentCase& c = p.param;
  return std::string(dtype_name(c.dtype)) + "_" + std::string(layout_name(c.layout)) + "_D" +
         std::to_string(c.d) + "_V" + std::to_string(c.value_dim) + "_H" +
         std::to_string(c.q_heads) + "_" + std::to_string(p.index);
}

Geometry latent_geometry(KvDtype dtype, uint32_t t_page, uint32_t d) {
  Geometry g{2, 1, d, t_page, dtype};
  g.kind = AttentionKind::latent;
  return g;
}

// Sequences written into a fresh pool of three times the pages they need (the rest NaN).
struct LatentBatch {
  explicit LatentBatch(const LatentCase& c)
      : g(latent_geometry(c.dtype, c.t_page, c.d)),
        pool(g, pages_needed(c) * 3 + 1, 11 + c.d, c.layout) {
    for (auto [prefix, n_new] : c.seqs)
      ctx.push_back(prefix + n_new);
    for (uint32_t n : ctx)
      stride = std::max(stride, (n + c.t_page - 1) / c.t_page + 1);
    tables.assign(ctx.size() * stride, kNoPage);
    for (size_t s = 0; s < ctx.size(); ++s) {
      const std::vector<PageId> pages = pool.take_pages((ctx[s] + c.t_page - 1) / c.t_page);
      std::copy(pages.begin(), pages.end(), tables.begin() + static_cast<long>(s * stride));
      const std::vector<float> c_kv = test::random_normal(pool.rng(), size_t{ctx[s]} * c.d, 1.0f);
      pool.write_sequence(kLayer, pages, c_kv.data(), nullptr, ctx[s]);
      k.push_back(pool.gather(kLayer, pages, ctx[s], 0));
      for (float x : k.back())
        max_abs = std::max(max_abs, double{std::fabs(x)});
    }
  }
  static uint32_t pages_needed(const LatentCase& c) {
    uint32_t n = 0;
    for (auto [prefix, n_new] : c.seqs)
      n += (prefix + n_new + c.t_page - 1) / c.t_page;
    return n;
  }
  Geometry g;
  TestPool pool;
  uint32_t stride = 0;
  std::vector<PageId> tables;
  std::vector<uint32_t> ctx;
  std::vector<std::vector<float>> k;  // the dequantised vectors, [ctx][d]
  double max_abs = 0.0;
};

// The reference of query row q (d wide) at position pos of sequence s: attention over keys
// [0, pos] with the vectors as keys and as values; its first value_dim elements are the MLA
// output (each output element depends only on the same element of the values).
void reference(const LatentCase& c, const LatentBatch& b, uint32_t s, uint32_t pos, const float* q,
               float scale, std::vector<double>& ref, std::vector<float>& naive) {
  ref.resize(c.d);
  naive.resize(c.d);
  test::reference_attention(q, b.k[s].data(), b.k[s].data(), 1, c.d, 0, pos + 1, scale, ref.data(),
                            naive.data());
}

void expect_within(const ErrorTally& t) {
  EXPECT_TRUE(t.ok()) << "non-finite " << t.non_finite << ", kernel error " << t.kernel_err
                      << " > bound " << t.bound() << " (naive fp32 error " << t.naive_err << ")";
}

class LatentAttention : public testing::TestWithParam<LatentCase> {};

TEST_P(LatentAttention, DecodeMatchesTheReference) {
  const LatentCase& c = GetParam();
  const uint32_t dv = value_width(latent_geometry(c.dtype, c.t_page, c.d), c.value_dim);
  LatentBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  const size_t rows = size_t{num_seqs} * c.q_heads;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<std::vector<double>> ref(rows);
  std::vector<std::vector<float>> naive(rows);
  for (uint32_t s = 0; s < num_seqs; ++s) {
    for (uint32_t h = 0; h < c.q_heads; ++h) {
      const size_t r = size_t{s} * c.q_heads + h;
      reference(c, b, s, b.ctx[s] - 1, q.data() + r * c.d, scale, ref[r], naive[r]);
    }
  }
  std::vector<cpu::Isa> isas{cpu::Isa::baseline};
  if (cpu::isa_supported(cpu::Isa::avx2) && c.d % 8 == 0 && dv % 8 == 0) {
    isas.push_back(cpu::Isa::avx2);
  }
  for (const cpu::Isa isa : isas) {
    for (uint32_t split : {0u, c.t_page, 1u << 20}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", split_tokens " + std::to_string(split));
      // One guard row past the output: value_dim-wide rows must not spill into it.
      std::vector<float> out((rows + 1) * dv, std::nanf(""));
      DecodeArgs a = test::decode_args(b.pool, kLayer, c.q_heads, b.tables, b.stride, b.ctx,
                                       q.data(), out.data(), scale);
      a.split_tokens = split;
      a.value_dim = c.value_dim;  // 0 in one case: head_dim
      ASSERT_EQ(cpu::decode(a, b.pool.num_pages(), 2, isa), "");
      ErrorTally tally;
      tally.max_abs_v = b.max_abs;
      for (size_t r = 0; r < rows; ++r) {
        tally.add(out.data() + r * dv, naive[r].data(), ref[r].data(), dv);
      }
      expect_within(tally);
      for (uint32_t x = 0; x < dv; ++x)
        ASSERT_TRUE(std::isnan(out[rows * dv + x])) << "guard element " << x;
    }
  }
}

TEST_P(LatentAttention, ExtendMatchesTheReference) {
  const LatentCase& c = GetParam();
  const uint32_t dv = value_width(latent_geometry(c.dtype, c.t_page, c.d), c.value_dim);
  LatentBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  std::vector<uint32_t> q_offsets{0};
  for (auto [prefix, n_new] : c.seqs)
    q_offsets.push_back(q_offsets.back() + n_new);
  const size_t rows = size_t{q_offsets.back()} * c.q_heads;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<float> out((rows + 1) * dv, std::nanf(""));
  ExtendArgs a = test::extend_args(b.pool, kLayer, c.q_heads, b.tables, b.stride, b.ctx, q_offsets,
                                   q.data(), out.data(), scale);
  a.value_dim = c.value_dim;  // 0 in one case: head_dim
  ASSERT_EQ(cpu::extend(a, b.pool.num_pages(), 2), "");

  ErrorTally tally;
  tally.max_abs_v = b.max_abs;
  std::vector<double> ref;
  std::vector<float> naive;
  for (uint32_t s = 0; s < num_seqs; ++s) {
    const uint32_t n_new = q_offsets[s + 1] - q_offsets[s];
    for (uint32_t i = 0; i < n_new; ++i) {
      const uint32_t pos = b.ctx[s] - n_new + i;
      for (uint32_t h = 0; h < c.q_heads; ++h) {
        const size_t r = (size_t{q_offsets[s]} + i) * c.q_heads + h;
        reference(c, b, s, pos, q.data() + r * c.d, scale, ref, naive);
        tally.add(out.data() + r * dv, naive.data(), ref.data(), dv);
      }
    }
  }
  expect_within(tally);
  for (uint32_t x = 0; x < dv; ++x)
    ASSERT_TRUE(std::isnan(out[rows * dv + x])) << "guard element " << x;
}

std::vector<LatentCase> latent_cases() {
  std::vector<LatentCase> out;
  const std::vector<std::pair<uint32_t, uint32_t>> seqs{{0, 1}, {40, 3}, {150, 20}};
  for (KvDtype dt : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    for (KvLayout layout : {KvLayout::page_major, KvLayout::layer_major}) {
      out.push_back({dt, layout, 64, 576, 512, 16, seqs});  // DeepSeek-V3, 16 heads a GPU
      out.push_back({dt, layout, 16, 36, 28, 3, seqs});     // not AVX2-shaped
    }
  }
  out.push_back({KvDtype::bf16, KvLayout::page_major, 64, 576, 512, 128, {{0, 2}, {70, 5}}});
  out.push_back({KvDtype::bf16, KvLayout::layer_major, 64, 576, 512, 1, seqs});
  out.push_back({KvDtype::fp16, KvLayout::page_major, 16, 64, 64, 4, seqs});  // V = whole vector
  out.push_back({KvDtype::fp16, KvLayout::page_major, 16, 64, 0, 4, seqs});   // 0 = head_dim
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, LatentAttention, testing::ValuesIn(latent_cases()), latent_name);

// value_dim 0 means head_dim in the expected output width.
TEST(LatentKernels, ValueDimZeroIsTheWholeVector) {
  EXPECT_EQ(value_width(latent_geometry(KvDtype::fp16, 16, 64), 0), 64u);
  EXPECT_EQ(value_width(latent_geometry(KvDtype::fp16, 16, 576), 512), 512u);
}

TEST(LatentKernels, BadValueDimsAreRefusedByName) {
  const Geometry g = latent_geometry(KvDtype::bf16, 16, 64);
  TestPool pool(g, 4, 1);
  const std::vector<PageId> table{0};
  const uint32_t ctx = 1;
  std::vector<float> q(64, 0.5f), out(64, std::nanf(""));
  DecodeArgs a;
  a.kv = pool.kv();
  a.num_seqs = 1;
  a.num_q_heads = 1;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = table.data();
  a.block_table_stride = 1;
  a.context_lens = &ctx;
  a.value_dim = 65;
  EXPECT_EQ(cpu::decode(a, 4), "value_dim 65 exceeds the latent vector's head_dim 64");
  EXPECT_TRUE(std::isnan(out[0]));

  Geometry full{2, 1, 64, 16, KvDtype::bf16};
  TestPool full_pool(full, 4, 1);
  a.kv = full_pool.kv();
  a.value_dim = 32;
  EXPECT_EQ(cpu::decode(a, 4),
            "value_dim 32 on a full pool, whose value rows are head_dim 64 wide (only a latent "
            "pool takes another width)");
  ExtendArgs e;
  const uint32_t offsets[2] = {0, 1};
  e.kv = full_pool.kv();
  e.num_seqs = 1;
  e.num_q_heads = 1;
  e.q = q.data();
  e.out = out.data();
  e.q_offsets = offsets;
  e.block_tables = table.data();
  e.block_table_stride = 1;
  e.context_lens = &ctx;
  e.value_dim = 32;
  EXPECT_NE(cpu::extend(e, 4).find("value_dim 32 on a full pool"), std::string::npos);
  EXPECT_TRUE(std::isnan(out[0]));
}

// Append on a latent pool writes each token's one vector (and its page's scale) and nothing else:
// read back it is the input within the dtype's rounding, and every other slot keeps its NaN.
class LatentAppend : public testing::TestWithParam<std::pair<KvDtype, KvLayout>> {};

TEST_P(LatentAppend, WritesTheVectorOnlyAndCopiesPages) {
  const auto [dtype, layout] = GetParam();
  const Geometry g = latent_geometry(dtype, 8, 40);
  TestPool pool(g, 6, 3, layout);
  const std::vector<PageId> pages{4, 1};
  const uint32_t tokens = 11;  // page 4 full, page 1 three tokens
  const std::vector<float> c_kv =
      test::random_normal(pool.rng(), size_t{tokens} * g.head_dim, 1.0f);
  std::vector<int64_t> slots;
  for (uint32_t t = 0; t < tokens; ++t)
    slots.push_back(int64_t{pages[t / 8]} * 8 + t % 8);
  const std::vector<std::byte> before = pool.bytes();
  AppendArgs a;
  a.kv = pool.kv();
  a.layer = kLayer;
  a.num_tokens = tokens;
  a.k = c_kv.data();
  a.slots = slots.data();
  a.v = c_kv.data();
  EXPECT_EQ(cpu::append_kv(a, pool.num_pages()),
            "append_kv: v is given for a latent pool, which keeps one vector per token (pass it "
            "as k)");
  EXPECT_EQ(pool.bytes(), before);
  a.v = nullptr;
  ASSERT_EQ(cpu::append_kv(a, pool.num_pages()), "");

  const std::vector<float> back = pool.gather(kLayer, pages, tokens, 0);
  for (size_t i = 0; i < back.size(); ++i) {
    const float tol = dtype_is_quantized(dtype) ? 0.1f : 0.01f;
    ASSERT_NEAR(back[i], c_kv[i], tol * (1.0f + std::fabs(c_kv[i]))) << "element " << i;
  }
  // Bytes changed: exactly the 11 rows of layer 1 (one row of head_dim elements a token).
  const uint32_t b = dtype_bytes(dtype);
  size_t changed = 0;
  for (size_t i = 0; i < before.size(); ++i)
    changed += before[i] != pool.bytes()[i] ? 1u : 0u;
  EXPECT_LE(changed, size_t{tokens} * g.head_dim * b);
  EXPECT_GE(changed, size_t{tokens} * g.head_dim * b / 2);  // most bytes differ from NaN's
  if (dtype_is_quantized(dtype)) {
    // One scale a (page, layer): pages 4 and 1 of layer 1 are set, every other one is NaN.
    for (uint32_t p = 0; p < 6; ++p) {
      for (uint32_t l = 0; l < 2; ++l) {
        const float sc = pool.scales()[scale_index(g, p, l, 0, false)];
        const bool mine = (p == 4 || p == 1) && l == kLayer;
        EXPECT_EQ(std::isnan(sc), !mine) << "page " << p << " layer " << l;
      }
    }
  }

  // Copy page 4 to page 0: page 0 then reads as page 4 did, scale included.
  const PageId src = 4, dst = 0;
  CopyPagesArgs cp;
  cp.kv = pool.kv();
  cp.num_pairs = 1;
  cp.src = &src;
  cp.dst = &dst;
  ASSERT_EQ(cpu::copy_pages(cp, pool.num_pages()), "");
  for (uint32_t l = 0; l < 2; ++l) {
    for (uint32_t t = 0; t < 8; ++t) {
      for (uint32_t x = 0; x < g.head_dim; ++x)
        ASSERT_EQ(pool.raw(dst, l, 0, t, x, 0), pool.raw(src, l, 0, t, x, 0));
    }
    if (dtype_is_quantized(dtype)) {
      const float s0 = pool.scales()[scale_index(g, dst, l, 0, false)];
      const float s4 = pool.scales()[scale_index(g, src, l, 0, false)];
      EXPECT_TRUE((std::isnan(s0) && std::isnan(s4)) || s0 == s4) << "layer " << l;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LatentAppend,
                         testing::Values(std::pair{KvDtype::fp16, KvLayout::page_major},
                                         std::pair{KvDtype::bf16, KvLayout::layer_major},
                                         std::pair{KvDtype::fp8_e4m3, KvLayout::page_major},
                                         std::pair{KvDtype::int8, KvLayout::layer_major}),
                         [](const testing::TestParamInfo<std::pair<KvDtype, KvLayout>>& p) {
                           return std::string(dtype_name(p.param.first)) + "_" +
                                  std::string(layout_name(p.param.second));
                         });

}  // namespace
}  // namespace kvpool::kernels

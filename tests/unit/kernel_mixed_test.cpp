// Mixed precision in the CPU kernels (kernels/paged_kv.h, MixedPrecision and ConvertPagesArgs):
// decode and extend over block tables whose leading entries name pages of an older 8-bit pool and
// the rest pages of a 16-bit one, in both layouts (the two pools' layouts mixed too), with GQA,
// MQA-wide groups, sliding windows, chunks, sinks and latent pools, against a dense fp64
// reference over each page's dequantised values; a call with no older pages, or only older ones,
// against the plain call bit for bit; refusals that name the field. Every slot no sequence holds
// is NaN in both pools, and the pools hand out page ids from independent permutations, so an
// entry read from the wrong pool shows up as a non-finite output or an error.
// Convert-pages: scales from the tile's amax, every element within the quantiser's error, both
// layouts and a segmented destination, nothing written on a refusal or outside the destinations.
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

struct MixedCase {
  KvDtype recent_dtype, older_dtype;
  KvLayout recent_layout, older_layout;
  AttentionKind kind;
  uint32_t t_page, d, kv_heads, group;
  int32_t window_left;
  uint32_t chunk;
  bool sinks;
  std::vector<std::pair<uint32_t, uint32_t>> seqs;  // (context length, older pages)
};

std::string mixed_name(const testing::TestParamInfo<MixedCase>& info) {
  const MixedCase& c = info.param;
  return std::string(dtype_name(c.recent_dtype)) + "_" + std::string(dtype_name(c.older_dtype)) +
         "_" + std::string(layout_name(c.recent_layout)) + "_" +
         std::string(layout_name(c.older_layout)) + "_" + std::string(attention_kind_name(c.kind)) +
         "_G" + std::to_string(c.group) + "_" + std::to_string(info.index);
}

// The first key the query at `pos` sees, from the definitions.
uint32_t first_key(const MixedCase& c, uint32_t pos) {
  for (uint32_t j = 0; j <= pos; ++j) {
    const bool in_window = c.window_left < 0 || pos - j <= static_cast<uint32_t>(c.window_left);
    const bool in_chunk = c.chunk == 0 || j / c.chunk == pos / c.chunk;
    if (in_window && in_chunk) return j;
  }
  return pos;
}

Geometry geometry(const MixedCase& c, KvDtype dtype) {
  Geometry g{2, c.kv_heads, c.d, c.t_page, dtype};
  g.kind = c.kind;
  if (c.kind == AttentionKind::sliding) g.window = static_cast<uint32_t>(c.window_left) + 1;
  if (c.kind == AttentionKind::chunked) g.window = c.chunk;
  return g;
}

// Sequences whose leading pages are written into the older pool and the rest into the recent
// one, each pool three times the pages it needs (the rest NaN). k and v hold each sequence's
// dequantised keys and values, page by page from the pool that holds it.
struct MixedBatch {
  explicit MixedBatch(const MixedCase& c)
      : recent(geometry(c, c.recent_dtype), 3 * pages(c, false) + 2, 11 + c.d, c.recent_layout),
        older(geometry(c, c.older_dtype), 3 * pages(c, true) + 2, 29 + c.d, c.older_layout) {
    const uint32_t t = c.t_page;
    for (auto [n, o] : c.seqs) {
      ctx.push_back(n);
      older_pages.push_back(o);
      stride = std::max(stride, (n + t - 1) / t + 1);
    }
    tables.assign(ctx.size() * stride, kNoPage);
    for (size_t s = 0; s < ctx.size(); ++s) {
      const uint32_t total = (ctx[s] + t - 1) / t;
      const uint32_t o = std::min(older_pages[s], total);
      const uint32_t older_tokens = std::min(ctx[s], o * t);
      const size_t row = size_t{c.kv_heads} * c.d;
      const std::vector<float> kr = test::random_normal(recent.rng(), ctx[s] * row, 1.0f);
      const std::vector<float> vr = test::random_normal(recent.rng(), ctx[s] * row, 1.0f);
      const std::vector<PageId> op = older.take_pages(o);
      const std::vector<PageId> rp = recent.take_pages(total - o);
      older.write_sequence(kLayer, op, kr.data(), vr.data(), older_tokens);
      recent.write_sequence(kLayer, rp, kr.data() + older_tokens * row,
                            vr.data() + older_tokens * row, ctx[s] - older_tokens);
      std::copy(op.begin(), op.end(), tables.begin() + static_cast<long>(s * stride));
      std::copy(rp.begin(), rp.end(), tables.begin() + static_cast<long>(s * stride + o));
      for (int kind = 0; kind < 2; ++kind) {
        std::vector<float> all = older.gather(kLayer, op, older_tokens, kind);
        const std::vector<float> rest = recent.gather(kLayer, rp, ctx[s] - older_tokens, kind);
        all.insert(all.end(), rest.begin(), rest.end());
        (kind == 0 ? k : v).push_back(std::move(all));
      }
      for (float x : v.back())
        max_abs_v = std::max(max_abs_v, double{std::fabs(x)});
    }
  }
  static uint32_t pages(const MixedCase& c, bool older_part) {
    uint32_t n = 0;
    for (auto [len, o] : c.seqs) {
      const uint32_t total = (len + c.t_page - 1) / c.t_page;
      n += older_part ? std::min(o, total) : total - std::min(o, total);
    }
    return n;
  }
  MixedPrecision mixed() {
    return MixedPrecision{older.kv(), older_pages.data(), older.num_pages()};
  }
  TestPool recent, older;
  uint32_t stride = 0;
  std::vector<PageId> tables;
  std::vector<uint32_t> ctx, older_pages;
  std::vector<std::vector<float>> k, v;
  double max_abs_v = 0.0;
};

class MixedAttention : public testing::TestWithParam<MixedCase> {
 protected:
  AttentionMask mask(const std::vector<float>& sinks) const {
    const MixedCase& c = GetParam();
    return AttentionMask{c.window_left, c.chunk, c.sinks ? sinks.data() : nullptr};
  }
  void reference(const MixedBatch& b, uint32_t s, uint32_t pos, uint32_t h, const float* q,
                 const std::vector<float>& sinks, float scale, double* ref, float* naive) const {
    const MixedCase& c = GetParam();
    test::reference_attention(q, b.k[s].data(), b.v[s].data(), c.kv_heads, c.d, h / c.group,
                              pos + 1, scale, ref, naive, first_key(c, pos),
                              c.sinks ? &sinks[h] : nullptr);
  }
};

void expect_within(const ErrorTally& t) {
  EXPECT_TRUE(t.ok()) << "non-finite " << t.non_finite << ", kernel error " << t.kernel_err
                      << " > bound " << t.bound() << " (naive fp32 error " << t.naive_err << ")";
}

TEST_P(MixedAttention, DecodeMatchesTheReference) {
  const MixedCase& c = GetParam();
  MixedBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{num_seqs} * hq;
  const std::vector<float> q = test::random_normal(b.recent.rng(), rows * c.d, 2.0f);
  const std::vector<float> sinks = test::random_normal(b.recent.rng(), hq, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<double> ref(rows * c.d);
  std::vector<float> naive(rows * c.d);
  for (uint32_t s = 0; s < num_seqs; ++s) {
    for (uint32_t h = 0; h < hq; ++h) {
      const size_t r = size_t{s} * hq + h;
      reference(b, s, b.ctx[s] - 1, h, q.data() + r * c.d, sinks, scale, ref.data() + r * c.d,
                naive.data() + r * c.d);
    }
  }
  std::vector<cpu::Isa> isas{cpu::Isa::baseline};
  if (cpu::isa_supported(cpu::Isa::avx2) && c.d % 8 == 0) isas.push_back(cpu::Isa::avx2);
  for (const cpu::Isa isa : isas) {
    for (uint32_t split : {0u, c.t_page, 3 * c.t_page, 1u << 20}) {
      SCOPED_TRACE(std::string(cpu::isa_name(isa)) + ", split_tokens " + std::to_string(split));
      std::vector<float> out(rows * c.d, std::nanf(""));
      DecodeArgs a = test::decode_args(b.recent, kLayer, hq, b.tables, b.stride, b.ctx, q.data(),
                                       out.data(), scale);
      a.split_tokens = split;
      a.mask = mask(sinks);
      a.mixed = b.mixed();
      ASSERT_EQ(cpu::decode(a, b.recent.num_pages(), 2, isa), "");
      ErrorTally tally;
      tally.max_abs_v = b.max_abs_v;
      for (size_t r = 0; r < rows; ++r)
        tally.add(out.data() + r * c.d, naive.data() + r * c.d, ref.data() + r * c.d, c.d);
      expect_within(tally);
    }
  }
}

TEST_P(MixedAttention, ExtendMatchesTheReference) {
  const MixedCase& c = GetParam();
  MixedBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  // Each sequence's last third (at least one token) is new: its queries cross the boundary
  // between older and recent pages wherever it lies.
  std::vector<uint32_t> q_offsets{0};
  for (uint32_t n : b.ctx)
    q_offsets.push_back(q_offsets.back() + std::max(1u, n / 3));
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{q_offsets.back()} * hq;
  const std::vector<float> q = test::random_normal(b.recent.rng(), rows * c.d, 2.0f);
  const std::vector<float> sinks = test::random_normal(b.recent.rng(), hq, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<float> out(rows * c.d, std::nanf(""));
  ExtendArgs a = test::extend_args(b.recent, kLayer, hq, b.tables, b.stride, b.ctx, q_offsets,
                                   q.data(), out.data(), scale);
  a.mask = mask(sinks);
  a.mixed = b.mixed();
  ASSERT_EQ(cpu::extend(a, b.recent.num_pages(), 2), "");
  ErrorTally tally;
  tally.max_abs_v = b.max_abs_v;
  std::vector<double> ref(c.d);
  std::vector<float> naive(c.d);
  for (uint32_t s = 0; s < num_seqs; ++s) {
    const uint32_t n_new = q_offsets[s + 1] - q_offsets[s];
    for (uint32_t i = 0; i < n_new; ++i) {
      const uint32_t pos = b.ctx[s] - n_new + i;
      for (uint32_t h = 0; h < hq; ++h) {
        const size_t r = (size_t{q_offsets[s]} + i) * hq + h;
        reference(b, s, pos, h, q.data() + r * c.d, sinks, scale, ref.data(), naive.data());
        tally.add(out.data() + r * c.d, naive.data(), ref.data(), c.d);
      }
    }
  }
  expect_within(tally);
}

constexpr KvLayout kPM = KvLayout::page_major;
constexpr KvLayout kLM = KvLayout::layer_major;
constexpr AttentionKind kFull = AttentionKind::full;

// (context, older pages), with 16 tokens a page: a boundary inside a split chunk, every page older
// (a count past the table), none, all (the one page); with 8 tokens a page the same counts fall
// elsewhere, still boundaries at and between pages.
const std::vector<std::pair<uint32_t, uint32_t>> kSeqs{{70, 3}, {33, 4}, {129, 0}, {16, 1}};

INSTANTIATE_TEST_SUITE_P(
    Shapes, MixedAttention,
    testing::Values(MixedCase{KvDtype::bf16, KvDtype::fp8_e4m3, kPM, kPM, kFull, 16, 64, 2, 4, -1,
                              0, false, kSeqs},
                    MixedCase{KvDtype::bf16, KvDtype::int8, kLM, kLM, kFull, 16, 64, 2, 4, -1, 0,
                              false, kSeqs},
                    MixedCase{KvDtype::fp16, KvDtype::fp8_e4m3, kLM, kPM, kFull, 8, 128, 1, 16, -1,
                              0, false, kSeqs},
                    MixedCase{KvDtype::bf16, KvDtype::fp8_e4m3, kPM, kLM, kFull, 16, 64, 1, 71, -1,
                              0, true, kSeqs},
                    MixedCase{KvDtype::bf16, KvDtype::fp8_e4m3, kPM, kPM, AttentionKind::sliding,
                              16, 64, 2, 2, 40, 0, true, kSeqs},
                    MixedCase{KvDtype::bf16, KvDtype::int8, kLM, kLM, AttentionKind::chunked, 8, 64,
                              2, 2, -1, 24, false, kSeqs},
                    MixedCase{KvDtype::bf16, KvDtype::fp8_e4m3, kLM, kPM, AttentionKind::latent, 16,
                              72, 1, 16, -1, 0, false, kSeqs}),
    mixed_name);

// A mixed call with no older pages is the plain call over the recent pool, and one whose every
// page is older the plain call over the older pool: the same bits, whatever the other pool holds.
TEST(MixedPrecision, OneClassOnlyIsThePlainCallBitForBit) {
  const MixedCase c{KvDtype::bf16, KvDtype::fp8_e4m3, kLM, kPM, kFull, 16, 64, 2, 4, -1, 0,
                    false,         {{70, 0}, {33, 0}}};
  for (const bool all_older : {false, true}) {
    MixedCase cc = c;
    for (auto& [n, o] : cc.seqs)
      o = all_older ? (n + c.t_page - 1) / c.t_page : 0;
    MixedBatch b(cc);
    const uint32_t hq = c.kv_heads * c.group;
    const size_t rows = b.ctx.size() * hq;
    const std::vector<float> q = test::random_normal(b.recent.rng(), rows * c.d, 2.0f);
    std::vector<float> mixed_out(rows * c.d), plain_out(rows * c.d);
    DecodeArgs a = test::decode_args(b.recent, kLayer, hq, b.tables, b.stride, b.ctx, q.data(),
                                     mixed_out.data(), 0.125f);
    a.mixed = b.mixed();
    a.split_tokens = 32;
    ASSERT_EQ(cpu::decode(a, b.recent.num_pages(), 2), "");
    DecodeArgs p = test::decode_args(all_older ? b.older : b.recent, kLayer, hq, b.tables, b.stride,
                                     b.ctx, q.data(), plain_out.data(), 0.125f);
    p.split_tokens = 32;
    ASSERT_EQ(cpu::decode(p, (all_older ? b.older : b.recent).num_pages(), 2), "");
    EXPECT_EQ(std::memcmp(mixed_out.data(), plain_out.data(), rows * c.d * sizeof(float)), 0)
        << (all_older ? "all older" : "none older");
  }
}

TEST(MixedPrecision, BadOlderPoolsAreRefusedByName) {
  const MixedCase c{KvDtype::bf16, KvDtype::fp8_e4m3, kPM, kPM, kFull, 16, 64, 2, 4, -1, 0,
                    false,         {{70, 3}}};
  MixedBatch b(c);
  const uint32_t hq = c.kv_heads * c.group;
  const std::vector<float> q(hq * c.d, 1.0f);
  std::vector<float> out(hq * c.d, 7.0f);
  const auto run = [&](const MixedPrecision& m, const std::vector<PageId>& tables) {
    DecodeArgs a = test::decode_args(b.recent, kLayer, hq, tables, b.stride, b.ctx, q.data(),
                                     out.data(), 0.125f);
    a.mixed = m;
    std::string e = cpu::decode(a, b.recent.num_pages(), 1);
    const std::vector<uint32_t> q_offsets{0, 1};
    ExtendArgs x = test::extend_args(b.recent, kLayer, hq, tables, b.stride, b.ctx, q_offsets,
                                     q.data(), out.data(), 0.125f);
    x.mixed = m;
    EXPECT_EQ(cpu::extend(x, b.recent.num_pages(), 1), e);
    return e;
  };
  MixedPrecision m = b.mixed();
  m.older_pages = nullptr;
  EXPECT_EQ(run(m, b.tables), "mixed.older_pages is null");
  m = b.mixed();
  m.older.geometry.head_dim = 128;
  EXPECT_NE(run(m, b.tables).find("mixed.older.geometry is not of kv.geometry's shape"),
            std::string::npos);
  m = b.mixed();
  m.older.scales = nullptr;
  EXPECT_EQ(run(m, b.tables), "mixed.older: kv.scales is null for an 8-bit pool");
  // An older entry checked against the older pool's pages, a recent one against the recent's.
  std::vector<PageId> bad = b.tables;
  bad[1] = b.older.num_pages();
  EXPECT_NE(run(b.mixed(), bad)
                .find("block_tables[0][1] = " + std::to_string(b.older.num_pages()) +
                      " (an older page: mixed.older_pages[0] = 3) is not below "
                      "mixed.older_num_pages"),
            std::string::npos);
  bad = b.tables;
  bad[3] = b.recent.num_pages();
  EXPECT_NE(run(b.mixed(), bad)
                .find("block_tables[0][3] = " + std::to_string(b.recent.num_pages()) +
                      " is not below num_pages"),
            std::string::npos);
  for (float x : out)
    ASSERT_EQ(x, 7.0f) << "a refused call wrote its output";
}

// Convert-pages --------------------------------------------------------------------------------

struct ConvertCase {
  KvDtype to;
  KvLayout src_layout, dst_layout;
  uint32_t dst_segment_pages;
  AttentionKind kind;
};

class ConvertPages : public testing::TestWithParam<ConvertCase> {};

std::string convert_name(const testing::TestParamInfo<ConvertCase>& info) {
  const ConvertCase& c = info.param;
  return std::string(dtype_name(c.to)) + "_" + std::string(layout_name(c.src_layout)) + "_to_" +
         std::string(layout_name(c.dst_layout)) + (c.dst_segment_pages != 0 ? "_segmented" : "") +
         "_" + std::string(attention_kind_name(c.kind));
}

// Pages of a bf16 pool converted into 8 bits: each tile's scale is its amax / R, each element
// within the quantiser's error of the source, the other pages of the destination untouched.
TEST_P(ConvertPages, EightBitTilesKeepTheSourceWithinTheQuantiserError) {
  const ConvertCase& c = GetParam();
  Geometry sg{3, c.kind == AttentionKind::latent ? 1u : 2u, 32, 16, KvDtype::bf16};
  sg.kind = c.kind;
  if (c.kind == AttentionKind::sliding) sg.window = 100;
  Geometry dg = sg;
  dg.dtype = c.to;
  TestPool src(sg, 8, 5, c.src_layout);
  TestPool dst(dg, 9, 6, c.dst_layout, c.dst_segment_pages);
  const std::vector<PageId> from = src.take_pages(5);
  const std::vector<PageId> to = dst.take_pages(5);
  const uint32_t tokens = 5 * sg.tokens_per_page;
  const size_t n = size_t{tokens} * sg.kv_heads * sg.head_dim;
  // Keys with a few large channels, as real keys have; values of unit scale.
  std::vector<float> k = test::random_normal(src.rng(), n, 1.0f);
  for (size_t i = 0; i < n; i += 13)
    k[i] *= 20.0f;
  const std::vector<float> v = test::random_normal(src.rng(), n, 1.0f);
  for (uint32_t layer = 0; layer < sg.layers; ++layer)
    src.write_sequence(layer, from, k.data(), v.data(), tokens);
  ConvertPagesArgs a{src.kv(), dst.kv(), 5, from.data(), to.data()};
  ASSERT_EQ(cpu::convert_pages(a, src.num_pages(), dst.num_pages(), 2), "");

  const float range = c.to == KvDtype::int8 ? kInt8Max : kFp8Max;
  for (uint32_t layer = 0; layer < sg.layers; ++layer) {
    for (int kind = 0; kind < static_cast<int>(kv_planes(sg)); ++kind) {
      const std::vector<float> x = src.gather(layer, from, tokens, kind);
      const std::vector<float> y = dst.gather(layer, to, tokens, kind);
      for (uint32_t p = 0; p < 5; ++p) {
        for (uint32_t h = 0; h < sg.kv_heads; ++h) {
          float amax = 0.0f;
          for (uint32_t t = p * 16; t < (p + 1) * 16; ++t) {
            for (uint32_t e = 0; e < sg.head_dim; ++e)
              amax = std::max(amax, std::fabs(x[(size_t{t} * sg.kv_heads + h) * sg.head_dim + e]));
          }
          const float scale = amax / range;
          ASSERT_EQ(dst.scales()[scale_index(dg, to[p], layer, h, kind == 1)], scale)
              << "page " << p << " layer " << layer << " head " << h << " kind " << kind;
          for (uint32_t t = p * 16; t < (p + 1) * 16; ++t) {
            for (uint32_t e = 0; e < sg.head_dim; ++e) {
              const size_t i = (size_t{t} * sg.kv_heads + h) * sg.head_dim + e;
              // int8: half a step; fp8 e4m3: half an ulp of 3 mantissa bits (2^-4 relative), or
              // half the subnormal step 2^-9 of the scaled value.
              const double bound =
                  c.to == KvDtype::int8
                      ? 0.5 * scale * (1 + 1e-5)
                      : std::max(std::fabs(x[i]) * 0x1p-4, scale * 0x1p-10) * (1 + 1e-5);
              ASSERT_LE(std::fabs(double{y[i]} - x[i]), bound) << "element " << i;
            }
          }
        }
      }
    }
  }
  // Only the destination pages changed: the others' bytes (all NaN) are as they were.
  const std::vector<PageId> rest = dst.take_pages(4);
  for (const PageId p : rest) {
    for (uint32_t layer = 0; layer < dg.layers; ++layer) {
      for (uint32_t t = 0; t < dg.tokens_per_page; ++t) {
        ASSERT_EQ(dst.raw(p, layer, dg.kv_heads - 1, t, 3, 0), test::nan_bits(dg.dtype))
            << "page " << p;
      }
      ASSERT_TRUE(std::isnan(dst.scales()[scale_index(dg, p, layer, 0, false)]));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ConvertPages,
    testing::Values(ConvertCase{KvDtype::fp8_e4m3, kPM, kPM, 0, kFull},
                    ConvertCase{KvDtype::int8, kPM, kPM, 0, kFull},
                    ConvertCase{KvDtype::fp8_e4m3, kLM, kLM, 0, kFull},
                    ConvertCase{KvDtype::int8, kPM, kLM, 4, kFull},
                    ConvertCase{KvDtype::fp8_e4m3, kLM, kPM, 0, AttentionKind::latent},
                    ConvertCase{KvDtype::int8, kLM, kLM, 4, AttentionKind::sliding}),
    convert_name);

// Converted pages read by a mixed decode give what a decode of the dequantised pages gives, and
// differ from the all-bf16 decode by the 8-bit error only (a loose bound: the test is that the
// two kernels compose, not the accuracy, which bench/micro/mixed_precision_bench measures).
TEST(MixedPrecision, ConvertedPagesDecodeAsOlderPages) {
  Geometry g{2, 2, 64, 16, KvDtype::bf16};
  Geometry g8 = g;
  g8.dtype = KvDtype::fp8_e4m3;
  TestPool recent(g, 12, 3, kLM);
  TestPool older(g8, 12, 4, kPM);
  const uint32_t ctx = 150;  // 10 pages, the last partial
  const std::vector<PageId> pages = recent.take_pages(10);
  const size_t n = size_t{ctx} * g.kv_heads * g.head_dim;
  const std::vector<float> k = test::random_normal(recent.rng(), n, 1.0f);
  const std::vector<float> v = test::random_normal(recent.rng(), n, 1.0f);
  recent.write_sequence(kLayer, pages, k.data(), v.data(), ctx);
  // The oldest six pages go down to fp8 (their bf16 pages stay, as the worker frees them later).
  const std::vector<PageId> converted = older.take_pages(6);
  ConvertPagesArgs ca{recent.kv(), older.kv(), 6, pages.data(), converted.data()};
  ASSERT_EQ(cpu::convert_pages(ca, recent.num_pages(), older.num_pages()), "");
  std::vector<PageId> table(converted);
  table.insert(table.end(), pages.begin() + 6, pages.end());
  const uint32_t hq = 8;
  const std::vector<float> q = test::random_normal(recent.rng(), hq * g.head_dim, 1.0f);
  const std::vector<uint32_t> lens{ctx};
  const std::vector<uint32_t> six{6};
  std::vector<float> mixed(hq * g.head_dim), plain(hq * g.head_dim);
  DecodeArgs a =
      test::decode_args(recent, kLayer, hq, table, 10, lens, q.data(), mixed.data(), 0.125f);
  a.mixed = MixedPrecision{older.kv(), six.data(), older.num_pages()};
  ASSERT_EQ(cpu::decode(a, recent.num_pages(), 2), "");
  DecodeArgs p =
      test::decode_args(recent, kLayer, hq, pages, 10, lens, q.data(), plain.data(), 0.125f);
  ASSERT_EQ(cpu::decode(p, recent.num_pages(), 2), "");

  std::vector<float> kd = older.gather(kLayer, converted, 96, 0);
  std::vector<float> vd = older.gather(kLayer, converted, 96, 1);
  const std::vector<float> kr =
      recent.gather(kLayer, std::vector<PageId>(pages.begin() + 6, pages.end()), ctx - 96, 0);
  const std::vector<float> vr =
      recent.gather(kLayer, std::vector<PageId>(pages.begin() + 6, pages.end()), ctx - 96, 1);
  kd.insert(kd.end(), kr.begin(), kr.end());
  vd.insert(vd.end(), vr.begin(), vr.end());
  double err_ref = 0.0, err_plain = 0.0, norm = 0.0;
  for (uint32_t h = 0; h < hq; ++h) {
    std::vector<double> ref(g.head_dim);
    std::vector<float> naive(g.head_dim);
    test::reference_attention(q.data() + h * g.head_dim, kd.data(), vd.data(), g.kv_heads,
                              g.head_dim, h / 4, ctx, 0.125f, ref.data(), naive.data());
    for (uint32_t x = 0; x < g.head_dim; ++x) {
      const size_t i = size_t{h} * g.head_dim + x;
      err_ref = std::max(err_ref, std::fabs(mixed[i] - ref[x]));
      err_plain = std::max(err_plain, double{std::fabs(mixed[i] - plain[i])});
      norm = std::max(norm, double{std::fabs(plain[i])});
    }
  }
  EXPECT_LT(err_ref, 1e-5) << "mixed decode against the reference over the dequantised pages";
  EXPECT_GT(err_plain, 0.0) << "the older pages were not read as fp8";
  EXPECT_LT(err_plain, 0.1 * norm) << "fp8 pages far from their bf16 source";
}

TEST(MixedPrecision, BadConversionsAreRefusedAndWriteNothing) {
  Geometry g{2, 2, 32, 16, KvDtype::bf16};
  Geometry g8 = g;
  g8.dtype = KvDtype::int8;
  TestPool src(g, 4, 1);
  TestPool dst(g8, 4, 2);
  const std::vector<PageId> from{0, 1};
  const std::vector<float> kv(size_t{32} * 2 * 32, 0.5f);
  src.write_sequence(0, from, kv.data(), kv.data(), 32);
  const std::vector<std::byte> before = dst.bytes();
  const auto refuse = [&](ConvertPagesArgs a, uint32_t src_pages, const std::string& want) {
    const std::string e = cpu::convert_pages(a, src_pages, dst.num_pages());
    EXPECT_NE(e.find(want), std::string::npos) << e;
    EXPECT_TRUE(dst.bytes() == before);
  };
  const std::vector<PageId> to{2, 2};
  refuse({src.kv(), dst.kv(), 2, from.data(), to.data()}, 4, "pairs 0 and 1 both write page 2");
  const std::vector<PageId> far{0, 9};
  const std::vector<PageId> ok{1, 3};
  refuse({src.kv(), dst.kv(), 2, far.data(), ok.data()}, 4,
         "pair 1: source page 9 is not below the source's 4 pages");
  refuse({src.kv(), dst.kv(), 2, ok.data(), far.data()}, 4,
         "pair 1: destination page 9 is not below the destination's 4 pages");
  ConvertPagesArgs a{src.kv(), dst.kv(), 2, from.data(), ok.data()};
  a.dst.geometry.tokens_per_page = 8;
  refuse(a, 4, "src and dst geometries differ in shape");
  a = {src.kv(), src.kv(), 1, from.data(), ok.data()};
  refuse(a, 4, "src and dst are one pool");
  a = {src.kv(), dst.kv(), 2, from.data(), ok.data()};
  a.dst.scales = nullptr;
  refuse(a, 4, "dst.scales is null for an 8-bit pool");
}

}  // namespace
}  // namespace kvpool::kernels

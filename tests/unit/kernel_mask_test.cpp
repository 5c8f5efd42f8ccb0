// CPU decode and extend with the attention shapes of today's models (kernels/paged_kv.h,
// AttentionMask): query groups of 1 to 71 per KV head, sliding windows, chunked attention and
// attention sinks, in both layouts, against a dense fp64 reference whose visible keys come from
// the definitions (a key j is seen by the query at pos when j ≤ pos, pos − j ≤ window_left and j
// lies in pos's chunk), not from the kernels' first_visible_key. Window edges: a window wider than
// the context, one ending inside a page, a window of one key, chunks aligned and not aligned to
// pages. Every slot no sequence holds is NaN, so a key read outside the mask's pages shows up as a
// non-finite output only when the kernel reads it; keys inside a sequence but outside the mask are
// finite, and reading them shows up as an error against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::kernels {
namespace {

using test::ErrorTally;
using test::TestPool;

constexpr uint32_t kLayer = 1;

struct MaskCase {
  KvDtype dtype;
  KvLayout layout;
  uint32_t t_page, d, kv_heads, group;
  int32_t window_left;
  uint32_t chunk;
  bool sinks;
  std::vector<std::pair<uint32_t, uint32_t>> seqs;  // (cached prefix, new tokens ≥ 1)
};

// The first key the query at `pos` sees, from the definitions.
uint32_t first_key_by_definition(const MaskCase& c, uint32_t pos) {
  for (uint32_t j = 0; j <= pos; ++j) {
    const bool in_window = c.window_left < 0 || pos - j <= static_cast<uint32_t>(c.window_left);
    const bool in_chunk = c.chunk == 0 || j / c.chunk == pos / c.chunk;
    if (in_window && in_chunk) return j;
  }
  return pos;
}

std::string mask_name(const testing::TestParamInfo<MaskCase>& info) {
  const MaskCase& c = info.param;
  std::string w = c.window_left < 0 ? "none" : std::to_string(c.window_left);
  return std::string(dtype_name(c.dtype)) + "_" + std::string(layout_name(c.layout)) + "_G" +
         std::to_string(c.group) + "_W" + w + "_C" + std::to_string(c.chunk) +
         (c.sinks ? "_sinks" : "") + "_" + std::to_string(info.index);
}

// Sequences written into a fresh pool of three times the pages they need (the rest NaN).
struct MaskBatch {
  explicit MaskBatch(const MaskCase& c)
      : g{2, c.kv_heads, c.d, c.t_page, c.dtype},
        pool(g, pages_needed(c) * 3 + 1, 7 + c.d, c.layout) {
    for (auto [prefix, n_new] : c.seqs)
      ctx.push_back(prefix + n_new);
    for (uint32_t n : ctx)
      stride = std::max(stride, (n + c.t_page - 1) / c.t_page + 1);
    tables.assign(ctx.size() * stride, kNoPage);
    for (size_t s = 0; s < ctx.size(); ++s) {
      const std::vector<PageId> pages = pool.take_pages((ctx[s] + c.t_page - 1) / c.t_page);
      std::copy(pages.begin(), pages.end(), tables.begin() + static_cast<long>(s * stride));
      const size_t n = size_t{ctx[s]} * c.kv_heads * c.d;
      const std::vector<float> kr = test::random_normal(pool.rng(), n, 1.0f);
      const std::vector<float> vr = test::random_normal(pool.rng(), n, 1.0f);
      pool.write_sequence(kLayer, pages, kr.data(), vr.data(), ctx[s]);
      k.push_back(pool.gather(kLayer, pages, ctx[s], 0));
      v.push_back(pool.gather(kLayer, pages, ctx[s], 1));
      for (float x : v.back())
        max_abs_v = std::max(max_abs_v, double{std::fabs(x)});
    }
  }
  static uint32_t pages_needed(const MaskCase& c) {
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
  std::vector<std::vector<float>> k, v;
  double max_abs_v = 0.0;
};

class MaskedAttention : public testing::TestWithParam<MaskCase> {
 protected:
  AttentionMask mask(const std::vector<float>& sinks) const {
    const MaskCase& c = GetParam();
    return AttentionMask{c.window_left, c.chunk, c.sinks ? sinks.data() : nullptr};
  }
  // The reference row of query head h at position pos of sequence s.
  void reference(const MaskBatch& b, uint32_t s, uint32_t pos, uint32_t h, const float* q,
                 const std::vector<float>& sinks, float scale, double* ref, float* naive) const {
    const MaskCase& c = GetParam();
    test::reference_attention(q, b.k[s].data(), b.v[s].data(), c.kv_heads, c.d, h / c.group,
                              pos + 1, scale, ref, naive, first_key_by_definition(c, pos),
                              c.sinks ? &sinks[h] : nullptr);
  }
};

void expect_within(const ErrorTally& t) {
  EXPECT_TRUE(t.ok()) << "non-finite " << t.non_finite << ", kernel error " << t.kernel_err
                      << " > bound " << t.bound() << " (naive fp32 error " << t.naive_err << ")";
}

TEST_P(MaskedAttention, DecodeMatchesTheReference) {
  const MaskCase& c = GetParam();
  MaskBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{num_seqs} * hq;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 2.0f);
  const std::vector<float> sinks = test::random_normal(b.pool.rng(), hq, 2.0f);
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
      DecodeArgs a = test::decode_args(b.pool, kLayer, hq, b.tables, b.stride, b.ctx, q.data(),
                                       out.data(), scale);
      a.split_tokens = split;
      a.mask = mask(sinks);
      ASSERT_EQ(cpu::decode(a, b.pool.num_pages(), 2, isa), "");
      ErrorTally tally;
      tally.max_abs_v = b.max_abs_v;
      for (size_t r = 0; r < rows; ++r)
        tally.add(out.data() + r * c.d, naive.data() + r * c.d, ref.data() + r * c.d, c.d);
      expect_within(tally);
    }
  }
}

TEST_P(MaskedAttention, ExtendMatchesTheReference) {
  const MaskCase& c = GetParam();
  MaskBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  std::vector<uint32_t> q_offsets{0};
  for (auto [prefix, n_new] : c.seqs)
    q_offsets.push_back(q_offsets.back() + n_new);
  const uint32_t hq = c.kv_heads * c.group;
  const size_t rows = size_t{q_offsets.back()} * hq;
  const std::vector<float> q = test::random_normal(b.pool.rng(), rows * c.d, 2.0f);
  const std::vector<float> sinks = test::random_normal(b.pool.rng(), hq, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<float> out(rows * c.d, std::nanf(""));
  ExtendArgs a = test::extend_args(b.pool, kLayer, hq, b.tables, b.stride, b.ctx, q_offsets,
                                   q.data(), out.data(), scale);
  a.mask = mask(sinks);
  ASSERT_EQ(cpu::extend(a, b.pool.num_pages(), 2), "");

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

// Block-table entries before the page of the first key a call reads may be anything (kNoPage
// after a sliding pool's window hit): the same call with them blanked gives the same bits.
TEST_P(MaskedAttention, EntriesBeforeTheWindowAreNeverRead) {
  const MaskCase& c = GetParam();
  MaskBatch b(c);
  const auto num_seqs = static_cast<uint32_t>(b.ctx.size());
  std::vector<uint32_t> q_offsets{0};
  for (auto [prefix, n_new] : c.seqs)
    q_offsets.push_back(q_offsets.back() + n_new);
  const uint32_t hq = c.kv_heads * c.group;
  const std::vector<float> sinks = test::random_normal(b.pool.rng(), hq, 2.0f);
  const std::vector<float> q =
      test::random_normal(b.pool.rng(), size_t{q_offsets.back()} * hq * c.d, 2.0f);
  // Blanks entries [0, first_key / T) of each sequence, first_key from `first_pos(s)`.
  auto blanked = [&](auto first_pos) {
    std::vector<PageId> t = b.tables;
    for (uint32_t s = 0; s < num_seqs; ++s) {
      const uint32_t first = first_key_by_definition(c, first_pos(s));
      for (uint32_t i = 0; i < first / c.t_page; ++i)
        t[size_t{s} * b.stride + i] = kNoPage;
    }
    return t;
  };
  std::vector<float> whole(size_t{num_seqs} * hq * c.d), holes(whole.size());
  DecodeArgs a = test::decode_args(b.pool, kLayer, hq, b.tables, b.stride, b.ctx, q.data(),
                                   whole.data(), 0.1f);
  a.mask = mask(sinks);
  ASSERT_EQ(cpu::decode(a, b.pool.num_pages(), 2), "");
  const std::vector<PageId> decode_table = blanked([&](uint32_t s) { return b.ctx[s] - 1; });
  a.block_tables = decode_table.data();
  a.out = holes.data();
  ASSERT_EQ(cpu::decode(a, b.pool.num_pages(), 2), "");
  EXPECT_EQ(holes, whole);

  std::vector<float> ext_whole(size_t{q_offsets.back()} * hq * c.d), ext_holes(ext_whole.size());
  ExtendArgs e = test::extend_args(b.pool, kLayer, hq, b.tables, b.stride, b.ctx, q_offsets,
                                   q.data(), ext_whole.data(), 0.1f);
  e.mask = mask(sinks);
  ASSERT_EQ(cpu::extend(e, b.pool.num_pages(), 2), "");
  const std::vector<PageId> extend_table =
      blanked([&](uint32_t s) { return b.ctx[s] - (q_offsets[s + 1] - q_offsets[s]); });
  e.block_tables = extend_table.data();
  e.out = ext_holes.data();
  ASSERT_EQ(cpu::extend(e, b.pool.num_pages(), 2), "");
  EXPECT_EQ(ext_holes, ext_whole);
  // An entry the call does read is still checked: the page of the first visible key (the
  // boundary) and the last page, in decode and extend.
  const uint32_t first_decode = first_key_by_definition(c, b.ctx[0] - 1);
  const uint32_t n_new0 = q_offsets[1] - q_offsets[0];
  const uint32_t first_extend = first_key_by_definition(c, b.ctx[0] - n_new0);
  for (const uint32_t page : {first_decode / c.t_page, (b.ctx[0] - 1) / c.t_page}) {
    std::vector<PageId> bad = b.tables;
    bad[page] = kNoPage;
    a.block_tables = bad.data();
    EXPECT_NE(cpu::decode(a, b.pool.num_pages(), 2).find("is not below num_pages"),
              std::string::npos)
        << "decode, page " << page;
  }
  for (const uint32_t page : {first_extend / c.t_page, (b.ctx[0] - 1) / c.t_page}) {
    std::vector<PageId> bad = b.tables;
    bad[page] = kNoPage;
    e.block_tables = bad.data();
    EXPECT_NE(cpu::extend(e, b.pool.num_pages(), 2).find("is not below num_pages"),
              std::string::npos)
        << "extend, page " << page;
  }
}

constexpr KvLayout kPage = KvLayout::page_major;
constexpr KvLayout kLayerMajor = KvLayout::layer_major;

// Sequences: (prefix, new). Contexts straddle pages, exceed the window several times over, and
// the new-token runs cross window and chunk edges and a query block (16 tokens).
INSTANTIATE_TEST_SUITE_P(
    Shapes, MaskedAttention,
    testing::Values(
        // Query groups alone: MQA with 71 query heads (Falcon-7B), 16 per KV head (Qwen3-235B).
        MaskCase{KvDtype::bf16, kPage, 16, 64, 1, 71, -1, 0, false, {{40, 3}, {0, 17}}},
        MaskCase{KvDtype::fp16, kLayerMajor, 16, 128, 2, 16, -1, 0, false, {{100, 20}, {5, 1}}},
        MaskCase{KvDtype::int8, kPage, 8, 64, 4, 1, -1, 0, false, {{30, 9}}},
        // Sliding windows: ending inside a page, wider than every context, one key.
        MaskCase{KvDtype::fp16, kPage, 16, 64, 2, 4, 20, 0, false, {{100, 20}, {0, 30}, {7, 1}}},
        MaskCase{KvDtype::bf16, kLayerMajor, 16, 64, 2, 8, 20, 0, false, {{300, 17}, {16, 16}}},
        MaskCase{KvDtype::fp8_e4m3, kPage, 8, 64, 1, 8, 10000, 0, false, {{50, 5}, {0, 1}}},
        MaskCase{KvDtype::fp16, kLayerMajor, 8, 64, 2, 2, 0, 0, false, {{20, 9}, {0, 3}}},
        MaskCase{KvDtype::int8, kPage, 16, 128, 1, 16, 31, 0, false, {{2000, 40}}},
        // Chunked attention: chunks of whole pages and chunks that end inside a page.
        MaskCase{KvDtype::bf16, kPage, 16, 64, 2, 4, -1, 32, false, {{90, 20}, {0, 40}}},
        MaskCase{KvDtype::fp16, kLayerMajor, 16, 64, 1, 71, -1, 24, false, {{50, 30}, {23, 1}}},
        // A window and chunks at once.
        MaskCase{KvDtype::fp16, kPage, 8, 64, 2, 2, 12, 40, false, {{70, 25}}},
        // Sinks (gpt-oss: a sliding window of 128 with sinks on alternate layers), and alone.
        MaskCase{KvDtype::bf16, kPage, 16, 64, 1, 8, 127, 0, true, {{400, 20}, {3, 2}}},
        MaskCase{KvDtype::fp8_e4m3, kLayerMajor, 16, 64, 2, 4, -1, 0, true, {{60, 18}, {0, 1}}},
        MaskCase{KvDtype::fp16, kPage, 8, 72, 1, 1, 5, 0, true, {{30, 12}}}),
    mask_name);

TEST(MaskValidation, AWindowBelowMinusOneIsRefusedAndNothingIsWritten) {
  const MaskCase c{KvDtype::fp16, kPage, 16, 64, 1, 1, -1, 0, false, {{10, 1}}};
  MaskBatch b(c);
  std::vector<float> q(64, 1.0f);
  std::vector<float> out(64, 7.0f);
  DecodeArgs a;
  a.kv = b.pool.kv();
  a.layer = kLayer;
  a.num_seqs = 1;
  a.num_q_heads = 1;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = b.tables.data();
  a.block_table_stride = b.stride;
  a.context_lens = b.ctx.data();
  a.mask.window_left = -2;
  EXPECT_EQ(cpu::decode(a, b.pool.num_pages(), 1),
            "mask.window_left -2 is below -1 (-1: no window; W - 1 for a window of W keys)");
  EXPECT_EQ(out, std::vector<float>(64, 7.0f));
}

}  // namespace
}  // namespace kvpool::kernels

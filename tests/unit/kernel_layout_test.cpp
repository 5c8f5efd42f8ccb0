// The CPU kernels on both layouts (common/geometry.h, KvLayout): the same logical KV stored
// page_major, layer_major and segmented layer_major (an elastic pool's: segments of 3 pages with
// NaN slack between them) must give the same results, bit for bit, from decode (every ISA,
// with and without splits), extend, append (8-bit re-quantisation included) and copy-pages. Both
// pools are made with the same seed, so they hand out the same page ids; every slot no token
// was written to starts as a NaN bit pattern, so reading a wrong place shows up as a difference
// or a non-finite output. The page_major results are checked against fp64 in
// kernel_attention_test.cpp and kernel_append_copy_test.cpp; equality carries that over.
// One test writes through append and reads the bytes back at the offsets the layout documents
// (vLLM's [2][num_blocks][block_size][kv_heads][head_dim] per layer), computed here by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::kernels {
namespace {

using test::TestPool;

constexpr uint32_t kLayer = 1;  // of 3: the layers around it stay NaN

struct LayoutCase {
  KvDtype dtype;
  uint32_t t_page, d, kv_heads, group;
};

std::string case_name(const testing::TestParamInfo<LayoutCase>& info) {
  const LayoutCase& c = info.param;
  return std::string(dtype_name(c.dtype)) + "_T" + std::to_string(c.t_page) + "_D" +
         std::to_string(c.d) + "_H" + std::to_string(c.kv_heads) + "_G" + std::to_string(c.group);
}

Geometry geometry_of(const LayoutCase& c) {
  return Geometry{3, c.kv_heads, c.d, c.t_page, c.dtype};
}

// Pages per segment of the segmented layer_major pools: few, so sequences cross segments.
constexpr uint32_t kSegmentPages = 3;

// The same sequences in a page_major, a layer_major and a segmented layer_major pool.
struct Twins {
  Twins(const Geometry& g, const std::vector<uint32_t>& contexts, uint64_t seed)
      : pm(g, pool_pages(g, contexts), seed, KvLayout::page_major),
        lm(g, pool_pages(g, contexts), seed, KvLayout::layer_major),
        sm(g, pool_pages(g, contexts), seed, KvLayout::layer_major, kSegmentPages),
        ctx(contexts) {
    widest = 0;
    for (uint32_t c : ctx)
      widest = std::max(widest, pages(g, c));
    tables.assign(ctx.size() * widest, kNoPage);
    std::mt19937_64 rng(seed ^ 0x5eed);
    for (size_t s = 0; s < ctx.size(); ++s) {
      const std::vector<PageId> a = pm.take_pages(pages(g, ctx[s]));
      const std::vector<PageId> b = lm.take_pages(pages(g, ctx[s]));
      EXPECT_EQ(a, b);  // same seed, same permutation
      EXPECT_EQ(a, sm.take_pages(pages(g, ctx[s])));
      std::copy(a.begin(), a.end(), tables.begin() + static_cast<long>(s * widest));
      const size_t n = size_t{ctx[s]} * g.kv_heads * g.head_dim;
      const std::vector<float> k = test::random_normal(rng, n, 1.0f);
      const std::vector<float> v = test::random_normal(rng, n, 1.0f);
      pm.write_sequence(kLayer, a, k.data(), v.data(), ctx[s]);
      lm.write_sequence(kLayer, b, k.data(), v.data(), ctx[s]);
      sm.write_sequence(kLayer, b, k.data(), v.data(), ctx[s]);
    }
  }
  static uint32_t pages(const Geometry& g, uint32_t tokens) {
    return (tokens + g.tokens_per_page - 1) / g.tokens_per_page;
  }
  static uint32_t pool_pages(const Geometry& g, const std::vector<uint32_t>& lens) {
    uint32_t n = 0;
    for (uint32_t c : lens)
      n += pages(g, c);
    return 2 * n + 3;
  }
  TestPool pm, lm, sm;
  std::vector<uint32_t> ctx;
  uint32_t widest = 0;
  std::vector<PageId> tables;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool all_finite(const std::vector<float>& a) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Every stored element of every page, layer, head and slot, and every scale, agree.
void expect_same_contents(const TestPool& a, const TestPool& b) {
  const Geometry& g = a.geometry();
  uint64_t differ = 0;
  for (PageId p = 0; p < a.num_pages(); ++p) {
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < g.tokens_per_page; ++t) {
          for (uint32_t x = 0; x < g.head_dim; ++x) {
            for (int kind = 0; kind < 2; ++kind) {
              differ += a.raw(p, l, h, t, x, kind) != b.raw(p, l, h, t, x, kind);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(differ, 0u);
  ASSERT_EQ(a.scales().size(), b.scales().size());
  if (!a.scales().empty()) {  // 16-bit pools have none (and memcmp must not see a null pointer)
    EXPECT_EQ(std::memcmp(a.scales().data(), b.scales().data(), a.scales().size() * sizeof(float)),
              0);
  }
}

class KernelLayouts : public testing::TestWithParam<LayoutCase> {};

TEST_P(KernelLayouts, DecodeGivesTheSameBitsInBothLayouts) {
  const LayoutCase& c = GetParam();
  const Geometry g = geometry_of(c);
  Twins tw(g, {1, 37, 100, 5}, 11);
  const uint32_t nq = c.kv_heads * c.group;
  const auto seqs = static_cast<uint32_t>(tw.ctx.size());
  std::mt19937_64 rng(3);
  const std::vector<float> q = test::random_normal(rng, size_t{seqs} * nq * c.d, 1.0f);
  std::vector<cpu::Isa> isas{cpu::Isa::baseline};
  if (cpu::isa_supported(cpu::Isa::avx2) && c.d % 8 == 0) isas.push_back(cpu::Isa::avx2);
  for (cpu::Isa isa : isas) {
    for (uint32_t split : {0u, 2 * c.t_page}) {
      std::vector<float> out[3];
      TestPool* pools[3] = {&tw.pm, &tw.lm, &tw.sm};
      for (int i = 0; i < 3; ++i) {
        out[i].assign(q.size(), -1.0f);
        DecodeArgs a;
        a.kv = pools[i]->kv();
        a.layer = kLayer;
        a.num_seqs = seqs;
        a.num_q_heads = nq;
        a.q = q.data();
        a.out = out[i].data();
        a.block_tables = tw.tables.data();
        a.block_table_stride = tw.widest;
        a.context_lens = tw.ctx.data();
        a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
        a.split_tokens = split;
        ASSERT_EQ(cpu::decode(a, pools[i]->num_pages(), 2, isa), "");
      }
      for (int i = 1; i < 3; ++i) {
        EXPECT_TRUE(all_finite(out[i])) << cpu::isa_name(isa) << " split " << split << " " << i;
        EXPECT_TRUE(same_bits(out[0], out[i]))
            << cpu::isa_name(isa) << " split " << split << " " << i;
      }
    }
  }
}

TEST_P(KernelLayouts, ExtendGivesTheSameBitsInBothLayouts) {
  const LayoutCase& c = GetParam();
  const Geometry g = geometry_of(c);
  Twins tw(g, {40, 9, 1}, 12);
  const std::vector<uint32_t> q_offsets{0, 20, 29, 30};  // 20, 9 and 1 new tokens
  const uint32_t nq = c.kv_heads * c.group;
  std::mt19937_64 rng(4);
  const std::vector<float> q = test::random_normal(rng, size_t{q_offsets.back()} * nq * c.d, 1.0f);
  std::vector<float> out[3];
  TestPool* pools[3] = {&tw.pm, &tw.lm, &tw.sm};
  for (int i = 0; i < 3; ++i) {
    out[i].assign(q.size(), -1.0f);
    ExtendArgs a;
    a.kv = pools[i]->kv();
    a.layer = kLayer;
    a.num_seqs = 3;
    a.num_q_heads = nq;
    a.q = q.data();
    a.out = out[i].data();
    a.q_offsets = q_offsets.data();
    a.block_tables = tw.tables.data();
    a.block_table_stride = tw.widest;
    a.context_lens = tw.ctx.data();
    a.scale = 0.125f;
    ASSERT_EQ(cpu::extend(a, pools[i]->num_pages(), 2), "");
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_TRUE(all_finite(out[i])) << i;
    EXPECT_TRUE(same_bits(out[0], out[i])) << i;
  }
}

// Appends `tokens` tokens of growing magnitude (8-bit pools re-quantise a page's earlier rows)
// into pages `pages`, in slot order, with a −1 slot among them.
void append_tokens(TestPool& pool, const std::vector<PageId>& pages, uint32_t tokens,
                   uint64_t seed) {
  const Geometry& g = pool.geometry();
  std::mt19937_64 rng(seed);
  const size_t row = size_t{g.kv_heads} * g.head_dim;
  std::vector<float> k = test::random_normal(rng, tokens * row, 1.0f);
  std::vector<float> v = test::random_normal(rng, tokens * row, 1.0f);
  std::vector<int64_t> slots(tokens);
  for (uint32_t t = 0; t < tokens; ++t) {
    for (size_t e = 0; e < row; ++e) {
      k[t * row + e] *= 1.0f + 0.5f * static_cast<float>(t);
      v[t * row + e] *= 1.0f + 0.25f * static_cast<float>(t);
    }
    slots[t] = int64_t{pages[t / g.tokens_per_page]} * g.tokens_per_page + t % g.tokens_per_page;
  }
  slots[tokens / 2] = -1;
  AppendArgs a;
  a.kv = pool.kv();
  a.layer = kLayer;
  a.num_tokens = tokens;
  a.k = k.data();
  a.v = v.data();
  a.slots = slots.data();
  ASSERT_EQ(cpu::append_kv(a, pool.num_pages()), "");
}

TEST_P(KernelLayouts, AppendAndCopyStoreTheSameElementsInBothLayouts) {
  const LayoutCase& c = GetParam();
  const Geometry g = geometry_of(c);
  TestPool pm(g, 9, 21, KvLayout::page_major);
  TestPool lm(g, 9, 21, KvLayout::layer_major);
  TestPool sm(g, 9, 21, KvLayout::layer_major, kSegmentPages);
  const std::vector<PageId> pages = pm.take_pages(3);
  ASSERT_EQ(pages, lm.take_pages(3));
  ASSERT_EQ(pages, sm.take_pages(3));
  const uint32_t tokens = 3 * c.t_page - 1;
  append_tokens(pm, pages, tokens, 5);
  append_tokens(lm, pages, tokens, 5);
  append_tokens(sm, pages, tokens, 5);
  expect_same_contents(pm, lm);
  expect_same_contents(pm, sm);

  // Copy the three pages onto three others; a source may feed two destinations.
  const std::vector<PageId> dst = pm.take_pages(4);
  ASSERT_EQ(dst, lm.take_pages(4));
  ASSERT_EQ(dst, sm.take_pages(4));
  const std::vector<PageId> src{pages[0], pages[1], pages[2], pages[0]};
  for (TestPool* pool : {&pm, &lm, &sm}) {
    CopyPagesArgs a;
    a.kv = pool->kv();
    a.num_pairs = 4;
    a.src = src.data();
    a.dst = dst.data();
    ASSERT_EQ(cpu::copy_pages(a, pool->num_pages()), "");
  }
  expect_same_contents(pm, lm);
  expect_same_contents(pm, sm);
  // And the copy is whole: every layer and both K and V of the destination equal the source's.
  uint64_t differ = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < g.tokens_per_page; ++t) {
          for (uint32_t x = 0; x < g.head_dim; ++x) {
            for (int kind = 0; kind < 2; ++kind) {
              differ += lm.raw(src[i], l, h, t, x, kind) != lm.raw(dst[i], l, h, t, x, kind);
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(differ, 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, KernelLayouts,
                         testing::Values(LayoutCase{KvDtype::fp16, 16, 64, 2, 4},
                                         LayoutCase{KvDtype::bf16, 8, 128, 4, 1},
                                         LayoutCase{KvDtype::fp8_e4m3, 16, 64, 2, 2},
                                         LayoutCase{KvDtype::int8, 5, 24, 3, 2},
                                         LayoutCase{KvDtype::fp16, 3, 20, 2, 3}),
                         case_name);

// Append into a layer_major pool and read the bytes at the documented offsets, computed by hand:
// K of (page p, layer l, token t, head h, dim d) at l · 2PTHD + p · THD + (t · H + h) · D + d
// elements, V at the same + PTHD.
TEST(KernelLayoutOffsets, AppendWritesVllmsPerLayerShape) {
  const Geometry g{2, 3, 8, 4, KvDtype::fp16};
  const uint32_t P = 5, T = 4, H = 3, D = 8;
  TestPool pool(g, P, 1, KvLayout::layer_major);
  // Token values that fp16 holds exactly (at most 10 significant bits): k = 16·t + 4·h + d/8,
  // v = −k.
  const uint32_t tokens = 6;
  std::vector<float> k(size_t{tokens} * H * D), v(k.size());
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t h = 0; h < H; ++h) {
      for (uint32_t d = 0; d < D; ++d) {
        k[(t * H + h) * D + d] = static_cast<float>(t) * 16.0f + static_cast<float>(h) * 4.0f +
                                 static_cast<float>(d) / 8.0f;
        v[(t * H + h) * D + d] = -k[(t * H + h) * D + d];
      }
    }
  }
  // Tokens 0..3 in page 3, tokens 4..5 in page 1, slots 0 and 2.
  const std::vector<int64_t> slots{12, 13, 14, 15, 4, 6};
  AppendArgs a;
  a.kv = pool.kv();
  a.layer = 1;
  a.num_tokens = tokens;
  a.k = k.data();
  a.v = v.data();
  a.slots = slots.data();
  ASSERT_EQ(cpu::append_kv(a, P), "");

  const auto* bytes = pool.bytes().data();
  auto at = [&](uint64_t elem) {
    uint16_t bits = 0;
    std::memcpy(&bits, bytes + elem * 2, 2);
    return fp16_to_f32(bits);
  };
  const uint64_t plane = uint64_t{P} * T * H * D;
  for (uint32_t i = 0; i < tokens; ++i) {
    const auto page = static_cast<uint32_t>(slots[i] / T);
    const auto t = static_cast<uint32_t>(slots[i] % T);
    for (uint32_t h = 0; h < H; ++h) {
      for (uint32_t d = 0; d < D; ++d) {
        const uint64_t kk = 1 * 2 * plane + uint64_t{page} * T * H * D + (t * H + h) * D + d;
        EXPECT_EQ(at(kk), k[(i * H + h) * D + d]) << i << " " << h << " " << d;
        EXPECT_EQ(at(kk + plane), v[(i * H + h) * D + d]) << i << " " << h << " " << d;
        EXPECT_EQ(kk, layer_major_k_offset(g, P, page, 1, h, t, d));
        EXPECT_EQ(kk + plane, layer_major_v_offset(g, P, page, 1, h, t, d));
      }
    }
  }
  // Layer 0 and every untouched slot of layer 1 keep their NaN.
  uint64_t written = 0;
  for (uint64_t e = 0; e < 4 * plane; ++e)
    written += !std::isnan(at(e));
  EXPECT_EQ(written, uint64_t{tokens} * H * D * 2);
}

TEST(KernelLayoutOffsets, LayerMajorPlanesMustCoverThePageIds) {
  const Geometry g{2, 2, 16, 4, KvDtype::bf16};
  TestPool pool(g, 4, 1, KvLayout::layer_major);
  PagedKv kv = pool.kv();
  kv.num_pages = 3;  // planes of 3 pages, ids up to 4
  const std::vector<PageId> src{0}, dst{3};
  CopyPagesArgs c;
  c.kv = kv;
  c.num_pairs = 1;
  c.src = src.data();
  c.dst = dst.data();
  EXPECT_NE(cpu::copy_pages(c, 4).find("kv.num_pages 3"), std::string::npos);

  const std::vector<float> rows(2 * 16, 1.0f);
  const std::vector<int64_t> slots{0};
  AppendArgs a;
  a.kv = kv;
  a.num_tokens = 1;
  a.k = rows.data();
  a.v = rows.data();
  a.slots = slots.data();
  EXPECT_NE(cpu::append_kv(a, 4).find("kv.num_pages"), std::string::npos);

  const std::vector<float> q(2 * 16, 1.0f);
  std::vector<float> out(q.size());
  const uint32_t ctx = 1;
  const PageId table = 0;
  DecodeArgs d;
  d.kv = kv;
  d.num_seqs = 1;
  d.num_q_heads = 2;
  d.q = q.data();
  d.out = out.data();
  d.block_tables = &table;
  d.block_table_stride = 1;
  d.context_lens = &ctx;
  EXPECT_NE(cpu::decode(d, 4).find("kv.num_pages"), std::string::npos);
  kv.num_pages = 4;
  d.kv = kv;
  EXPECT_EQ(cpu::decode(d, 4), "");  // planes as large as the id range: fine (reads NaN)
}

TEST(KernelLayoutOffsets, SegmentFieldsMustFitTheLayout) {
  const Geometry g{2, 2, 16, 4, KvDtype::bf16};
  TestPool pool(g, 6, 1, KvLayout::layer_major, 3);
  const PagedKv good = pool.kv();
  ASSERT_TRUE(segments_fit(good));
  const uint64_t block = uint64_t{4} * 2 * 16 * 2;  // T · H · D · 2 bytes
  EXPECT_EQ(good.segment_stride, (2 * 2 * 3 + 2) * block);
  // Block indices: segment s starts segment_stride / block blocks after segment s − 1.
  EXPECT_EQ(block_index(good, 2), 2u);
  EXPECT_EQ(block_index(good, 3), good.segment_stride / block);
  EXPECT_EQ(block_index(good, 5), good.segment_stride / block + 2);
  const std::vector<int64_t> slots{0};
  const std::vector<float> rows(2 * 16, 1.0f);
  auto append_error = [&](const PagedKv& kv) {
    AppendArgs a;
    a.kv = kv;
    a.num_tokens = 1;
    a.k = rows.data();
    a.v = rows.data();
    a.slots = slots.data();
    return cpu::append_kv(a, 6);
  };
  EXPECT_EQ(append_error(good), "");
  PagedKv small = good;  // a segment too short for its planes
  small.segment_stride = 2 * 2 * 3 * block - block;
  EXPECT_NE(append_error(small).find("segment_stride"), std::string::npos);
  PagedKv ragged = good;  // not whole blocks
  ragged.segment_stride += 2;
  EXPECT_NE(append_error(ragged).find("segment_stride"), std::string::npos);
  PagedKv half = good;  // pages without a stride
  half.segment_stride = 0;
  EXPECT_NE(append_error(half).find("segment_stride"), std::string::npos);
  TestPool pm(g, 6, 1);
  PagedKv page_major = pm.kv();
  page_major.segment_pages = 3;
  page_major.segment_stride = good.segment_stride;
  EXPECT_NE(append_error(page_major).find("page_major"), std::string::npos);
}

}  // namespace
}  // namespace kvpool::kernels

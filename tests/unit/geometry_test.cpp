#include "common/geometry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kvpool {
namespace {

TEST(Geometry, TextbookSeventyBillionFigure) {
  // 80 layers × 64 heads × head dim 128 × 4,096 tokens × 2 bytes × 2 (K and V).
  const Geometry g{80, 64, 128, 16, KvDtype::fp16};
  EXPECT_EQ(kv_bytes(g, 4096), 10'737'418'240ull);
  EXPECT_EQ(kv_bytes_per_token(g), 2ull * 80 * 64 * 128 * 2);
}

TEST(Geometry, EightBillionGqaIsExactlyOneGiB) {
  // 32 layers × 8 KV heads × head dim 128 × 8,192 tokens × 2 bytes × 2.
  const Geometry g{32, 8, 128, 16, KvDtype::bf16};
  EXPECT_EQ(kv_bytes(g, 8192), 1ull << 30);
  // 8,192 tokens fill 512 pages of 16 tokens exactly, so the pool holds exactly that too.
  EXPECT_EQ(pages_for_tokens(g, 8192), 512u);
  EXPECT_EQ(pool_bytes_for_tokens(g, 8192), 1ull << 30);
}

TEST(Geometry, PageBytesAndScales) {
  const Geometry fp16{32, 8, 128, 16, KvDtype::fp16};
  EXPECT_EQ(page_data_bytes(fp16), 2ull * 32 * 8 * 16 * 128 * 2);
  EXPECT_EQ(page_scale_bytes(fp16), 0u);
  const Geometry fp8{32, 8, 128, 16, KvDtype::fp8_e4m3};
  EXPECT_EQ(page_data_bytes(fp8), 2ull * 32 * 8 * 16 * 128);
  EXPECT_EQ(page_scale_bytes(fp8), 2ull * 32 * 8 * 4);
  const Geometry i8{32, 8, 128, 16, KvDtype::int8};
  EXPECT_EQ(page_data_bytes(i8), page_data_bytes(fp8));
}

TEST(Geometry, PartialPagesRoundUp) {
  const Geometry g{2, 2, 64, 16, KvDtype::fp16};
  EXPECT_EQ(pages_for_tokens(g, 0), 0u);
  EXPECT_EQ(pages_for_tokens(g, 1), 1u);
  EXPECT_EQ(pages_for_tokens(g, 16), 1u);
  EXPECT_EQ(pages_for_tokens(g, 17), 2u);
  EXPECT_EQ(pool_bytes_for_tokens(g, 17), 2 * page_data_bytes(g));
}

TEST(Geometry, LayoutIsKThenVPerLayerWithHeadTiles) {
  const Geometry g{3, 4, 8, 16, KvDtype::bf16};
  const uint64_t tile = 16 * 8;
  EXPECT_EQ(page_k_offset(g, 0, 0, 0, 0), 0u);
  EXPECT_EQ(page_k_offset(g, 0, 0, 1, 0), 8u);        // next token: one head_dim on
  EXPECT_EQ(page_k_offset(g, 0, 1, 0, 0), tile);      // next head: one T×D tile on
  EXPECT_EQ(page_v_offset(g, 0, 0, 0, 0), 4 * tile);  // V after all K heads of the layer
  EXPECT_EQ(page_k_offset(g, 1, 0, 0, 0), 8 * tile);  // next layer after K and V
  // The last element of the page is the last element of the page size.
  EXPECT_EQ((page_v_offset(g, 2, 3, 15, 7) + 1) * dtype_bytes(g.dtype), page_data_bytes(g));
}

TEST(Geometry, ValidateNamesTheBadField) {
  EXPECT_EQ(validate(Geometry{32, 8, 128, 16, KvDtype::fp16}), "");
  EXPECT_NE(validate(Geometry{0, 8, 128, 16, KvDtype::fp16}).find("layers"), std::string::npos);
  EXPECT_NE(validate(Geometry{32, 0, 128, 16, KvDtype::fp16}).find("kv_heads"), std::string::npos);
  EXPECT_NE(validate(Geometry{32, 8, 0, 16, KvDtype::fp16}).find("head_dim"), std::string::npos);
  EXPECT_NE(validate(Geometry{32, 8, 128, 0, KvDtype::fp16}).find("tokens_per_page"),
            std::string::npos);
  EXPECT_NE(validate(Geometry{UINT32_MAX, UINT32_MAX, 128, 16, KvDtype::fp16}).find("exceeds"),
            std::string::npos);
}

TEST(Geometry, DtypeNamesRoundTrip) {
  for (KvDtype d : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_EQ(parse_dtype("fp8-e4m3"), KvDtype::fp8_e4m3);
  EXPECT_FALSE(parse_dtype("fp4").has_value());
}

TEST(KvLayout, NamesRoundTripAndNothingElseParses) {
  for (KvLayout l : {KvLayout::page_major, KvLayout::layer_major}) {
    EXPECT_EQ(parse_layout(layout_name(l)), l);
  }
  EXPECT_EQ(layout_name(KvLayout::page_major), "page_major");
  EXPECT_EQ(layout_name(KvLayout::layer_major), "layer_major");
  EXPECT_EQ(parse_layout("layer-major"), std::nullopt);
  EXPECT_EQ(parse_layout("Layer_major"), std::nullopt);
  EXPECT_EQ(parse_layout(""), std::nullopt);
}

// vLLM's flash-attn cache of one layer is [2][num_blocks][block_size][kv_heads][head_dim]: the
// strides below are those of that tensor, written out by hand.
TEST(KvLayout, LayerMajorOffsetsAreVllmsPerLayerTensor) {
  const Geometry g{4, 8, 128, 16, KvDtype::bf16};
  const uint64_t P = 100;
  const uint64_t block = 16 * 8 * 128;  // one page of one layer's K
  EXPECT_EQ(layer_stride_elems(g, P), 2 * P * block);
  EXPECT_EQ(layer_stride_bytes(g, KvLayout::layer_major, P), 2 * P * block * 2);
  EXPECT_EQ(layer_stride_bytes(g, KvLayout::page_major, P), 0u);
  // (page 7, layer 3, token 5, head 6, dim 9)
  const uint64_t k = 3 * 2 * P * block + 7 * block + (5 * 8 + 6) * 128 + 9;
  EXPECT_EQ(layer_major_k_offset(g, P, 7, 3, 6, 5, 9), k);
  EXPECT_EQ(layer_major_v_offset(g, P, 7, 3, 6, 5, 9), k + P * block);
  EXPECT_EQ(kv_k_offset(g, KvLayout::layer_major, P, 7, 3, 6, 5, 9), k);
  EXPECT_EQ(kv_v_offset(g, KvLayout::layer_major, P, 7, 3, 6, 5, 9), k + P * block);
  const KvElementStrides s = kv_element_strides(g, KvLayout::layer_major, P);
  EXPECT_EQ(s, (KvElementStrides{block, 2 * P * block, 128, 8 * 128, P * block}));
  static_assert(layer_major_k_offset(Geometry{1, 2, 4, 3, KvDtype::fp16}, 5, 1, 0, 1, 2, 3) ==
                1 * 3 * 2 * 4 + (2 * 2 + 1) * 4 + 3);  // usable in constant expressions
}

// Page-major strides reproduce page_k_offset / page_v_offset (pages page_data_bytes apart).
TEST(KvLayout, PageMajorStridesAreTheInPageOffsets) {
  const Geometry g{3, 2, 5, 4, KvDtype::fp16};
  const KvElementStrides s = kv_element_strides(g, KvLayout::page_major, 9);
  const uint64_t page = page_data_bytes(g) / 2;
  EXPECT_EQ(s.page, page);
  for (uint32_t p = 0; p < 3; ++p) {
    for (uint32_t l = 0; l < g.layers; ++l) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t t = 0; t < g.tokens_per_page; ++t) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint64_t k = p * s.page + l * s.layer + h * s.head + t * s.token + d;
            ASSERT_EQ(k, p * page + page_k_offset(g, l, h, t, d));
            ASSERT_EQ(k + s.v, p * page + page_v_offset(g, l, h, t, d));
            ASSERT_EQ(k, kv_k_offset(g, KvLayout::page_major, 9, p, l, h, t, d));
            ASSERT_EQ(k + s.v, kv_v_offset(g, KvLayout::page_major, 9, p, l, h, t, d));
          }
        }
      }
    }
  }
}

// Both layouts place every (page, layer, head, token, dim, K|V) at its own element of
// [0, P · page_data_bytes / dtype_bytes): the same memory, each element used once.
TEST(KvLayout, BothLayoutsFillThePoolExactlyOnce) {
  const Geometry g{3, 2, 5, 4, KvDtype::int8};
  const uint32_t P = 6;
  const uint64_t total = P * page_data_bytes(g);
  for (KvLayout layout : {KvLayout::page_major, KvLayout::layer_major}) {
    const KvElementStrides s = kv_element_strides(g, layout, P);
    std::vector<int> seen(total, 0);
    for (uint32_t p = 0; p < P; ++p) {
      for (uint32_t l = 0; l < g.layers; ++l) {
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          for (uint32_t t = 0; t < g.tokens_per_page; ++t) {
            for (uint32_t d = 0; d < g.head_dim; ++d) {
              const uint64_t k = p * s.page + l * s.layer + h * s.head + t * s.token + d;
              ASSERT_LT(k + s.v, total);
              ++seen[k];
              ++seen[k + s.v];
            }
          }
        }
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(total))
        << layout_name(layout);
  }
}

TEST(Geometry, AWindowFitsItsAttentionKind) {
  Geometry g{32, 8, 128, 16, KvDtype::bf16, AttentionKind::sliding, 4096};
  EXPECT_EQ(validate(g), "");
  const Geometry full{32, 8, 128, 16, KvDtype::bf16, AttentionKind::full, 0};
  EXPECT_EQ(page_data_bytes(g), page_data_bytes(full));  // the kind changes no size
  g.window = 0;
  EXPECT_EQ(validate(g), "window must be at least 1 token for kind sliding");
  g = full;
  g.window = 128;
  EXPECT_NE(validate(g).find("full-attention"), std::string::npos) << validate(g);
  g = full;
  g.kind = AttentionKind::latent;
  EXPECT_NE(validate(g).find("kv_heads 8 on a latent geometry"), std::string::npos) << validate(g);
  g.kv_heads = 1;
  EXPECT_EQ(validate(g), "");
  g.window = 64;
  EXPECT_EQ(validate(g), "window 64 is set on a latent geometry (no window)");
  g.kind = static_cast<AttentionKind>(9);
  EXPECT_EQ(validate(g), "kind is not one of full, sliding, chunked, latent");
  for (AttentionKind k : {AttentionKind::full, AttentionKind::sliding, AttentionKind::chunked,
                          AttentionKind::latent}) {
    EXPECT_EQ(parse_attention_kind(attention_kind_name(k)), k);
  }
  EXPECT_EQ(parse_attention_kind("Sliding"), std::nullopt);
}

// A latent (MLA) geometry keeps one vector per token and layer: half the bytes of K/V of the same
// head_dim, one scale per (page, layer), no V plane (v stride 0: V is K), and in both layouts every
// element of the pool belongs to exactly one (page, layer, token, dim).
TEST(Geometry, ALatentPoolHoldsOneVectorPerTokenAndLayer) {
  const Geometry mla{61, 1, 576, 64, KvDtype::bf16, AttentionKind::latent, 0};
  ASSERT_EQ(validate(mla), "");
  EXPECT_EQ(kv_planes(mla), 1u);
  EXPECT_EQ(kv_bytes_per_token(mla), 61u * 576 * 2);  // DeepSeek-V3: 70,272 bytes a token
  EXPECT_EQ(page_data_bytes(mla), 61u * 576 * 2 * 64);
  Geometry fp8 = mla;
  fp8.dtype = KvDtype::fp8_e4m3;
  EXPECT_EQ(page_scale_bytes(fp8), 61u * 4);
  EXPECT_EQ(scale_index(fp8, 3, 5, 0, false), 3u * 61 + 5);
  EXPECT_EQ(scale_index(fp8, 3, 5, 0, true), 3u * 61 + 5);  // V's scale is K's
  const Geometry kv{61, 1, 576, 64, KvDtype::fp8_e4m3};
  EXPECT_EQ(scale_index(kv, 3, 5, 0, true), (3u * 61 + 5) * 2 + 1);

  const Geometry g{3, 1, 5, 4, KvDtype::int8, AttentionKind::latent, 0};
  const uint32_t P = 6;
  const uint64_t total = P * page_data_bytes(g);
  for (KvLayout layout : {KvLayout::page_major, KvLayout::layer_major}) {
    const KvElementStrides s = kv_element_strides(g, layout, P);
    EXPECT_EQ(s.v, 0u) << layout_name(layout);
    std::vector<int> seen(total, 0);
    for (uint32_t p = 0; p < P; ++p) {
      for (uint32_t l = 0; l < g.layers; ++l) {
        for (uint32_t t = 0; t < g.tokens_per_page; ++t) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            const uint64_t k = p * s.page + l * s.layer + t * s.token + d;
            ASSERT_LT(k, total);
            ASSERT_EQ(k, kv_k_offset(g, layout, P, p, l, 0, t, d));
            ASSERT_EQ(k, kv_v_offset(g, layout, P, p, l, 0, t, d));
            ++seen[k];
          }
        }
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), static_cast<std::ptrdiff_t>(total))
        << layout_name(layout);
  }
}

}  // namespace
}  // namespace kvpool

#include "common/geometry.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvpool

// KV planning for layer groups (common/kv_plan.h): values per token for each attention kind,
// the pages a window or chunk keeps at its edges, and whole models against hand-worked figures.
#include "common/kv_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvpool {
namespace {

LayerGroup full(uint32_t layers, uint32_t kv_heads, uint32_t head_dim) {
  LayerGroup g;
  g.kind = AttentionKind::full;
  g.layers = layers;
  g.kv_heads = kv_heads;
  g.head_dim = head_dim;
  return g;
}

LayerGroup windowed(AttentionKind kind, uint32_t window, uint32_t layers, uint32_t kv_heads,
                    uint32_t head_dim) {
  LayerGroup g = full(layers, kv_heads, head_dim);
  g.kind = kind;
  g.window = window;
  return g;
}

LayerGroup deepseek_v3() {
  LayerGroup g;
  g.kind = AttentionKind::latent;
  g.layers = 61;
  g.q_heads = 128;
  g.latent_dim = 512;
  g.rope_dim = 64;
  g.nope_dim = 128;
  g.v_head_dim = 128;
  return g;
}

TEST(KvPlan, KindNamesRoundTrip) {
  for (AttentionKind k : {AttentionKind::full, AttentionKind::sliding, AttentionKind::chunked,
                          AttentionKind::latent}) {
    EXPECT_EQ(parse_attention_kind(attention_kind_name(k)), k);
  }
  EXPECT_EQ(parse_attention_kind("Full"), std::nullopt);
  EXPECT_EQ(parse_attention_kind(""), std::nullopt);
}

TEST(KvPlan, ValuesPerTokenAndLayer) {
  EXPECT_EQ(values_per_token_layer(full(1, 8, 128)), 2u * 8 * 128);
  EXPECT_EQ(values_per_token_layer(windowed(AttentionKind::sliding, 4096, 1, 8, 128)),
            2u * 8 * 128);
  EXPECT_EQ(values_per_token_layer(deepseek_v3()), 576u);  // one latent, no V
}

TEST(KvPlan, PagesAtTheWindowsEdges) {
  constexpr uint32_t T = 16;
  const LayerGroup one = windowed(AttentionKind::sliding, 1, 1, 1, 8);
  EXPECT_EQ(pages_per_layer(one, 1000, T), 1u);  // a window of one key: its own page
  const LayerGroup page = windowed(AttentionKind::sliding, T, 1, 1, 8);
  EXPECT_EQ(pages_per_layer(page, 1000, T), 2u);  // T keys not aligned to a page straddle two
  EXPECT_EQ(pages_per_layer(page, 10, T), 1u);    // never more than the context's own pages
  const LayerGroup mid = windowed(AttentionKind::sliding, 20, 1, 1, 8);
  EXPECT_EQ(pages_per_layer(mid, 1000, T), 3u);  // 20 keys span at most 3 pages of 16
  const LayerGroup wide = windowed(AttentionKind::sliding, 1u << 20, 1, 1, 8);
  EXPECT_EQ(pages_per_layer(wide, 100, T), 7u);  // a window wider than the context: all of it
  // Chunks start at multiples of the chunk: one of whole pages fills exactly those pages.
  EXPECT_EQ(pages_per_layer(windowed(AttentionKind::chunked, 64, 1, 1, 8), 1000, T), 4u);
  // 24-token chunks start 0 or 8 tokens into a page of 16: two pages at most; 8-token chunks
  // never leave their page.
  EXPECT_EQ(pages_per_layer(windowed(AttentionKind::chunked, 24, 1, 1, 8), 1000, T), 2u);
  EXPECT_EQ(pages_per_layer(windowed(AttentionKind::chunked, 8, 1, 1, 8), 1000, T), 1u);
  EXPECT_EQ(pages_per_layer(full(1, 1, 8), 33, T), 3u);
}

TEST(KvPlan, WholeModelsAgainstHandWorkedFigures) {
  // Llama-3.1-8B at 32k tokens in bf16: 2 · 32 · 8 · 128 · 2 bytes a token = 4 GiB.
  const KvPlan llama = plan_sequence({full(32, 8, 128)}, 32768, 16, KvDtype::bf16);
  EXPECT_EQ(llama.bytes, 4ull << 30);
  EXPECT_EQ(llama.full_kv_bytes, 4ull << 30);
  EXPECT_EQ(llama.bytes_per_token_all_layers, 131072u);
  // Mistral-7B: a 4096-token window holds 257 pages of 16 in each of 32 layers.
  const KvPlan mistral =
      plan_sequence({windowed(AttentionKind::sliding, 4096, 32, 8, 128)}, 32768, 16, KvDtype::bf16);
  EXPECT_EQ(mistral.bytes, 32ull * 257 * 16 * 4096);
  EXPECT_EQ(mistral.full_kv_bytes, 4ull << 30);
  // DeepSeek-V3: 576 values a token and layer, against 128 · (128 + 64 + 128) uncompressed.
  const KvPlan ds = plan_sequence({deepseek_v3()}, 32768, 16, KvDtype::bf16);
  EXPECT_EQ(ds.bytes, 61ull * 32768 * 576 * 2);
  EXPECT_EQ(ds.full_kv_bytes, 61ull * 32768 * 128 * 320 * 2);
  // 8-bit: one float scale per (page, layer, KV head, K|V); a latent page one per layer.
  const KvPlan fp8 = plan_sequence({full(2, 4, 64)}, 32, 16, KvDtype::fp8_e4m3);
  EXPECT_EQ(fp8.bytes, 2ull * 2 * (16 * 2 * 4 * 64 + 2 * 4 * 4));
  const KvPlan fp8_latent = plan_sequence({deepseek_v3()}, 16, 16, KvDtype::fp8_e4m3);
  EXPECT_EQ(fp8_latent.bytes, 61ull * (16 * 576 + 4));
  // A hybrid adds its groups: Gemma-2-9B's 21 sliding (4096) + 21 full layers.
  const KvPlan gemma =
      plan_sequence({windowed(AttentionKind::sliding, 4096, 21, 8, 256), full(21, 8, 256)}, 32768,
                    16, KvDtype::bf16);
  EXPECT_EQ(gemma.bytes, 21ull * 257 * 16 * 8192 + 21ull * 32768 * 8192);
}

TEST(KvPlan, GroupsThatDoNotFitTheirKindAreRefusedByField) {
  LayerGroup g = windowed(AttentionKind::sliding, 0, 4, 8, 128);
  EXPECT_EQ(validate_group(g), "window: a sliding group needs a window of at least 1 token");
  g = full(4, 8, 128);
  g.window = 128;
  EXPECT_EQ(validate_group(g), "window: a full group has no window");
  g = full(4, 8, 128);
  g.q_heads = 12;
  EXPECT_EQ(validate_group(g), "q_heads: 12 is not a multiple of kv_heads 8");
  g = deepseek_v3();
  g.latent_dim = 0;
  EXPECT_EQ(validate_group(g), "latent_dim: a latent group needs a latent width of at least 1");
  g = full(0, 8, 128);
  EXPECT_EQ(validate_group(g), "layers: a group needs at least 1 layer");
  g = deepseek_v3();
  g.q_heads = 0;
  EXPECT_NE(validate_group(g).find("q_heads"), std::string::npos);
  EXPECT_EQ(validate_group(full(5000, 8, 128)), "layers: more than 4096");
  EXPECT_EQ(validate_group(full(4, 8, 1u << 20)), "head_dim: more than 65536");
  EXPECT_EQ(validate_group(deepseek_v3()), "");
  EXPECT_EQ(validate_group(full(1, 1, 64)), "");
}

}  // namespace
}  // namespace kvpool

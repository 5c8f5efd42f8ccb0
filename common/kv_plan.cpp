#include "common/kv_plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace kvpool {

std::string validate_group(const LayerGroup& g) {
  const std::string kind(attention_kind_name(g.kind));
  if (g.layers == 0) return "layers: a group needs at least 1 layer";
  // Bounds far above any model, so that the byte counts of plan_sequence cannot overflow for
  // contexts below 2^31 tokens: layers · tokens · values · 2 bytes stays below 2^63.
  constexpr uint32_t kMaxLayers = 1u << 12;
  constexpr uint32_t kMaxDim = 1u << 16;
  if (g.layers > kMaxLayers) return "layers: more than " + std::to_string(kMaxLayers);
  for (const auto& [name, v] :
       {std::pair{"q_heads", g.q_heads}, std::pair{"kv_heads", g.kv_heads},
        std::pair{"head_dim", g.head_dim}, std::pair{"latent_dim", g.latent_dim},
        std::pair{"rope_dim", g.rope_dim}, std::pair{"nope_dim", g.nope_dim},
        std::pair{"v_head_dim", g.v_head_dim}}) {
    if (v > kMaxDim) return std::string(name) + ": more than " + std::to_string(kMaxDim);
  }
  if (g.kind == AttentionKind::latent) {
    if (g.latent_dim == 0) return "latent_dim: a latent group needs a latent width of at least 1";
    if (g.q_heads == 0) {
      return "q_heads: a latent group needs its query heads (what its uncompressed K/V would be)";
    }
    if (g.kv_heads != 0 || g.window != 0) {
      return "kv_heads, window: a latent group caches one vector per token (no KV heads, no "
             "window)";
    }
    return {};
  }
  if (g.kv_heads == 0) return "kv_heads: a " + kind + " group needs at least 1 KV head";
  if (g.head_dim == 0) return "head_dim: a " + kind + " group needs a head_dim of at least 1";
  if (g.q_heads != 0 && g.q_heads % g.kv_heads != 0) {
    return "q_heads: " + std::to_string(g.q_heads) + " is not a multiple of kv_heads " +
           std::to_string(g.kv_heads);
  }
  if (g.latent_dim != 0 || g.rope_dim != 0) {
    return "latent_dim, rope_dim: only a latent group has them, not a " + kind + " one";
  }
  const bool windowed = g.kind == AttentionKind::sliding || g.kind == AttentionKind::chunked;
  if (windowed && g.window == 0) {
    return "window: a " + kind + " group needs a window of at least 1 token";
  }
  if (!windowed && g.window != 0) return "window: a full group has no window";
  return {};
}

uint64_t values_per_token_layer(const LayerGroup& g) {
  if (g.kind == AttentionKind::latent) return uint64_t{g.latent_dim} + g.rope_dim;
  return 2ull * g.kv_heads * g.head_dim;
}

uint64_t pages_per_layer(const LayerGroup& g, uint64_t tokens, uint32_t tokens_per_page) {
  const uint64_t t = tokens_per_page;
  const uint64_t all = (tokens + t - 1) / t;
  const uint64_t w = g.window;
  switch (g.kind) {
    case AttentionKind::full:
    case AttentionKind::latent:
      return all;
    case AttentionKind::chunked: {
      // Chunks start at multiples of w, so a chunk starts a multiple of gcd(w, t) into a page:
      // at worst t − gcd(w, t) tokens in, and its w tokens then reach the page holding
      // t − gcd + w − 1.
      const uint64_t worst_start = t - std::gcd(w, t);
      return std::min(all, (worst_start + w - 1) / t + 1);
    }
    case AttentionKind::sliding:
      return std::min(all, (w + t - 2) / t + 1);
  }
  return all;
}

namespace {

// Scales per (page, layer) of an 8-bit pool: K and V of each KV head, or the latent vector's one.
uint64_t scales_per_page_layer(const LayerGroup& g) {
  return g.kind == AttentionKind::latent ? 1 : 2ull * g.kv_heads;
}

// Values per token and layer with every layer full K/V (the comparison of the file comment).
uint64_t full_values_per_token_layer(const LayerGroup& g) {
  if (g.kind != AttentionKind::latent) return 2ull * g.kv_heads * g.head_dim;
  return uint64_t{g.q_heads} * (uint64_t{g.nope_dim} + g.rope_dim + g.v_head_dim);
}

}  // namespace

KvPlan plan_sequence(const std::vector<LayerGroup>& groups, uint64_t tokens,
                     uint32_t tokens_per_page, KvDtype dtype) {
  KvPlan p;
  const uint64_t b = dtype_bytes(dtype);
  for (const LayerGroup& g : groups) {
    const uint64_t pages = pages_per_layer(g, tokens, tokens_per_page);
    uint64_t per_page_layer = uint64_t{tokens_per_page} * values_per_token_layer(g) * b;
    if (dtype_is_quantized(dtype)) per_page_layer += scales_per_page_layer(g) * sizeof(float);
    p.bytes += uint64_t{g.layers} * pages * per_page_layer;
    p.full_kv_bytes += uint64_t{g.layers} * tokens * full_values_per_token_layer(g) * b;
    p.bytes_per_token_all_layers += uint64_t{g.layers} * values_per_token_layer(g) * b;
  }
  return p;
}

}  // namespace kvpool

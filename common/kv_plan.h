// KV-cache planning for models whose layers differ: how many bytes a sequence keeps in the pool at
// a given context, layer group by layer group, for the attention shapes served today (the kinds
// of shared/data/models.yaml):
//   full     K and V of every token, per KV head: 2 · kv_heads · head_dim values per token, layer
//   sliding  the same per token, but a layer keeps only the tokens its window still covers: the
//            next query (at position n) sees the last `window` positions, so a layer holds at most
//            `window` tokens, in at most ⌈(window − 1) / T⌉ + 1 pages (a window not aligned to
//            pages straddles one more), never more than the context's own pages
//   chunked  the same per token, but a layer keeps only the current chunk of `window` tokens
//            (Llama-4's attention_chunk_size); chunks start at multiples of the chunk size, so a
//            chunk starts at most T − gcd(window, T) tokens into a page and spans
//            ⌊(T − gcd + window − 1) / T⌋ + 1 pages (window / T when T divides it)
//   latent   MLA: one latent vector per token and layer, latent_dim + rope_dim values (no V;
//            DeepSeek-V3: 512 + 64)
// The figures are the peak a sequence of n tokens needs to go on decoding: pages, not tokens,
// are the unit the pool frees, so windows are counted in whole pages. 8-bit pools add one float
// scale per (page, layer, KV head, K|V) (latent: per (page, layer)).
//
// full_kv_bytes is the comparison every peer's single-kind pool makes: every layer keeping full
// K and V of every token (for a latent group, the K and V its query heads would need without the
// compression: q_heads · (nope_dim + rope_dim + v_head_dim) values).
//
// Pure arithmetic; validate_group names the first bad field, and the functions assume a group that
// passed it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/geometry.h"

namespace kvpool {

// One run of layers with the same attention shape.
struct LayerGroup {
  AttentionKind kind = AttentionKind::full;
  uint32_t layers = 0;
  uint32_t q_heads = 0;
  uint32_t kv_heads = 0;    // full, sliding, chunked
  uint32_t head_dim = 0;    // full, sliding, chunked
  uint32_t window = 0;      // sliding: the window; chunked: the chunk (tokens)
  uint32_t latent_dim = 0;  // latent: kv_lora_rank
  uint32_t rope_dim = 0;    // latent: qk_rope_head_dim
  uint32_t nope_dim = 0;    // latent: qk_nope_head_dim (for the uncompressed comparison only)
  uint32_t v_head_dim = 0;  // latent: v_head_dim (likewise)
  bool sinks = false;       // per-head attention sinks (no bytes in the cache)
};

// Empty when the group fits its kind, else the first bad field ("window: a sliding group needs
// a window of at least 1 token").
std::string validate_group(const LayerGroup& g);

// Values one token keeps per layer of the group (2 · kv_heads · head_dim; latent: latent_dim +
// rope_dim).
uint64_t values_per_token_layer(const LayerGroup& g);

// Pages one layer of the group holds for a sequence of `tokens` tokens (T tokens per page).
uint64_t pages_per_layer(const LayerGroup& g, uint64_t tokens, uint32_t tokens_per_page);

struct KvPlan {
  uint64_t bytes = 0;          // what the pool holds for the sequence: whole pages, scales
  uint64_t full_kv_bytes = 0;  // every layer full K/V of every token, tokens not rounded
  uint64_t bytes_per_token_all_layers = 0;  // values per token over all layers × dtype bytes
};

KvPlan plan_sequence(const std::vector<LayerGroup>& groups, uint64_t tokens,
                     uint32_t tokens_per_page, KvDtype dtype);

}  // namespace kvpool

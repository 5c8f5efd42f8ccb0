// Page geometry and KV-cache size arithmetic.
//
// A pool serves one model geometry: L layers, H KV heads, head dim D, T tokens per page and a KV
// dtype. One page holds, for each layer, K then V, each laid out [H][T][D] (one contiguous T×D tile
// per KV head), so
//     page_data_bytes  = 2 · L · H · T · D · dtype_bytes
// Quantised (8-bit) pools keep one float scale per (page, layer, KV head) for K and one for V in a
// side region indexed by page id: page_scale_bytes = 2 · L · H · 4.
//
// Every function here is pure, constexpr where it can be, and usable from host and device code.
// Sizes are uint64_t; validate() rejects geometries whose page size would overflow or be zero, so
// the arithmetic on a validated geometry cannot overflow for any token count below 2^32.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvpool {

enum class KvDtype : uint8_t { fp16 = 0, bf16 = 1, fp8_e4m3 = 2, int8 = 3 };

constexpr uint32_t dtype_bytes(KvDtype d) {
  return (d == KvDtype::fp16 || d == KvDtype::bf16) ? 2u : 1u;
}
constexpr bool dtype_is_quantized(KvDtype d) {
  return d == KvDtype::fp8_e4m3 || d == KvDtype::int8;
}
std::string_view dtype_name(KvDtype d);
// Accepts "fp16", "bf16", "fp8" / "fp8_e4m3" / "fp8-e4m3", "int8".
std::optional<KvDtype> parse_dtype(std::string_view name);

struct Geometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens_per_page = 0;
  KvDtype dtype = KvDtype::fp16;

  friend constexpr bool operator==(const Geometry&, const Geometry&) = default;
};

// Empty when the geometry is usable, else a message naming the bad field.
std::string validate(const Geometry& g);

// K and V bytes of one token across all layers and KV heads: 2 · L · H · D · dtype_bytes.
constexpr uint64_t kv_bytes_per_token(const Geometry& g) {
  return 2ull * g.layers * g.kv_heads * g.head_dim * dtype_bytes(g.dtype);
}
// Exact KV bytes for `tokens` tokens (not rounded to pages).
constexpr uint64_t kv_bytes(const Geometry& g, uint64_t tokens) {
  return kv_bytes_per_token(g) * tokens;
}
constexpr uint64_t page_data_bytes(const Geometry& g) {
  return kv_bytes_per_token(g) * g.tokens_per_page;
}
constexpr uint64_t page_scale_bytes(const Geometry& g) {
  return dtype_is_quantized(g.dtype) ? 2ull * g.layers * g.kv_heads * sizeof(float) : 0;
}
// Pages needed to hold `tokens` tokens.
constexpr uint64_t pages_for_tokens(const Geometry& g, uint64_t tokens) {
  return (tokens + g.tokens_per_page - 1) / g.tokens_per_page;
}
// Bytes a sequence of `tokens` tokens occupies in the pool, whole pages and scales included.
constexpr uint64_t pool_bytes_for_tokens(const Geometry& g, uint64_t tokens) {
  return pages_for_tokens(g, tokens) * (page_data_bytes(g) + page_scale_bytes(g));
}

// Element offsets inside one page (in units of the KV dtype), for kernels and tests.
// K of (layer, head, token, dim) and V of the same; token < tokens_per_page.
constexpr uint64_t page_k_offset(const Geometry& g, uint32_t layer, uint32_t head, uint32_t token,
                                 uint32_t dim) {
  const uint64_t tile = uint64_t{g.tokens_per_page} * g.head_dim;
  return (2ull * layer * g.kv_heads + head) * tile + uint64_t{token} * g.head_dim + dim;
}
constexpr uint64_t page_v_offset(const Geometry& g, uint32_t layer, uint32_t head, uint32_t token,
                                 uint32_t dim) {
  const uint64_t tile = uint64_t{g.tokens_per_page} * g.head_dim;
  return page_k_offset(g, layer, head, token, dim) + uint64_t{g.kv_heads} * tile;
}

}  // namespace kvpool

// Page geometry, KV layouts and KV-cache size arithmetic.
//
// A pool serves one model geometry: L layers, H KV heads, head dim D, T tokens per page and a KV
// dtype, and stores it in one of two layouts (KvLayout, a per-pool choice kept outside Geometry so
// that geometry equality and the block-hash root do not depend on it). P = the pool's pages.
// A token keeps N planes per layer (kv_planes): K and V (N = 2) for full, sliding and chunked
// attention, one latent vector (N = 1: no V) for an MLA cache, whose geometry has H = 1 and
// D = latent width + rotary width (DeepSeek-V3: 512 + 64 = 576).
//   page_major   page p is one contiguous run of page_data_bytes; inside it, for each layer, K
//                then V (latent: the vector only), each [H][T][D] (one contiguous T×D tile per KV
//                head: HND in a page).
//   layer_major  for each layer l a K plane then a V plane (latent: one plane), each [P][T][H][D]
//                (NHD, token-major): vLLM's per-layer flash-attn cache
//                [2][num_blocks][block_size][H][D], and for a latent pool FlashMLA's
//                [num_blocks][block_size][D]. K of (p, l, t, h, d) is at l·S + p·T·H·D +
//                (t·H + h)·D + d, V at the same + P·T·H·D, with the layer stride S = N·P·T·H·D
//                elements. A page is N·L runs of T·H·D.
// Either way a pool's data is P · page_data_bytes, with
//     page_data_bytes  = N · L · H · T · D · dtype_bytes
// and every element has an affine offset (kv_element_strides): page·sp + layer·sl + head·sh +
// token·st + (V ? sv : 0) + dim, so kernels pick the strides once per call and never branch on
// the layout per element. A latent pool's V is its K (sv = 0): the value rows are the first
// latent-width elements of the vector, which the attention call names (kernels/paged_kv.h).
// Quantised (8-bit) pools keep one float scale per (page, layer, KV head, plane) in a side region
// after the data, indexed by page id in both layouts (scale_index): page_scale_bytes = N · L · H ·
// 4.
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

// How a pool orders its KV elements (file comment). The values travel on the wire (PoolInfo).
enum class KvLayout : uint8_t { page_major = 0, layer_major = 1 };
inline constexpr KvLayout kMaxKvLayout = KvLayout::layer_major;

// "page_major" / "layer_major".
std::string_view layout_name(KvLayout l);
// Accepts exactly the names layout_name gives.
std::optional<KvLayout> parse_layout(std::string_view name);

// Which keys a layer's queries see, as far as the cache is concerned (shared/data/models.yaml's
// kinds): full (every earlier token), sliding (the last `window` tokens), chunked (the tokens of
// the current chunk of `window`), latent (MLA: one latent vector per token, no V). The values
// travel on the wire (PoolInfo) and name the kind in the block-hash root.
enum class AttentionKind : uint8_t { full = 0, sliding = 1, chunked = 2, latent = 3 };
inline constexpr AttentionKind kMaxAttentionKind = AttentionKind::latent;

// "full" / "sliding" / "chunked" / "latent".
std::string_view attention_kind_name(AttentionKind k);
// Accepts exactly the names attention_kind_name gives.
std::optional<AttentionKind> parse_attention_kind(std::string_view name);

struct Geometry {
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens_per_page = 0;
  KvDtype dtype = KvDtype::fp16;
  // The attention kind of the pool's layers and, for sliding and chunked, the window or chunk in
  // tokens (0 for full and latent). Full, sliding and chunked store K and V per KV head alike;
  // latent stores one vector per token (kv_planes). The kind is part of the cache's identity (the
  // block-hash root), and it tells a worker which pages a sequence no longer needs.
  AttentionKind kind = AttentionKind::full;
  uint32_t window = 0;

  friend constexpr bool operator==(const Geometry&, const Geometry&) = default;
};

// Empty when the geometry is usable, else a message naming the bad field.
std::string validate(const Geometry& g);

// Planes a token keeps per layer and KV head: K and V, or one latent vector.
constexpr uint32_t kv_planes(const Geometry& g) {
  return g.kind == AttentionKind::latent ? 1u : 2u;
}

// Cached bytes of one token across all layers and KV heads: N · L · H · D · dtype_bytes.
constexpr uint64_t kv_bytes_per_token(const Geometry& g) {
  return uint64_t{kv_planes(g)} * g.layers * g.kv_heads * g.head_dim * dtype_bytes(g.dtype);
}
// Exact KV bytes for `tokens` tokens (not rounded to pages).
constexpr uint64_t kv_bytes(const Geometry& g, uint64_t tokens) {
  return kv_bytes_per_token(g) * tokens;
}
constexpr uint64_t page_data_bytes(const Geometry& g) {
  return kv_bytes_per_token(g) * g.tokens_per_page;
}
constexpr uint64_t page_scale_bytes(const Geometry& g) {
  return dtype_is_quantized(g.dtype)
             ? uint64_t{kv_planes(g)} * g.layers * g.kv_heads * sizeof(float)
             : 0;
}
// Index of the scale of (page, layer, KV head, K or V) among an 8-bit pool's side-region floats;
// a latent pool's V scale is its K scale (the same vector).
constexpr uint64_t scale_index(const Geometry& g, uint64_t page, uint32_t layer, uint32_t head,
                               bool is_v) {
  const uint32_t n = kv_planes(g);
  return ((page * g.layers + layer) * g.kv_heads + head) * n + (is_v && n == 2 ? 1 : 0);
}
// Pages needed to hold `tokens` tokens.
constexpr uint64_t pages_for_tokens(const Geometry& g, uint64_t tokens) {
  return (tokens + g.tokens_per_page - 1) / g.tokens_per_page;
}
// Bytes a sequence of `tokens` tokens occupies in the pool, whole pages and scales included.
constexpr uint64_t pool_bytes_for_tokens(const Geometry& g, uint64_t tokens) {
  return pages_for_tokens(g, tokens) * (page_data_bytes(g) + page_scale_bytes(g));
}

// The first key a query at position p sees under the geometry's attention kind: 0 for full and
// latent attention; p − W + 1 for a sliding window of W keys (0 while p < W); p − p mod C, the
// start of its chunk, for chunked attention of C. (The kernels take the same rule as an
// AttentionMask: kernels/paged_kv.h, geometry_mask and first_visible_key.)
constexpr uint64_t first_visible_token(const Geometry& g, uint64_t p) {
  if (g.kind == AttentionKind::sliding && p + 1 > g.window) return p + 1 - g.window;
  if (g.kind == AttentionKind::chunked && g.window != 0) return p - p % g.window;
  return 0;
}

// The first block a sequence still reads when it resumes after n ≥ 1 cached blocks of
// tokens_per_page tokens: the block holding the first key its next query (at p = n · T) sees.
// At most n − 1: a hit always includes its last block, which the query at p needs whenever it
// sees any earlier key (and which keeps a hit from holding no page at all).
constexpr uint64_t first_needed_block(const Geometry& g, uint64_t n) {
  if (n == 0) return 0;
  const uint64_t block = first_visible_token(g, n * g.tokens_per_page) / g.tokens_per_page;
  return block < n - 1 ? block : n - 1;
}

// Page-major element offsets inside one page (in units of the KV dtype), for kernels and tests.
// K of (layer, head, token, dim) and V of the same (a latent pool's V is its K); token <
// tokens_per_page.
constexpr uint64_t page_k_offset(const Geometry& g, uint32_t layer, uint32_t head, uint32_t token,
                                 uint32_t dim) {
  const uint64_t tile = uint64_t{g.tokens_per_page} * g.head_dim;
  return (uint64_t{kv_planes(g)} * layer * g.kv_heads + head) * tile +
         uint64_t{token} * g.head_dim + dim;
}
constexpr uint64_t page_v_offset(const Geometry& g, uint32_t layer, uint32_t head, uint32_t token,
                                 uint32_t dim) {
  const uint64_t tile = uint64_t{g.tokens_per_page} * g.head_dim;
  return page_k_offset(g, layer, head, token, dim) +
         (kv_planes(g) == 2 ? uint64_t{g.kv_heads} * tile : 0);
}

// Element strides of a whole pool of `num_pages` pages (units of the KV dtype): the K element
// (page, layer, head, token, dim) is at page·page + layer·layer + head·head + token·token + dim
// from the pool's base, the V element at the same + v. In page_major, `page` is the unpadded page
// (page_data_bytes / dtype_bytes); num_pages only matters for layer_major. A latent pool has no
// V plane: v is 0 (its V is its K).
struct KvElementStrides {
  uint64_t page = 0;
  uint64_t layer = 0;
  uint64_t head = 0;
  uint64_t token = 0;
  uint64_t v = 0;
  friend constexpr bool operator==(const KvElementStrides&, const KvElementStrides&) = default;
};

constexpr KvElementStrides kv_element_strides(const Geometry& g, KvLayout layout,
                                              uint64_t num_pages) {
  const uint64_t d = g.head_dim;
  const uint64_t tile = uint64_t{g.tokens_per_page} * d;  // one head's T × D
  const uint64_t block = tile * g.kv_heads;               // one page's K (or V) of one layer
  const uint64_t n = kv_planes(g);
  if (layout == KvLayout::layer_major) {
    const uint64_t plane = num_pages * block;
    return KvElementStrides{block, n * plane, d, uint64_t{g.kv_heads} * d, n == 2 ? plane : 0};
  }
  return KvElementStrides{n * g.layers * block, n * block, tile, d, n == 2 ? block : 0};
}

// Layer-major, for a pool of num_pages pages: the elements from one layer's K plane to the next
// layer's, and the K and V element offsets from the pool's base.
constexpr uint64_t layer_stride_elems(const Geometry& g, uint64_t num_pages) {
  return kv_element_strides(g, KvLayout::layer_major, num_pages).layer;
}
// Bytes from layer l's K plane to layer l + 1's (0 for page_major, where layers are in a page).
constexpr uint64_t layer_stride_bytes(const Geometry& g, KvLayout layout, uint64_t num_pages) {
  return layout == KvLayout::layer_major ? layer_stride_elems(g, num_pages) * dtype_bytes(g.dtype)
                                         : 0;
}
constexpr uint64_t layer_major_k_offset(const Geometry& g, uint64_t num_pages, uint32_t page,
                                        uint32_t layer, uint32_t head, uint32_t token,
                                        uint32_t dim) {
  const uint64_t t = g.tokens_per_page, h = g.kv_heads, d = g.head_dim;
  return layer * layer_stride_elems(g, num_pages) + page * t * h * d + (token * h + head) * d + dim;
}
constexpr uint64_t layer_major_v_offset(const Geometry& g, uint64_t num_pages, uint32_t page,
                                        uint32_t layer, uint32_t head, uint32_t token,
                                        uint32_t dim) {
  return layer_major_k_offset(g, num_pages, page, layer, head, token, dim) +
         kv_element_strides(g, KvLayout::layer_major, num_pages).v;
}

// Either layout, from the pool's base: page_major pages are page_data_bytes apart (unpadded).
constexpr uint64_t kv_k_offset(const Geometry& g, KvLayout layout, uint64_t num_pages,
                               uint32_t page, uint32_t layer, uint32_t head, uint32_t token,
                               uint32_t dim) {
  if (layout == KvLayout::layer_major) {
    return layer_major_k_offset(g, num_pages, page, layer, head, token, dim);
  }
  return page * (page_data_bytes(g) / dtype_bytes(g.dtype)) +
         page_k_offset(g, layer, head, token, dim);
}
constexpr uint64_t kv_v_offset(const Geometry& g, KvLayout layout, uint64_t num_pages,
                               uint32_t page, uint32_t layer, uint32_t head, uint32_t token,
                               uint32_t dim) {
  if (layout == KvLayout::layer_major) {
    return layer_major_v_offset(g, num_pages, page, layer, head, token, dim);
  }
  return page * (page_data_bytes(g) / dtype_bytes(g.dtype)) +
         page_v_offset(g, layer, head, token, dim);
}

}  // namespace kvpool

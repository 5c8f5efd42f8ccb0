// The kernels' view of a pool and the arguments of every kernel, shared by the CPU and CUDA
// implementations (DESIGN §2, §8).
//
// Layouts (common/geometry.h, KvLayout):
//   page_major   page p starts at base + p · page_stride; inside it, for each layer, K then V, each
//                [kv_heads][tokens_per_page][head_dim] elements of the pool's dtype
//                (page_k_offset / page_v_offset).
//   layer_major  base holds, for each layer, a K plane then a V plane, each
//                [num_pages][tokens_per_page][kv_heads][head_dim] (layer_major_k_offset /
//                layer_major_v_offset); page_stride is not used, num_pages sizes the planes.
//                An elastic layer_major pool is segmented: segments of segment_pages pages,
//                segment_stride bytes apart, each laid out layer_major with planes of
//                segment_pages pages, so page p is page p mod segment_pages of segment
//                p / segment_pages. A segment is the unit an elastic pool grows and shrinks by, and
//                every segment's planes sit at the same offsets inside it (segment_stride is a
//                multiple of one page's plane bytes: engines index layer l's planes as one tensor
//                of blocks, block_index below).
// Kernels address either through kv_strides(kv): byte strides of page, layer, head, token and
// V, computed once per call (or tile), so the inner loops are the same code for both layouts; a
// head's tokens are head_dim elements apart in page_major and kv_heads · head_dim in
// layer_major. 8-bit pools (int8, fp8_e4m3) keep one float scale per (page, layer, KV head, K|V)
// in a side region, scales[scale_index(geometry, p, layer, head, is_v)] =
// scales[((p · layers + layer) · kv_heads + head) · 2 + (0 for K, 1 for V)] (a latent pool: · 1,
// its one scale for both), in both layouts; a stored element x̂ stands for x̂ · scale.
// Latent (MLA) pools hold one vector of head_dim elements per token and layer and no V plane
// (common/geometry.h): the attention kernels read its first value_dim elements as the value row
// (the latent c), the whole vector as the key ([c, k_rope]), so scores = q·[c, k_rope] =
// q_latent·c + q_rope·k_rope and out = softmax · c, FlashMLA's absorbed form; its one scale per
// (page, layer) serves both.
//
// Queries and outputs are fp32 rows; K/V are read in the pool's dtype and accumulated in fp32.
// Token t of a sequence lives in page block_table[t / T] at offset t % T (T = tokens per page).
//
// Every pointer is host memory for the CPU kernels and device memory for the CUDA kernels.
#pragma once

#include <cstdint>

#include "common/geometry.h"
#include "common/types.h"
#include "kernels/host_device.h"

namespace kvpool::kernels {

struct PagedKv {
  void* base = nullptr;      // page 0 (page_major) or layer 0's K plane (layer_major)
  uint64_t page_stride = 0;  // page_major: bytes from one page to the next (≥ page_data_bytes)
  float* scales = nullptr;   // 8-bit pools only: the side region above; null otherwise
  Geometry geometry;
  KvLayout layout = KvLayout::page_major;
  uint32_t num_pages = 0;  // layer_major: pages in each plane (≥ every page id used); else unused
  // layer_major, segmented (see above): pages per segment and bytes from one segment to the
  // next; 0 for a pool whose planes hold all num_pages pages.
  uint32_t segment_pages = 0;
  uint64_t segment_stride = 0;
};

// Pages in each of a layer_major pool's planes: a segment's, or the pool's when unsegmented.
KVPOOL_HD uint32_t plane_pages(const PagedKv& kv) {
  return kv.segment_pages != 0 ? kv.segment_pages : kv.num_pages;
}

// Byte strides of a pool: the first byte of the K row (page, layer, head, token) is at base +
// page_offset(page) + layer·layer + head·head + token·token, its V row + v, where page_offset(p)
// is p·page, or in a segmented pool (p / segment_pages)·segment + (p mod segment_pages)·page.
struct KvStrides {
  uint64_t page = 0;
  uint64_t layer = 0;
  uint64_t head = 0;
  uint64_t token = 0;
  uint64_t v = 0;
  uint32_t segment_pages = 0;  // 0: not segmented
  uint64_t segment = 0;

  KVPOOL_HD uint64_t page_offset(uint64_t p) const {
    if (segment_pages == 0) return p * page;
    const auto p32 = static_cast<uint32_t>(p);  // page ids are 32-bit
    return uint64_t{p32 / segment_pages} * segment + uint64_t{p32 % segment_pages} * page;
  }
  KVPOOL_HD uint64_t row(uint64_t p, uint32_t layer_, uint32_t head_, uint32_t token_,
                         uint32_t is_v) const {
    return page_offset(p) + layer_ * layer + head_ * head + token_ * token + (is_v != 0 ? v : 0);
  }
};

KVPOOL_HD KvStrides kv_strides(const PagedKv& kv) {
  const bool page_major = kv.layout == KvLayout::page_major;
  const KvElementStrides e =
      kv_element_strides(kv.geometry, kv.layout, page_major ? kv.num_pages : plane_pages(kv));
  const uint64_t b = dtype_bytes(kv.geometry.dtype);
  const uint64_t page = page_major ? kv.page_stride : e.page * b;
  const uint32_t segment_pages = page_major ? 0 : kv.segment_pages;
  return KvStrides{page,
                   e.layer * b,
                   e.head * b,
                   e.token * b,
                   e.v * b,
                   segment_pages,
                   segment_pages != 0 ? kv.segment_stride : 0};
}

// Whether the segment fields fit together: unsegmented (both 0), or a layer_major pool whose
// segment holds its planes (segment_stride ≥ kv_planes · layers · segment_pages · block) at a
// stride that is a whole number of blocks.
KVPOOL_HD bool segments_fit(const PagedKv& kv) {
  if (kv.segment_pages == 0) return kv.segment_stride == 0;
  if (kv.layout != KvLayout::layer_major) return false;
  const KvStrides s = kv_strides(kv);
  return s.page != 0 && kv.segment_stride % s.page == 0 &&
         kv.segment_stride >= uint64_t{kv.geometry.layers} * s.layer;
}

// Where page p's rows of layer l's planes sit, counted in plane blocks (one page of one plane,
// T·H·D elements) from that layer's K plane in segment 0: layer l's K (or V) plane, viewed as one
// tensor of blocks from base + l·layer (+ v), holds page p at block block_index(p). p itself in
// an unsegmented pool; in a segmented one (p / segment_pages) · (segment_stride / block bytes) +
// p mod segment_pages, the same for every layer and for K and V. What a worker writes in the
// block tables it hands an engine's own kernels (vLLM's per-layer cache, FlashInfer's paged KV).
KVPOOL_HD uint64_t block_index(const PagedKv& kv, uint32_t p) {
  if (kv.layout != KvLayout::layer_major || kv.segment_pages == 0) return p;
  const uint64_t block = kv_strides(kv).page;
  return uint64_t{p / kv.segment_pages} * (kv.segment_stride / block) + p % kv.segment_pages;
}

// Where the bytes of one page lie: `chunks` runs of chunk_bytes, run c of page p at base +
// at(p) + c · chunk (page_major: 1 run, the whole page; layer_major: kv_planes · layers runs,
// K and V of each layer or a latent pool's one vector, one plane apart). What a page copy moves.
struct PageChunks {
  uint32_t chunks = 0;
  uint64_t chunk_bytes = 0;
  uint64_t chunk = 0;
  KvStrides strides;  // at(p) is strides.page_offset(p)

  KVPOOL_HD uint64_t at(uint64_t p) const { return strides.page_offset(p); }
};

KVPOOL_HD PageChunks page_chunks(const PagedKv& kv) {
  const Geometry& g = kv.geometry;
  const KvStrides s = kv_strides(kv);
  if (kv.layout == KvLayout::layer_major) {
    const uint32_t planes = kv_planes(g);
    return PageChunks{planes * g.layers, s.page, s.layer / planes, s};
  }
  return PageChunks{1, page_data_bytes(g), 0, s};
}

// Which keys a query at position pos sees, besides causality, and the sinks of its softmax
// (FlashInfer's names; every model of shared/data/models.yaml is one of these):
//   window_left  ≥ 0: a sliding window, keys [pos − window_left, pos]: window_left + 1 keys with
//                the query's own (Mistral's / Gemma's sliding_window W is window_left = W − 1);
//                −1: no window.
//   chunk        > 0: chunked attention, keys [pos − pos mod chunk, pos] (Llama-4's
//                attention_chunk_size); 0: none.
//   sinks        per query head, a learned logit that joins the softmax's denominator and nothing
//                else (gpt-oss): out_h = Σ e^{s_j} v_j / (Σ e^{s_j} + e^{sinks[h]}), in the units
//                of scale · q·k; null: none. [num_q_heads], in the memory the kernel runs on.
// A key passes both the window and the chunk when both are set. What a query sees is always one
// run of keys [first_visible_key(mask, pos), pos], so the kernels only move where they start.
struct AttentionMask {
  int32_t window_left = -1;
  uint32_t chunk = 0;
  const float* sinks = nullptr;
};

KVPOOL_HD uint32_t first_visible_key(const AttentionMask& m, uint32_t pos) {
  uint32_t first = 0;
  if (m.window_left >= 0 && pos > static_cast<uint32_t>(m.window_left))
    first = pos - static_cast<uint32_t>(m.window_left);
  if (m.chunk > 0) {
    const uint32_t chunk_start = pos - pos % m.chunk;
    if (chunk_start > first) first = chunk_start;
  }
  return first;
}

// The window or chunk a pool's geometry names (common/geometry.h: kind, window), as a mask:
// sliding W → window_left = W − 1 (at most 2^31 − 1: a window that wide covers every context a
// kernel takes); chunked C → chunk = C; full → none.
KVPOOL_HD AttentionMask geometry_mask(const Geometry& g) {
  AttentionMask m;
  if (g.kind == AttentionKind::sliding && g.window > 0)
    m.window_left = static_cast<int32_t>(g.window > 0x7fffffffu ? 0x7fffffffu : g.window - 1);
  if (g.kind == AttentionKind::chunked) m.chunk = g.window;
  return m;
}

// Whether the mask lets every query see its whole causal context with a plain softmax.
KVPOOL_HD bool mask_is_none(const AttentionMask& m) {
  return m.window_left == -1 && m.chunk == 0 && m.sinks == nullptr;
}

// Mixed precision (docs/ARCHITECTURE.md, "Mixed precision"): a sequence's oldest pages may live in
// a second pool, `older`, of the same shape (layers, KV heads, head_dim, tokens per page, kind and
// window: same_shape) in another dtype, usually 8 bits while kv is 16: block-table entry i of
// sequence s names a page of `older` when i < older_pages[s], a page of kv otherwise. The two
// pools may differ in layout and segments too. Each page is read in its own pool's dtype (and
// scales) and everything after the row conversion is the same, so a mixed call is the plain
// kernel with a per-page choice of pool: its result equals a plain call over pages holding the
// same dequantised values, up to fp32 rounding. older.base null: no older pages (every entry is
// kv's, older_pages is not read). older_num_pages bounds the CPU kernels' check of its ids.
struct MixedPrecision {
  PagedKv older;
  const uint32_t* older_pages = nullptr;  // [num_seqs]: leading block-table entries in `older`
  uint32_t older_num_pages = 0;
};

KVPOOL_HD bool mixed_in_use(const MixedPrecision& m) {
  return m.older.base != nullptr;
}

// Whether two geometries describe the same cache in possibly different dtypes: what a mixed
// call's two pools, and a conversion's source and destination, must share.
KVPOOL_HD bool same_shape(const Geometry& a, const Geometry& b) {
  return a.layers == b.layers && a.kv_heads == b.kv_heads && a.head_dim == b.head_dim &&
         a.tokens_per_page == b.tokens_per_page && a.kind == b.kind && a.window == b.window;
}

// Decode: one query token per sequence attends to its context_lens[s] cached tokens (those of
// them the mask lets it see: it sits at position context_lens[s] − 1).
// Query head h uses KV head h / (num_q_heads / kv_heads) (GQA/MQA); num_q_heads must be a
// multiple of kv_heads. A latent pool is MQA over its one vector: q rows are head_dim wide
// ([q_latent, q_rope], the up-projection absorbed by the caller) and out rows value_dim wide.
struct DecodeArgs {
  PagedKv kv;
  uint32_t layer = 0;
  uint32_t num_seqs = 0;
  uint32_t num_q_heads = 0;
  const float* q = nullptr;              // [num_seqs][num_q_heads][head_dim]
  float* out = nullptr;                  // [num_seqs][num_q_heads][value_dim or head_dim]
  const PageId* block_tables = nullptr;  // [num_seqs][block_table_stride]
  uint32_t block_table_stride = 0;
  const uint32_t* context_lens = nullptr;  // [num_seqs], each ≥ 1
  float scale = 1.0f;                      // softmax scale, usually 1/sqrt(head_dim)
  // Tokens per split-KV chunk; 0 lets the kernel plan it (plan_splits). Splits are merged with
  // the online-softmax merge, so the result does not depend on the split size beyond rounding.
  uint32_t split_tokens = 0;
  AttentionMask mask;  // sliding window, chunked attention, sinks (default: none)
  // Elements of a value row, and of an output row: 0 means head_dim, the only width a K/V pool
  // takes; a latent pool may name its latent width (kv_lora_rank, 512 for DeepSeek-V3), and then
  // the rest of the vector (the rotary key) enters the scores only.
  uint32_t value_dim = 0;
  MixedPrecision mixed;  // older pages in another pool (default: none)
};

// Extend (prefill over a cached prefix): sequence s has context_lens[s] tokens in the pool, of
// which the last n_s = q_offsets[s+1] − q_offsets[s] are the new ones whose queries are given;
// new token i (0-based among the new ones) is at position context_lens[s] − n_s + i and attends
// causally to positions ≤ its own (those of them the mask lets it see). Its K/V must already be
// in the pool (append first).
struct ExtendArgs {
  PagedKv kv;
  uint32_t layer = 0;
  uint32_t num_seqs = 0;
  uint32_t num_q_heads = 0;
  const float* q = nullptr;             // [q_offsets[num_seqs]][num_q_heads][head_dim]
  float* out = nullptr;                 // [q_offsets[num_seqs]][num_q_heads][value_dim or head_dim]
  const uint32_t* q_offsets = nullptr;  // [num_seqs + 1], q_offsets[0] = 0
  const PageId* block_tables = nullptr;
  uint32_t block_table_stride = 0;
  const uint32_t* context_lens = nullptr;
  float scale = 1.0f;
  AttentionMask mask;      // sliding window, chunked attention, sinks (default: none)
  uint32_t value_dim = 0;  // as in DecodeArgs
  MixedPrecision mixed;    // as in DecodeArgs
};

// The width of a value (and output) row: args.value_dim, or head_dim when it is 0.
KVPOOL_HD uint32_t value_width(const Geometry& g, uint32_t value_dim) {
  return value_dim != 0 ? value_dim : g.head_dim;
}

// Append: writes the K and V of num_tokens tokens into their slots. slot = page ·
// tokens_per_page + offset; a slot of −1 is skipped. For 8-bit pools quantisation is fused: a
// token at offset 0 of a page sets that page's scales; a later token whose magnitude exceeds
// what the scale can hold raises it and re-quantises the page's earlier tokens. So a page's
// tokens must be appended in order of their offsets, across calls and within one call (the GPU
// kernel applies a call's tokens in call order, the CPU one in slot order: the same whenever
// this holds, as it does for a worker appending its sequences). Inputs must be finite. A latent
// pool takes k only (each token's vector [c, k_rope]); v must be null.
struct AppendArgs {
  PagedKv kv;
  uint32_t layer = 0;
  uint32_t num_tokens = 0;
  const float* k = nullptr;        // [num_tokens][kv_heads][head_dim]
  const float* v = nullptr;        // [num_tokens][kv_heads][head_dim]; null for a latent pool
  const int64_t* slots = nullptr;  // [num_tokens]
};

// Copy-pages: copies whole pages (all layers, K and V or the latent vector) and their scales,
// src[i] → dst[i]: one run of page_data_bytes per page in page_major, kv_planes · layers runs
// (page_chunks) in layer_major.
// Pairs must not overlap (no page is both a source and a destination in one call).
struct CopyPagesArgs {
  PagedKv kv;
  uint32_t num_pairs = 0;
  const PageId* src = nullptr;
  const PageId* dst = nullptr;
};

// Convert-pages: re-encodes whole pages of `src` into pages of `dst`, a pool of the same shape
// (same_shape) in another dtype or layout, src_pages[i] → dst_pages[i]: every (layer, KV head,
// K|V) tile of the page (a latent pool's one vector per token), all tokens_per_page rows, and into
// an 8-bit dst that tile's scale. A tile quantised to 8 bits gets scale = max(amax, kMinAmax) / R
// (R = kFp8Max or kInt8Max, amax = max |x| over the tile's dequantised elements, NaN ignored), so
// every element lands within half a quantisation step (int8) or fp8's rounding of the scale; into
// a 16-bit dst each element is the dequantised source rounded once. What the precision tier uses
// to take a full page of 16-bit KV down to 8 bits (and, for tests, back). Every row of a source
// page must have been written (a page converts whole: a full block).
struct ConvertPagesArgs {
  PagedKv src;
  PagedKv dst;
  uint32_t num_pairs = 0;
  const PageId* src_pages = nullptr;
  const PageId* dst_pages = nullptr;
};

}  // namespace kvpool::kernels

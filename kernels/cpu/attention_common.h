// Pieces shared by the CPU attention kernels (decode.cpp, extend.cpp); internal to kernels/cpu.
//
// What it holds (all inline, in kvpool::kernels::cpu::detail):
//  - row conversion: load_row turns elements of the pool's dtype into fp32 (8-bit values times
//    the page's scale), branch-free and table-free for every dtype so the loops vectorise; every
//    path is bit-identical to the scalar conversions of kernels/kv_dtype.h;
//  - dot products: dot_partials / sum_lanes / dot_heads, fp32 dot products of several query rows
//    with one K row, kept as fixed partial sums (they vectorise without -ffast-math, and their
//    rounding does not depend on the thread count, the kernel or the call site);
//  - head_tile: the K and V tiles of one (page, layer, KV head), their token stride (head_dim
//    elements in page_major, kv_heads · head_dim in layer_major) and their scales; CallPools:
//    which pool a block-table entry names in a mixed-precision call;
//  - load_rows: row conversion of n tokens of a tile, one call when they are contiguous;
//  - argument checks: check_pool, check_value_dim, check_mask, check_layout, check_mixed and
//    check_sequence,
//    the preconditions of kernels_cpu.h, which return a message (empty = ok) and never write
//    anything;
//  - softmax_denominator: l, or l plus the query head's sink (AttentionMask::sinks);
//  - the thread pool: resolve_threads and for_each_item, which hand work items [0, n) to up to
//    `threads` std::threads (the caller's own included) through one atomic counter.
//
// Invariants:
//  - head_dim ≤ kMaxHeadDim on every geometry that passed check_pool, so row lengths fit an int
//    (softmax_add / softmax_merge take d as an int);
//  - check_sequence accepts a sequence only if every block-table entry the call reads (from the
//    page of the first key the mask lets a query see) is below its pool's page count (num_pages,
//    or in a mixed call older_num_pages for the older entries), so the kernels can address
//    pages without further checks; earlier entries are never read;
//  - for_each_item runs every item exactly once and returns after all of them are done; a thread
//    that cannot be started only means fewer workers, never a lost item. Item order across
//    threads is unspecified, so callers must not let the result depend on it;
//  - nothing here allocates per token; per-thread state is made once per thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/kv_dtype.h"
#include "kernels/online_softmax.h"
#include "kernels/paged_kv.h"

namespace kvpool::kernels::cpu::detail {

// softmax_add / softmax_merge take the row length as an int; this keeps it far from INT_MAX.
inline constexpr uint32_t kMaxHeadDim = 1u << 16;

// Row conversion ---------------------------------------------------------------------------------

// fp16 → fp32 without branches, so the row loop vectorises; bit-identical to fp16_to_f32: the
// exponent and mantissa shifted into an fp32 and scaled by 2^112 rebias normals and subnormals
// exactly; inf and NaN (exponent 31) keep their mantissa under an all-ones exponent. The select
// is a mask, not ?:, which GCC 12 would leave as control flow and not vectorise.
inline float fp16_to_f32_fast(uint16_t h) {
  const uint32_t em = uint32_t{h} & 0x7FFFu;
  const uint32_t bits = std::bit_cast<uint32_t>(std::bit_cast<float>(em << 13) * 0x1p112f);
  const uint32_t special = 0u - uint32_t{em >= 0x7C00u};
  return std::bit_cast<float>((bits & ~special) | ((0x7F800000u | (em << 13)) & special) |
                              ((uint32_t{h} & 0x8000u) << 16));
}

// fp8 e4m3 → fp32 without branches or tables, bit-identical to fp8_e4m3_to_f32 in the same way:
// the 7 exponent and mantissa bits shifted into an fp32 and scaled by 2^120 rebias normals and
// subnormals exactly; S.1111.111 is the NaN.
inline float fp8_e4m3_to_f32_fast(uint8_t v) {
  const uint32_t em = uint32_t{v} & 0x7Fu;
  const uint32_t bits = std::bit_cast<uint32_t>(std::bit_cast<float>(em << 20) * 0x1p120f);
  const uint32_t nan = 0u - uint32_t{em == 0x7Fu};
  return std::bit_cast<float>((bits & ~nan) | (0x7FC00000u & nan) | ((uint32_t{v} & 0x80u) << 24));
}

// Converts n elements of `dtype` at src into fp32 at dst; 8-bit values are multiplied by scale.
// n may span several consecutive rows of one tile (they share the tile's scale).
inline void load_row(KvDtype dtype, const std::byte* src, uint32_t n, float scale,
                     float* __restrict dst) {
  switch (dtype) {
    case KvDtype::fp16: {
      const auto* s = reinterpret_cast<const uint16_t*>(src);
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = fp16_to_f32_fast(s[i]);
      break;
    }
    case KvDtype::bf16: {
      const auto* s = reinterpret_cast<const uint16_t*>(src);
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = std::bit_cast<float>(uint32_t{s[i]} << 16);
      break;
    }
    case KvDtype::fp8_e4m3: {
      const auto* s = reinterpret_cast<const uint8_t*>(src);
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = fp8_e4m3_to_f32_fast(s[i]) * scale;
      break;
    }
    case KvDtype::int8: {
      const auto* s = reinterpret_cast<const int8_t*>(src);
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(s[i]) * scale;
      break;
    }
  }
}

// Dot products ----------------------------------------------------------------------------------
//
// A dot product q · k is kept as kDotLanes partial sums, lane x summing the products of the
// elements i ≡ x (mod kDotLanes) in order of i (the elements past the last whole group of lanes go
// to lane 0 after the rest), and then folded by sum_lanes in a fixed tree. So the compiler can
// vectorise the lanes without reassociating (no -ffast-math), and the result does not depend on
// which kernel, thread or block computed it.

inline constexpr uint32_t kDotLanes = 8;
// Query rows per pass over a K row in dot_partials: their partial sums stay in registers.
inline constexpr uint32_t kDotHeads = 4;

// part[h · kDotLanes + x] = lane x of q_h · k for the n_heads rows q_h = q + h · d. Each K element
// is loaded once per kDotHeads query rows. Not inlined: the restrict output is what lets GCC keep
// the partial sums in registers, which it does reliably only in a function of its own.
[[gnu::noinline]] inline void dot_partials(const float* __restrict q, uint32_t n_heads, uint32_t d,
                                           const float* __restrict k, float* __restrict part) {
  const uint32_t d_vec = d / kDotLanes * kDotLanes;
  uint32_t h = 0;
  for (; h + kDotHeads <= n_heads; h += kDotHeads) {
    const float* qh = q + size_t{h} * d;
    float* __restrict acc = part + size_t{h} * kDotLanes;
    for (uint32_t x = 0; x < kDotHeads * kDotLanes; ++x)
      acc[x] = 0.0f;
    for (uint32_t i = 0; i < d_vec; i += kDotLanes) {
      for (uint32_t r = 0; r < kDotHeads; ++r) {
        for (uint32_t x = 0; x < kDotLanes; ++x)
          acc[r * kDotLanes + x] += qh[size_t{r} * d + i + x] * k[i + x];
      }
    }
    for (uint32_t r = 0; r < kDotHeads; ++r) {
      float tail = 0.0f;
      for (uint32_t i = d_vec; i < d; ++i)
        tail += qh[size_t{r} * d + i] * k[i];
      acc[size_t{r} * kDotLanes] += tail;
    }
  }
  for (; h < n_heads; ++h) {
    const float* qh = q + size_t{h} * d;
    float* __restrict acc = part + size_t{h} * kDotLanes;
    for (uint32_t x = 0; x < kDotLanes; ++x)
      acc[x] = 0.0f;
    for (uint32_t i = 0; i < d_vec; i += kDotLanes) {
      for (uint32_t x = 0; x < kDotLanes; ++x)
        acc[x] += qh[i + x] * k[i + x];
    }
    float tail = 0.0f;
    for (uint32_t i = d_vec; i < d; ++i)
      tail += qh[i] * k[i];
    acc[0] += tail;
  }
}

// The dot product from its kDotLanes partial sums: a fixed pairwise tree.
inline float sum_lanes(const float* part) {
  float p[kDotLanes];
  for (uint32_t x = 0; x < kDotLanes; ++x)
    p[x] = part[x];
  for (uint32_t w = kDotLanes / 2; w > 0; w /= 2) {
    for (uint32_t x = 0; x < w; ++x)
      p[x] += p[x + w];
  }
  return p[0];
}

// s[h] = scale · (q_h · k) for h < n_heads (q_h = q + h · d); part is scratch for
// n_heads · kDotLanes floats.
inline void dot_heads(const float* q, uint32_t n_heads, uint32_t d, const float* k, float scale,
                      float* part, float* s) {
  dot_partials(q, n_heads, d, k, part);
  for (uint32_t h = 0; h < n_heads; ++h)
    s[h] = sum_lanes(part + size_t{h} * kDotLanes) * scale;
}

// Page addressing --------------------------------------------------------------------------------

// The K and V tiles of one (page, layer, KV head): tokens_per_page rows of head_dim elements,
// row_stride bytes apart (contiguous in page_major, interleaved with the other heads' rows in
// layer_major), and their scales (1 for 16-bit pools).
struct HeadTile {
  const std::byte* k;
  const std::byte* v;
  float k_scale;
  float v_scale;
  uint64_t row_stride;
};

// Converts rows [0, n) of a tile's K or V at src (row_stride bytes apart, head_dim d) into n
// consecutive fp32 rows at dst with `load` (detail::load_row or an ISA's): one call over n · d
// elements when the rows are contiguous (page_major), else one per row.
template <typename Load>
inline void load_rows(const Load& load, KvDtype dtype, const std::byte* src, uint64_t row_stride,
                      uint32_t n, uint32_t d, float scale, float* dst) {
  if (row_stride == uint64_t{d} * dtype_bytes(dtype)) {
    load(dtype, src, n * d, scale, dst);
    return;
  }
  for (uint32_t j = 0; j < n; ++j)
    load(dtype, src + j * row_stride, d, scale, dst + size_t{j} * d);
}

// The first scale of one (page, layer, KV head) in an 8-bit pool's side region: K's, then V's
// unless the pool is latent (kv_planes scales per head, the heads' consecutive).
inline const float* head_scales(const PagedKv& kv, uint32_t layer, PageId page, uint32_t head) {
  return kv.scales + scale_index(kv.geometry, page, layer, head, false);
}

// The tiles' addresses only (scales 1): what a prefetch needs, without loading the scales.
// `s` is kv_strides(kv), computed once by the caller.
inline HeadTile head_tile_addresses(const PagedKv& kv, const KvStrides& s, uint32_t layer,
                                    PageId page, uint32_t head) {
  const auto* base = static_cast<const std::byte*>(kv.base);
  const uint64_t k = s.row(page, layer, head, 0, 0);
  return HeadTile{base + k, base + k + s.v, 1.0f, 1.0f, s.token};
}

inline HeadTile head_tile(const PagedKv& kv, const KvStrides& s, uint32_t layer, PageId page,
                          uint32_t head) {
  const Geometry& g = kv.geometry;
  HeadTile t = head_tile_addresses(kv, s, layer, page, head);
  if (dtype_is_quantized(g.dtype)) {
    t.k_scale = kv.scales[scale_index(g, page, layer, head, false)];
    t.v_scale = kv.scales[scale_index(g, page, layer, head, true)];
  }
  return t;
}

// A call's pools: kv and, in a mixed call (paged_kv.h, MixedPrecision), the older pool, with
// their strides computed once. Block-table entry i of a sequence with `older` older pages names
// a page of at(i, older).
struct CallPools {
  const PagedKv* kv[2];
  KvStrides strides[2];
  CallPools(const PagedKv& recent, const MixedPrecision& m)
      : kv{&recent, mixed_in_use(m) ? &m.older : &recent},
        strides{kv_strides(recent), kv_strides(*kv[1])} {}
  static int at(uint64_t entry, uint32_t older) { return entry < older ? 1 : 0; }
};

// Sequence s's older pages in a mixed call (0 when the call is not mixed).
inline uint32_t older_count(const MixedPrecision& m, uint32_t s) {
  return mixed_in_use(m) ? m.older_pages[s] : 0;
}

// Validation -------------------------------------------------------------------------------------

inline std::string check_pool(const PagedKv& kv, uint32_t layer, uint32_t num_q_heads) {
  const Geometry& g = kv.geometry;
  if (std::string e = validate(g); !e.empty()) return "kv.geometry: " + e;
  if (g.head_dim > kMaxHeadDim) {
    return "kv.geometry: head_dim " + std::to_string(g.head_dim) + " exceeds the CPU kernels' " +
           std::to_string(kMaxHeadDim);
  }
  if (kv.base == nullptr) return "kv.base is null";
  const bool page_major = kv.layout == KvLayout::page_major;
  if (page_major && kv.page_stride < page_data_bytes(g)) {
    return "kv.page_stride " + std::to_string(kv.page_stride) + " is below the page's " +
           std::to_string(page_data_bytes(g)) + " data bytes";
  }
  const uint32_t bytes = dtype_bytes(g.dtype);
  if (reinterpret_cast<uintptr_t>(kv.base) % bytes != 0 ||
      (page_major && kv.page_stride % bytes != 0)) {
    return "kv.base and kv.page_stride must be multiples of the dtype's " + std::to_string(bytes) +
           " bytes";
  }
  if (dtype_is_quantized(g.dtype) && kv.scales == nullptr) {
    return "kv.scales is null for an 8-bit pool";
  }
  if (layer >= g.layers) {
    return "layer " + std::to_string(layer) + " is not below the pool's " +
           std::to_string(g.layers) + " layers";
  }
  if (num_q_heads == 0 || num_q_heads % g.kv_heads != 0) {
    return "num_q_heads " + std::to_string(num_q_heads) +
           " is not a positive multiple of kv_heads " + std::to_string(g.kv_heads);
  }
  return {};
}

// The value width of a decode or extend call (DecodeArgs::value_dim): 0 or head_dim for a K/V
// pool, 1..head_dim for a latent one.
inline std::string check_value_dim(const Geometry& g, uint32_t value_dim) {
  if (value_dim == 0 || value_dim == g.head_dim) return {};
  if (g.kind != AttentionKind::latent) {
    return "value_dim " + std::to_string(value_dim) + " on a " +
           std::string(attention_kind_name(g.kind)) + " pool, whose value rows are head_dim " +
           std::to_string(g.head_dim) + " wide (only a latent pool takes another width)";
  }
  if (value_dim > g.head_dim) {
    return "value_dim " + std::to_string(value_dim) + " exceeds the latent vector's head_dim " +
           std::to_string(g.head_dim);
  }
  return {};
}

// The mask's fields (kernels/paged_kv.h, AttentionMask); sinks cannot be checked beyond that.
inline std::string check_mask(const AttentionMask& m) {
  if (m.window_left < -1) {
    return "mask.window_left " + std::to_string(m.window_left) +
           " is below -1 (-1: no window; W - 1 for a window of W keys)";
  }
  return {};
}

// The softmax denominator of query head `q_head` from its final state: l, plus e^{sink − m} when
// the mask has sinks (st.m is finite: every query sees at least its own key).
inline float softmax_denominator(const AttentionMask& m, uint32_t q_head, const SoftmaxStats& st) {
  return m.sinks == nullptr ? st.l : st.l + std::exp(m.sinks[q_head] - st.m);
}

// The layout fields: a known layout, and in layer_major planes of at least num_pages pages (the
// bound every page id is checked against), so no page id can address past a plane.
inline std::string check_layout(const PagedKv& kv, uint64_t num_pages) {
  if (kv.layout == KvLayout::page_major) {
    return kv.segment_pages == 0
               ? std::string()
               : "kv.segment_pages is set on a page_major pool (layer_major only)";
  }
  if (kv.layout != KvLayout::layer_major) {
    return "kv.layout " + std::to_string(static_cast<unsigned>(kv.layout)) + " is not a KvLayout";
  }
  if (kv.num_pages == 0 || kv.num_pages < num_pages) {
    return "kv.num_pages " + std::to_string(kv.num_pages) +
           " (the layer_major planes' pages) is below num_pages " + std::to_string(num_pages);
  }
  if (!segments_fit(kv)) {
    return "kv.segment_stride " + std::to_string(kv.segment_stride) + " does not hold " +
           std::to_string(kv.segment_pages) + " pages of every layer's planes in whole blocks";
  }
  return {};
}

// A mixed call's older pool (MixedPrecision): of kv's shape, itself a usable pool of
// older_num_pages pages (check_pool, check_layout), with its per-sequence counts given.
inline std::string check_mixed(const MixedPrecision& m, const PagedKv& kv, uint32_t layer,
                               uint32_t num_q_heads) {
  if (!mixed_in_use(m)) return {};
  if (m.older_pages == nullptr) return "mixed.older_pages is null";
  if (!same_shape(m.older.geometry, kv.geometry)) {
    return "mixed.older.geometry is not of kv.geometry's shape (layers, kv_heads, head_dim, "
           "tokens_per_page, kind and window must match; only dtype and layout may differ)";
  }
  if (std::string e = check_pool(m.older, layer, num_q_heads); !e.empty()) {
    return "mixed.older: " + e;
  }
  if (std::string e = check_layout(m.older, m.older_num_pages); !e.empty()) {
    return "mixed.older: " + e;
  }
  return {};
}

// Checks sequence s's context length and the block-table entries that its tokens from
// `first_key` on use: the kernels read no key before the first one the mask lets a query see, so
// entries before its page may be anything (kNoPage after a sliding pool's window hit). In a mixed
// call entries below `older` name pages of the older pool, below older_num_pages.
inline std::string check_sequence(const PageId* block_tables, uint32_t stride, uint32_t s,
                                  uint32_t ctx, uint32_t tokens_per_page, uint32_t num_pages,
                                  uint32_t first_key = 0, uint32_t older = 0,
                                  uint32_t older_num_pages = 0) {
  const std::string name = "[" + std::to_string(s) + "]";
  if (ctx == 0) return "context_lens" + name + " is 0";
  const uint64_t pages = (uint64_t{ctx} + tokens_per_page - 1) / tokens_per_page;
  if (pages > stride) {
    return "context_lens" + name + " = " + std::to_string(ctx) + " needs " + std::to_string(pages) +
           " pages, more than block_table_stride " + std::to_string(stride);
  }
  const PageId* row = block_tables + size_t{s} * stride;
  for (uint64_t i = first_key / tokens_per_page; i < pages; ++i) {
    if (i < older && row[i] >= older_num_pages) {
      return "block_tables" + name + "[" + std::to_string(i) + "] = " + std::to_string(row[i]) +
             " (an older page: mixed.older_pages" + name + " = " + std::to_string(older) +
             ") is not below mixed.older_num_pages " + std::to_string(older_num_pages);
    }
    if (i >= older && row[i] >= num_pages) {
      return "block_tables" + name + "[" + std::to_string(i) + "] = " + std::to_string(row[i]) +
             " is not below num_pages " + std::to_string(num_pages);
    }
  }
  return {};
}

// Threads ----------------------------------------------------------------------------------------

// The kernels' `threads` argument: 0 means std::thread::hardware_concurrency(), at least 1.
inline unsigned resolve_threads(unsigned threads) {
  const unsigned n = threads != 0 ? threads : std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

// Runs fn(i, state) for every i in [0, num_items) on up to `threads` threads, the calling one
// included. Each thread makes its state once with make_state() before taking items; items are
// handed out in increasing order through one atomic counter.
template <typename MakeState, typename Fn>
void for_each_item(size_t num_items, unsigned threads, const MakeState& make_state, const Fn& fn) {
  if (num_items == 0) return;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    auto state = make_state();
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < num_items;)
      fn(i, state);
  };
  const auto spawn =
      static_cast<unsigned>(std::min<size_t>(resolve_threads(threads), num_items)) - 1;
  std::vector<std::thread> pool;
  pool.reserve(spawn);
  for (unsigned k = 0; k < spawn; ++k) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads: the counter hands the remaining items to those that run
    }
  }
  worker();
  for (std::thread& t : pool)
    t.join();
}

}  // namespace kvpool::kernels::cpu::detail

// Test helpers for the CPU kernels: a paged pool (page_major or layer_major) in a
// std::vector<std::byte> whose every slot starts as a NaN bit pattern of the KV dtype, pages handed
// out from a random permutation, quantising writes with per-(page, layer, head, K|V) scales
// computed from the data, dequantised read-back, and dense reference attention in fp64 plus a naive
// fp32 one to size tolerances. A latent geometry's pool has one plane (K) per layer: writes take
// k only and reading V (kind 1) reads K.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "common/geometry.h"
#include "common/types.h"
#include "kernels/kv_dtype.h"
#include "kernels/paged_kv.h"

namespace kvpool::kernels::test {

// A stored element that is not a number (int8 has none: −128, outside the symmetric range).
inline uint16_t nan_bits(KvDtype d) {
  switch (d) {
    case KvDtype::fp16:
      return 0x7E00u;
    case KvDtype::bf16:
      return 0x7FC0u;
    case KvDtype::fp8_e4m3:
      return 0x7Fu;
    case KvDtype::int8:
      return 0x80u;
  }
  return 0;
}

inline float quant_max(KvDtype d) {
  return d == KvDtype::int8 ? kInt8Max : kFp8Max;
}

// Encodes x (already divided by nothing: the scale is applied here for 8-bit dtypes).
inline uint16_t encode(KvDtype d, float x, float scale) {
  switch (d) {
    case KvDtype::fp16:
      return f32_to_fp16(x);
    case KvDtype::bf16:
      return f32_to_bf16(x);
    case KvDtype::fp8_e4m3:
      return f32_to_fp8_e4m3(x / scale);
    case KvDtype::int8:
      return static_cast<uint8_t>(f32_to_int8(x, 1.0f / scale));
  }
  return 0;
}

inline float decode_elem(KvDtype d, uint16_t bits, float scale) {
  switch (d) {
    case KvDtype::fp16:
      return fp16_to_f32(bits);
    case KvDtype::bf16:
      return bf16_to_f32(bits);
    case KvDtype::fp8_e4m3:
      return fp8_e4m3_to_f32(static_cast<uint8_t>(bits)) * scale;
    case KvDtype::int8:
      return int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(bits))) * scale;
  }
  return 0.0f;
}

class TestPool {
 public:
  // page_major: the stride leaves a gap after each page (kernels must use page_stride, not the
  // data size). layer_major: the planes of num_pages pages, then a 64-byte gap (as NaN) that no
  // kernel may touch. layer_major with segment_pages > 0: segmented (kernels/paged_kv.h),
  // segments of that many pages laid out layer_major, each followed by two blocks of NaN slack.
  TestPool(const Geometry& g, uint32_t num_pages, uint64_t seed,
           KvLayout layout = KvLayout::page_major, uint32_t segment_pages = 0)
      : g_(g),
        layout_(layout),
        num_pages_(num_pages),
        segment_pages_(segment_pages),
        stride_(page_data_bytes(g) + (layout == KvLayout::page_major ? 64 : 0)),
        rng_(seed) {
    if (segment_pages_ != 0) {
      const uint64_t block = stride_ / (uint64_t{kv_planes(g)} * g.layers);
      segment_stride_ = uint64_t{segment_pages_} * stride_ + 2 * block;
      const uint64_t segments = (num_pages + segment_pages_ - 1) / segment_pages_;
      data_.resize(segments * segment_stride_ + 64);
    } else {
      data_.resize(stride_ * num_pages + (layout == KvLayout::page_major ? 0 : 64));
    }
    const uint16_t nan = nan_bits(g.dtype);
    const uint32_t b = dtype_bytes(g.dtype);
    for (size_t i = 0; i + b <= data_.size(); i += b)
      std::memcpy(&data_[i], &nan, b);
    if (dtype_is_quantized(g.dtype)) {
      scales_.assign(size_t{num_pages} * g.layers * g.kv_heads * kv_planes(g), std::nanf(""));
    }
    free_.resize(num_pages);
    std::iota(free_.begin(), free_.end(), 0u);
    std::shuffle(free_.begin(), free_.end(), rng_);
  }

  PagedKv kv() {
    PagedKv kv;
    kv.base = data_.data();
    kv.page_stride = stride_;
    kv.scales = scales_.empty() ? nullptr : scales_.data();
    kv.geometry = g_;
    kv.layout = layout_;
    kv.num_pages = num_pages_;
    kv.segment_pages = segment_pages_;
    kv.segment_stride = segment_stride_;
    return kv;
  }
  KvLayout layout() const { return layout_; }
  uint32_t num_pages() const { return num_pages_; }
  const std::vector<float>& scales() const { return scales_; }
  // The stored bits of K (kind 0) or V (kind 1) of (page, layer, head, slot, dim): the same
  // logical element in either layout.
  uint16_t raw(PageId page, uint32_t layer, uint32_t h, uint32_t slot, uint32_t x, int kind) const {
    return load(page, slot_offset(layer, h, slot, x, kind));
  }
  const Geometry& geometry() const { return g_; }
  const std::vector<std::byte>& bytes() const { return data_; }

  // Takes the next n pages of the random permutation.
  std::vector<PageId> take_pages(uint64_t n) {
    if (n > free_.size()) throw std::runtime_error("test pool too small");
    std::vector<PageId> out(free_.end() - static_cast<std::ptrdiff_t>(n), free_.end());
    free_.resize(free_.size() - n);
    return out;
  }

  // Writes tokens [0, tokens) of one sequence for `layer`: k and v are [tokens][kv_heads][D]
  // fp32 (v unused for a latent pool); token t goes to pages[t / T], slot t % T. 8-bit pools get
  // each page's scales from the amax of that page's tokens, per (layer, head, K|V).
  void write_sequence(uint32_t layer, const std::vector<PageId>& pages, const float* k,
                      const float* v, uint32_t tokens) {
    const uint32_t t_page = g_.tokens_per_page;
    const uint32_t d = g_.head_dim;
    for (uint32_t t0 = 0; t0 < tokens; t0 += t_page) {
      const PageId page = pages[t0 / t_page];
      const uint32_t n = std::min(t_page, tokens - t0);
      for (uint32_t h = 0; h < g_.kv_heads; ++h) {
        for (int kind = 0; kind < static_cast<int>(kv_planes(g_)); ++kind) {
          const float* src = kind == 0 ? k : v;
          float scale = 1.0f;
          if (dtype_is_quantized(g_.dtype)) {
            float amax = 0.0f;
            for (uint32_t j = 0; j < n; ++j) {
              for (uint32_t x = 0; x < d; ++x) {
                amax = std::max(amax, std::fabs(src[elem(t0 + j, h, x)]));
              }
            }
            scale = amax > 0.0f ? amax / quant_max(g_.dtype) : 1.0f;
            scales_[scale_index(page, layer, h, kind)] = scale;
          }
          for (uint32_t j = 0; j < n; ++j) {
            for (uint32_t x = 0; x < d; ++x) {
              store(page, slot_offset(layer, h, j, x, kind),
                    encode(g_.dtype, src[elem(t0 + j, h, x)], scale));
            }
          }
        }
      }
    }
  }

  // The dequantised K (kind 0) or V (kind 1) of tokens [0, tokens): [tokens][kv_heads][D].
  std::vector<float> gather(uint32_t layer, const std::vector<PageId>& pages, uint32_t tokens,
                            int kind) const {
    const uint32_t t_page = g_.tokens_per_page;
    std::vector<float> out(size_t{tokens} * g_.kv_heads * g_.head_dim);
    for (uint32_t t = 0; t < tokens; ++t) {
      const PageId page = pages[t / t_page];
      for (uint32_t h = 0; h < g_.kv_heads; ++h) {
        const float scale =
            dtype_is_quantized(g_.dtype) ? scales_[scale_index(page, layer, h, kind)] : 1.0f;
        for (uint32_t x = 0; x < g_.head_dim; ++x) {
          out[elem(t, h, x)] =
              decode_elem(g_.dtype, load(page, slot_offset(layer, h, t % t_page, x, kind)), scale);
        }
      }
    }
    return out;
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  size_t elem(uint32_t t, uint32_t h, uint32_t x) const {
    return (size_t{t} * g_.kv_heads + h) * g_.head_dim + x;
  }
  uint64_t slot_offset(uint32_t layer, uint32_t h, uint32_t slot, uint32_t x, int kind) const {
    return kind == 0 ? page_k_offset(g_, layer, h, slot, x) : page_v_offset(g_, layer, h, slot, x);
  }
  // Byte offset in data_ of the element at slot_offset `elem_offset` of `page`: page_major pages
  // are stride_ apart; layer_major maps the in-page offset (layer, head, slot, dim, K|V) onto
  // the planes with common/geometry.h's layer_major offsets, spelled out here independently.
  uint64_t byte_offset(PageId page, uint64_t elem_offset) const {
    const uint32_t b = dtype_bytes(g_.dtype);
    if (layout_ == KvLayout::page_major) return page * stride_ + elem_offset * b;
    const uint64_t t = g_.tokens_per_page, h = g_.kv_heads, d = g_.head_dim;
    const uint64_t planes = g_.kind == AttentionKind::latent ? 1 : 2;
    const uint64_t tile = t * d;  // page_major: one head's [T][D]
    const uint64_t layer = elem_offset / (planes * h * tile);
    uint64_t rest = elem_offset % (planes * h * tile);
    const uint64_t kind = rest / (h * tile);
    rest %= h * tile;
    const uint64_t head = rest / tile, slot = rest % tile / d, x = rest % d;
    if (segment_pages_ != 0) {
      const uint64_t plane = segment_pages_ * t * h * d;
      return page / segment_pages_ * segment_stride_ +
             ((planes * layer + kind) * plane + page % segment_pages_ * t * h * d +
              (slot * h + head) * d + x) *
                 b;
    }
    const uint64_t plane = num_pages_ * t * h * d;
    return ((planes * layer + kind) * plane + page * t * h * d + (slot * h + head) * d + x) * b;
  }
  // A latent pool's one scale per (page, layer, head) serves K and V alike.
  size_t scale_index(PageId page, uint32_t layer, uint32_t h, int kind) const {
    if (g_.kind == AttentionKind::latent) kind = 0;
    const size_t planes = g_.kind == AttentionKind::latent ? 1 : 2;
    return ((size_t{page} * g_.layers + layer) * g_.kv_heads + h) * planes +
           static_cast<size_t>(kind);
  }
  void store(PageId page, uint64_t elem_offset, uint16_t bits) {
    const uint32_t b = dtype_bytes(g_.dtype);
    std::memcpy(&data_[byte_offset(page, elem_offset)], &bits, b);
  }
  uint16_t load(PageId page, uint64_t elem_offset) const {
    const uint32_t b = dtype_bytes(g_.dtype);
    uint16_t bits = 0;
    std::memcpy(&bits, &data_[byte_offset(page, elem_offset)], b);
    return bits;
  }

  Geometry g_;
  KvLayout layout_;
  uint32_t num_pages_;
  uint32_t segment_pages_ = 0;
  uint64_t segment_stride_ = 0;
  uint64_t stride_;
  std::mt19937_64 rng_;
  std::vector<std::byte> data_;
  std::vector<float> scales_;
  std::vector<PageId> free_;
};

inline std::vector<float> random_normal(std::mt19937_64& rng, size_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (float& x : out)
    x = dist(rng);
  return out;
}

// Reference attention of one query row q[D] over keys [first_key, n_keys) of KV head `head` in
// gathered k, v ([tokens][kv_heads][D]), with an attention sink when `sink` is not null (a logit
// in the softmax's denominator only): out64 in fp64, out32 by the naive fp32 method (scores, max,
// exp, sum, weighted sum, divide), which sizes what "fp32 precision" means for this input.
inline void reference_attention(const float* q, const float* k, const float* v, uint32_t kv_heads,
                                uint32_t d, uint32_t head, uint32_t n_keys, float scale,
                                double* out64, float* out32, uint32_t first_key = 0,
                                const float* sink = nullptr) {
  std::vector<double> s64;
  std::vector<float> s32;
  for (uint32_t j = first_key; j < n_keys; ++j) {
    const float* kr = k + (size_t{j} * kv_heads + head) * d;
    double a = 0.0;
    float b = 0.0f;
    for (uint32_t x = 0; x < d; ++x) {
      a += double{q[x]} * double{kr[x]};
      b += q[x] * kr[x];
    }
    s64.push_back(a * double{scale});
    s32.push_back(b * scale);
  }
  double m64 = *std::max_element(s64.begin(), s64.end());
  float m32 = *std::max_element(s32.begin(), s32.end());
  if (sink != nullptr) {
    m64 = std::max(m64, double{*sink});
    m32 = std::max(m32, *sink);
  }
  double l64 = sink != nullptr ? std::exp(double{*sink} - m64) : 0.0;
  float l32 = sink != nullptr ? std::exp(*sink - m32) : 0.0f;
  std::fill(out64, out64 + d, 0.0);
  std::fill(out32, out32 + d, 0.0f);
  for (uint32_t j = first_key; j < n_keys; ++j) {
    const double p64 = std::exp(s64[j - first_key] - m64);
    const float p32 = std::exp(s32[j - first_key] - m32);
    l64 += p64;
    l32 += p32;
    const float* vr = v + (size_t{j} * kv_heads + head) * d;
    for (uint32_t x = 0; x < d; ++x) {
      out64[x] += p64 * double{vr[x]};
      out32[x] += p32 * vr[x];
    }
  }
  for (uint32_t x = 0; x < d; ++x) {
    out64[x] /= l64;
    out32[x] /= l32;
  }
}

// Decode arguments over sequences held in `pool`: the fields every test sets alike (sequence
// count from ctx); split_tokens, mask and value_dim stay the caller's.
inline DecodeArgs decode_args(TestPool& pool, uint32_t layer, uint32_t num_q_heads,
                              const std::vector<PageId>& tables, uint32_t stride,
                              const std::vector<uint32_t>& ctx, const float* q, float* out,
                              float scale) {
  DecodeArgs a;
  a.kv = pool.kv();
  a.layer = layer;
  a.num_seqs = static_cast<uint32_t>(ctx.size());
  a.num_q_heads = num_q_heads;
  a.q = q;
  a.out = out;
  a.block_tables = tables.data();
  a.block_table_stride = stride;
  a.context_lens = ctx.data();
  a.scale = scale;
  return a;
}

// The same for extend, with the new tokens' offsets.
inline ExtendArgs extend_args(TestPool& pool, uint32_t layer, uint32_t num_q_heads,
                              const std::vector<PageId>& tables, uint32_t stride,
                              const std::vector<uint32_t>& ctx,
                              const std::vector<uint32_t>& q_offsets, const float* q, float* out,
                              float scale) {
  ExtendArgs a;
  a.kv = pool.kv();
  a.layer = layer;
  a.num_seqs = static_cast<uint32_t>(ctx.size());
  a.num_q_heads = num_q_heads;
  a.q = q;
  a.out = out;
  a.q_offsets = q_offsets.data();
  a.block_tables = tables.data();
  a.block_table_stride = stride;
  a.context_lens = ctx.data();
  a.scale = scale;
  return a;
}

// Accumulates, over a whole output, the kernel's and the naive fp32 method's largest error
// against fp64, the largest |v| seen and the non-finite kernel outputs.
struct ErrorTally {
  double kernel_err = 0.0;
  double naive_err = 0.0;
  double max_abs_v = 0.0;
  uint64_t non_finite = 0;

  void add(const float* kernel, const float* naive, const double* ref, uint32_t d) {
    for (uint32_t x = 0; x < d; ++x) {
      naive_err = std::max(naive_err, std::fabs(double{naive[x]} - ref[x]));
      if (!std::isfinite(kernel[x])) {
        ++non_finite;
        continue;
      }
      kernel_err = std::max(kernel_err, std::fabs(double{kernel[x]} - ref[x]));
    }
  }
  void see_values(const std::vector<float>& v) {
    for (float x : v)
      max_abs_v = std::max(max_abs_v, double{std::fabs(x)});
  }
  // FlashAttention's criterion: no worse than twice the same-precision naive method, plus a
  // small absolute allowance relative to the values' magnitude.
  double bound() const { return 2.0 * naive_err + 1e-5 * max_abs_v; }
  bool ok() const { return non_finite == 0 && kernel_err <= bound(); }
};

}  // namespace kvpool::kernels::test

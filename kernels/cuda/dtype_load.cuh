// Loading KV rows of any pool dtype as fp32 on the device.
#pragma once

#include <cstdint>

#include "common/geometry.h"
#include "kernels/kv_dtype.h"
#include "kernels/paged_kv.h"

namespace kvpool::kernels::cuda {

// Element type and conversion of a pool dtype, as a compile-time tag.
template <KvDtype D>
struct Elem;
template <>
struct Elem<KvDtype::fp16> {
  using T = uint16_t;
  static __device__ __forceinline__ float load(T v) { return fp16_to_f32(v); }
  static constexpr bool kQuantized = false;
};
template <>
struct Elem<KvDtype::bf16> {
  using T = uint16_t;
  static __device__ __forceinline__ float load(T v) { return bf16_to_f32(v); }
  static constexpr bool kQuantized = false;
};
template <>
struct Elem<KvDtype::fp8_e4m3> {
  using T = uint8_t;
  static __device__ __forceinline__ float load(T v) { return fp8_e4m3_to_f32(v); }
  static constexpr bool kQuantized = true;
};
template <>
struct Elem<KvDtype::int8> {
  using T = uint8_t;
  static __device__ __forceinline__ float load(T v) { return int8_to_f32(static_cast<int8_t>(v)); }
  static constexpr bool kQuantized = true;
};

// The K and V rows of token `t` of a sequence for one (layer, KV head), and their scales (1 for
// 16-bit pools): what decode and extend read per token.
template <KvDtype DT>
struct TokenRows {
  const typename Elem<DT>::T* k;
  const typename Elem<DT>::T* v;
  float k_scale;
  float v_scale;
};

template <KvDtype DT>
__device__ __forceinline__ TokenRows<DT> token_rows(const PagedKv& kv, const PageId* table,
                                                    uint32_t layer, uint32_t kvh, uint32_t t) {
  using T = typename Elem<DT>::T;
  const Geometry& g = kv.geometry;
  const PageId page = table[t / g.tokens_per_page];
  const uint32_t off = t % g.tokens_per_page;
  const auto* p = reinterpret_cast<const T*>(static_cast<const char*>(kv.base) +
                                             uint64_t(page) * kv.page_stride);
  TokenRows<DT> r{p + page_k_offset(g, layer, kvh, off, 0),
                  p + page_v_offset(g, layer, kvh, off, 0), 1.0f, 1.0f};
  if constexpr (Elem<DT>::kQuantized) {
    const float* sc = kv.scales + ((uint64_t(page) * g.layers + layer) * g.kv_heads + kvh) * 2;
    r.k_scale = sc[0];
    r.v_scale = sc[1];
  }
  return r;
}

// Calls fn(KvDtype tag) with the runtime dtype as a template argument.
template <typename Fn>
bool dispatch_dtype(KvDtype d, Fn&& fn) {
  switch (d) {
    case KvDtype::fp16:
      fn(std::integral_constant<KvDtype, KvDtype::fp16>{});
      return true;
    case KvDtype::bf16:
      fn(std::integral_constant<KvDtype, KvDtype::bf16>{});
      return true;
    case KvDtype::fp8_e4m3:
      fn(std::integral_constant<KvDtype, KvDtype::fp8_e4m3>{});
      return true;
    case KvDtype::int8:
      fn(std::integral_constant<KvDtype, KvDtype::int8>{});
      return true;
  }
  return false;
}

// Calls fn(int head_dim tag) for 64, 128, 256.
template <typename Fn>
bool dispatch_head_dim(uint32_t d, Fn&& fn) {
  switch (d) {
    case 64:
      fn(std::integral_constant<int, 64>{});
      return true;
    case 128:
      fn(std::integral_constant<int, 128>{});
      return true;
    case 256:
      fn(std::integral_constant<int, 256>{});
      return true;
    default:
      return false;
  }
}

}  // namespace kvpool::kernels::cuda

// Loading KV rows of any pool dtype as fp32 on the device.
#pragma once

#include <cstdint>

#include "common/geometry.h"
#include "kernels/kv_dtype.h"

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

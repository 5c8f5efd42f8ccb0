// Loading KV elements of any pool dtype as fp32 on the device, and the compile-time dispatch over
// dtype and head dim.
//
//   Elem<DT>::load   one element, through the bit-exact conversions of kernels/kv_dtype.h (append)
//   load8<DT>        8 consecutive elements of a row (16 or 8 bytes, aligned to their size) with
//                    the hardware conversions: cvt.f32.bf16 is a shift, cvt.f32.f16 and sm_89+'s
//                    cvt.rn.f16x2.e4m3x2 (then f16 → f32) are exact for every finite value, so
//                    finite results equal kv_dtype.h's bit for bit; a NaN stays a NaN, though not
//                    necessarily with kv_dtype.h's payload. 8-bit values are multiplied by scale.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

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

template <KvDtype DT>
__device__ __forceinline__ void load8(const unsigned char* p, float scale, float (&out)[8]) {
  if constexpr (DT == KvDtype::bf16 || DT == KvDtype::fp16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (DT == KvDtype::bf16) {
        out[2 * i] = __uint_as_float(w[i] << 16);
        out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
      } else {
        __half2_raw h;
        h.x = static_cast<unsigned short>(w[i] & 0xFFFFu);
        h.y = static_cast<unsigned short>(w[i] >> 16);
        const float2 f = __half22float2(__half2(h));
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    }
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const uint32_t w[2] = {raw.x, raw.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const auto pair = static_cast<unsigned short>(w[i] >> (16 * j));  // elements 4i+2j, +1
        if constexpr (DT == KvDtype::fp8_e4m3) {
          const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
          out[4 * i + 2 * j] = f.x * scale;
          out[4 * i + 2 * j + 1] = f.y * scale;
        } else {
          out[4 * i + 2 * j] = static_cast<float>(static_cast<int8_t>(pair & 0xFFu)) * scale;
          out[4 * i + 2 * j + 1] = static_cast<float>(static_cast<int8_t>(pair >> 8)) * scale;
        }
      }
    }
  }
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

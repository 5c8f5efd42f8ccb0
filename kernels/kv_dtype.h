// KV element formats and their conversion to and from fp32, bit-exact on host and device.
//
//   fp16      IEEE binary16; conversion from fp32 rounds to nearest even, overflow → ±inf
//   bf16      the top 16 bits of an fp32; rounds to nearest even, NaN stays NaN
//   fp8_e4m3  OCP "E4M3FN": 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinities, ±448 the
//             largest finite value, S.1111.111 the NaN; conversion rounds to nearest even and
//             saturates to ±448 (the KV cache wants the nearest finite value, not NaN)
//   int8      symmetric: x̂ = round(x / scale) (half away from zero) clamped to [−127, 127];
//             NaN → 0
// 8-bit formats are stored with a per-(page, layer, KV head, K|V) scale: x ≈ x̂ · scale, with
// scale = amax / kFp8Max or amax / kInt8Max.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvpool::kernels {

inline constexpr float kFp8Max = 448.0f;
inline constexpr float kInt8Max = 127.0f;
// Floor of the amax a scale is computed from, so that an all-zero row gets a small positive
// scale (never 0 or NaN) and later values still divide by it safely.
inline constexpr float kMinAmax = 1e-20f;

KVPOOL_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVPOOL_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// fp16 ------------------------------------------------------------------------------------------

KVPOOL_HD float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_f32(sign);
    // Subnormal: normalise.
    exp = 1;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    man &= 0x3FFu;
    return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

KVPOOL_HD uint16_t f32_to_fp16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal fp16 (2^-14): subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - e;  // so that the result counts units of 2^-24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((abs - 0x38000000u) >> 13);  // rebias exponent 127 → 15
  const uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

// bf16 ------------------------------------------------------------------------------------------

KVPOOL_HD float bf16_to_f32(uint16_t b) {
  return bits_f32(uint32_t(b) << 16);
}

KVPOOL_HD uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// fp8 e4m3 --------------------------------------------------------------------------------------

KVPOOL_HD float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xFu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xF && man == 0x7) return bits_f32(sign | 0x7FC00000u);  // NaN
  if (exp == 0) {
    // Subnormal: man/8 · 2^-6.
    const float f = float(man) * 0.001953125f;  // 2^-9
    return sign ? -f : f;
  }
  return bits_f32(sign | ((exp + 120u) << 23) | (man << 20));
}

KVPOOL_HD uint8_t f32_to_fp8_e4m3(float f) {
  const uint32_t u = f32_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);   // NaN stays NaN
  if (abs >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // ≥ 448 (and inf): saturate
  if (abs < 0x3C800000u) {
    // Below the smallest normal (2^-6): subnormal steps of 2^-9, round to nearest even.
    const float a = bits_f32(abs) * 512.0f;  // in units of 2^-9, exact for these magnitudes
    uint32_t r = static_cast<uint32_t>(a);
    const float rem = a - float(r);
    if (rem > 0.5f || (rem == 0.5f && (r & 1u))) ++r;
    return static_cast<uint8_t>(sign | r);  // r ≤ 8 = 0x08 → the smallest normal, encoded right
  }
  uint32_t r = ((abs - 0x3C000000u) >> 20);  // rebias exponent 127 → 7, keep 3 mantissa bits
  const uint32_t rem = abs & 0xFFFFFu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r > 0x7Eu) r = 0x7Eu;  // rounding up past 448 saturates
  return static_cast<uint8_t>(sign | r);
}

// int8 ------------------------------------------------------------------------------------------

KVPOOL_HD int8_t f32_to_int8(float x, float inv_scale) {
  float q = x * inv_scale;
  if (q != q) return 0;  // NaN (a float → int cast of NaN would be undefined on the host)
  q = q > kInt8Max ? kInt8Max : (q < -kInt8Max ? -kInt8Max : q);
  // Round half away from zero. q − trunc(q) is exact, so this is round() bit for bit; adding 0.5
  // first would not be (0.49999997f + 0.5f rounds to 1.0f).
  const int t = static_cast<int>(q);
  const float frac = q - static_cast<float>(t);
  return static_cast<int8_t>(frac >= 0.5f ? t + 1 : (frac <= -0.5f ? t - 1 : t));
}

KVPOOL_HD float int8_to_f32(int8_t v) {
  return float(v);
}

}  // namespace kvpool::kernels

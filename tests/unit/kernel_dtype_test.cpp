// The KV element conversions of kernels/kv_dtype.h against independent references.
//
// Decoding is checked for every code against sign · 2^(e − bias) · (1 + m / 2^M) (subnormals
// sign · 2^(1 − bias) · m / 2^M) computed in double. Encoding is checked by: the round trip of
// every finite code, the midpoint between every pair of neighbouring codes (ties to even, and the
// float just below / above the midpoint going down / up), overflow and saturation, NaN, and a
// nearest-value property over random floats. int8 is checked against std::round and clamping.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "kernels/kv_dtype.h"

namespace kvpool::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// A binary floating-point format with `ebits` exponent and `mbits` mantissa bits. IEEE-like
// formats reserve the top exponent for inf/NaN; E4M3FN only has S.1111.111 as NaN.
struct Format {
  int ebits;
  int mbits;
  bool ieee;

  uint32_t sign_bit() const { return 1u << (ebits + mbits); }
  bool is_nan(uint32_t c) const {
    const uint32_t e = (c >> mbits) & ((1u << ebits) - 1u);
    const uint32_t m = c & ((1u << mbits) - 1u);
    if (ieee) return e == (1u << ebits) - 1u && m != 0;
    return e == (1u << ebits) - 1u && m == (1u << mbits) - 1u;
  }
  // The value of code c, in double (exact for these formats).
  double value(uint32_t c) const {
    const bool neg = (c & sign_bit()) != 0;
    const auto e = static_cast<int>((c >> mbits) & ((1u << ebits) - 1u));
    const auto m = static_cast<int>(c & ((1u << mbits) - 1u));
    const int bias = (1 << (ebits - 1)) - 1;
    double v;
    if (is_nan(c)) {
      v = std::numeric_limits<double>::quiet_NaN();
    } else if (ieee && e == (1 << ebits) - 1) {
      v = std::numeric_limits<double>::infinity();
    } else if (e == 0) {
      v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
    } else {
      v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -mbits), e - bias);
    }
    return neg ? -v : v;
  }
};

constexpr Format kFp16{5, 10, true};
constexpr Format kBf16{8, 7, true};
constexpr Format kFp8{4, 3, false};

uint32_t enc16(float f) {
  return f32_to_fp16(f);
}
uint32_t encb16(float f) {
  return f32_to_bf16(f);
}
uint32_t enc8(float f) {
  return f32_to_fp8_e4m3(f);
}
float dec16(uint32_t c) {
  return fp16_to_f32(static_cast<uint16_t>(c));
}
float decb16(uint32_t c) {
  return bf16_to_f32(static_cast<uint16_t>(c));
}
float dec8(uint32_t c) {
  return fp8_e4m3_to_f32(static_cast<uint8_t>(c));
}

// Every code decodes to the reference value (bit for bit, sign of zero included).
template <typename Dec>
void check_decode_all(const Format& fmt, uint32_t num_codes, Dec dec) {
  for (uint32_t c = 0; c < num_codes; ++c) {
    const float f = dec(c);
    const double r = fmt.value(c);
    if (std::isnan(r)) {
      ASSERT_TRUE(std::isnan(f)) << "code " << c;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), r) << "code " << c;
    ASSERT_EQ(std::signbit(f), std::signbit(r)) << "code " << c;
  }
}

// Every non-NaN code survives decode → encode; NaN codes give a NaN of the same sign.
template <typename Enc, typename Dec>
void check_round_trip_all(const Format& fmt, uint32_t num_codes, Enc enc, Dec dec) {
  for (uint32_t c = 0; c < num_codes; ++c) {
    const uint32_t back = enc(dec(c));
    if (fmt.is_nan(c)) {
      ASSERT_TRUE(fmt.is_nan(back)) << "code " << c;
      ASSERT_EQ(back & fmt.sign_bit(), c & fmt.sign_bit()) << "code " << c;
    } else {
      ASSERT_EQ(back, c) << "code " << c;
    }
  }
}

// For every pair of neighbouring finite positive codes c, c + 1: the midpoint goes to the even
// one, the floats just below / above it to c / c + 1, and the same with the sign set.
template <typename Enc, typename Dec>
void check_midpoints(const Format& fmt, uint32_t last_finite, Enc enc, Dec dec) {
  for (uint32_t c = 0; c < last_finite; ++c) {
    const double lo = dec(c);
    const double hi = dec(c + 1);
    const double mid_d = (lo + hi) / 2;
    const auto mid = static_cast<float>(mid_d);
    ASSERT_EQ(static_cast<double>(mid), mid_d) << "midpoint not a float, code " << c;
    const uint32_t even = (c & 1u) == 0 ? c : c + 1;
    ASSERT_EQ(enc(mid), even) << "code " << c;
    ASSERT_EQ(enc(-mid), even | fmt.sign_bit()) << "code " << c;
    ASSERT_EQ(enc(std::nextafter(mid, 0.0f)), c) << "code " << c;
    ASSERT_EQ(enc(std::nextafter(mid, kInf)), c + 1) << "code " << c;
    ASSERT_EQ(enc(-std::nextafter(mid, kInf)), (c + 1) | fmt.sign_bit()) << "code " << c;
  }
}

// encode(x) is a nearest finite code to x (ties to the even code), for random finite x of at most
// `max_abs` magnitude, and carries x's sign.
template <typename Enc, typename Dec>
void check_nearest_random(const Format& fmt, uint32_t last_finite, float max_abs, Enc enc,
                          Dec dec) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  while (checked < 200000) {
    const float x = bits_f32(bits(rng));
    if (!std::isfinite(x) || std::fabs(x) > max_abs) continue;
    ++checked;
    const uint32_t c = enc(x);
    ASSERT_EQ((c & fmt.sign_bit()) != 0, std::signbit(x)) << x;
    const uint32_t mag = c & ~fmt.sign_bit();
    ASSERT_LE(mag, last_finite) << x;
    const double ax = std::fabs(static_cast<double>(x));
    const double err = std::fabs(dec(mag) - ax);
    for (uint32_t n : {mag - 1, mag + 1}) {
      if (n > last_finite) continue;  // mag − 1 wrapped, or past the largest finite code
      const double nerr = std::fabs(dec(n) - ax);
      ASSERT_LE(err, nerr) << "x = " << x << " code " << c << " neighbour " << n;
      if (err == nerr) {
        ASSERT_EQ(mag & 1u, 0u) << "tie not to even, x = " << x;
      }
    }
  }
}

// fp16 ------------------------------------------------------------------------------------------

TEST(Fp16Dtype, DecodesEveryCode) {
  check_decode_all(kFp16, 65536, dec16);
}

TEST(Fp16Dtype, RoundTripsEveryCode) {
  check_round_trip_all(kFp16, 65536, enc16, dec16);
}

TEST(Fp16Dtype, MidpointsRoundToEven) {
  // Codes 0 … 0x7BFF are the finite positives, subnormals included (0 and 2^-24 first).
  check_midpoints(kFp16, 0x7BFF, enc16, dec16);
}

TEST(Fp16Dtype, NearestForRandomFloats) {
  check_nearest_random(kFp16, 0x7BFF, 65504.0f, enc16, dec16);
}

TEST(Fp16Dtype, OverflowGoesToInfinity) {
  // 65520 is the midpoint between 65504 (odd mantissa) and 2^16: it rounds to infinity.
  EXPECT_EQ(enc16(65504.0f), 0x7BFFu);
  EXPECT_EQ(enc16(std::nextafter(65520.0f, 0.0f)), 0x7BFFu);
  EXPECT_EQ(enc16(65520.0f), 0x7C00u);
  EXPECT_EQ(enc16(-65520.0f), 0xFC00u);
  EXPECT_EQ(enc16(65536.0f), 0x7C00u);
  EXPECT_EQ(enc16(1e10f), 0x7C00u);
  EXPECT_EQ(enc16(std::numeric_limits<float>::max()), 0x7C00u);
  EXPECT_EQ(enc16(-std::numeric_limits<float>::max()), 0xFC00u);
  EXPECT_EQ(enc16(kInf), 0x7C00u);
  EXPECT_EQ(enc16(-kInf), 0xFC00u);
}

TEST(Fp16Dtype, SubnormalsAndZeros) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest fp16 subnormal
  EXPECT_EQ(enc16(tiny), 0x0001u);
  EXPECT_EQ(enc16(tiny / 2), 0x0000u);  // tie between 0 and 1: even
  EXPECT_EQ(enc16(std::nextafter(tiny / 2, 1.0f)), 0x0001u);
  EXPECT_EQ(enc16(3 * tiny / 2), 0x0002u);              // tie between 1 and 2: even
  EXPECT_EQ(enc16(5 * tiny / 2), 0x0002u);              // tie between 2 and 3: even
  EXPECT_EQ(enc16(std::ldexp(1.0f, -14)), 0x0400u);     // smallest normal
  EXPECT_EQ(enc16(std::ldexp(1023.5f, -24)), 0x0400u);  // top subnormal tie → smallest normal
  EXPECT_EQ(enc16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(enc16(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  EXPECT_EQ(enc16(std::numeric_limits<float>::min()), 0x0000u);
  EXPECT_EQ(enc16(0.0f), 0x0000u);
  EXPECT_EQ(enc16(-0.0f), 0x8000u);
  EXPECT_EQ(dec16(0x0001), tiny);
  EXPECT_EQ(dec16(0x03FF), std::ldexp(1023.0f, -24));
}

TEST(Fp16Dtype, NanStaysNan) {
  for (uint32_t b :
       {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFC00000u, 0xFF800001u, 0x7F802000u}) {
    const uint32_t c = enc16(bits_f32(b));
    EXPECT_TRUE(kFp16.is_nan(c)) << std::hex << b;
    EXPECT_EQ((c & 0x8000u) != 0, (b >> 31) != 0) << std::hex << b;
    EXPECT_TRUE(std::isnan(dec16(c)));
  }
}

TEST(Fp16Dtype, KnownValues) {
  EXPECT_EQ(enc16(1.0f), 0x3C00u);
  EXPECT_EQ(enc16(-2.0f), 0xC000u);
  EXPECT_EQ(enc16(0.1f), 0x2E66u);
  EXPECT_EQ(dec16(0x3555), 0.333251953125f);
  EXPECT_EQ(enc16(1.0f + std::ldexp(1.0f, -11)), 0x3C00u);      // tie, even stays
  EXPECT_EQ(enc16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02u);  // tie, odd rounds up
}

// bf16 ------------------------------------------------------------------------------------------

TEST(Bf16Dtype, DecodesEveryCode) {
  check_decode_all(kBf16, 65536, decb16);
}

TEST(Bf16Dtype, RoundTripsEveryCode) {
  check_round_trip_all(kBf16, 65536, encb16, decb16);
}

TEST(Bf16Dtype, MidpointsRoundToEven) {
  check_midpoints(kBf16, 0x7F7F, encb16, decb16);
}

TEST(Bf16Dtype, NearestForRandomFloats) {
  // Above the largest bf16 (0x7F7F) lies only the overflow region, checked separately.
  check_nearest_random(kBf16, 0x7F7F, decb16(0x7F7F), encb16, decb16);
}

TEST(Bf16Dtype, OverflowGoesToInfinity) {
  EXPECT_EQ(encb16(bits_f32(0x7F7F7FFFu)), 0x7F7Fu);
  EXPECT_EQ(encb16(bits_f32(0x7F7F8000u)), 0x7F80u);  // midpoint, odd below: up to infinity
  EXPECT_EQ(encb16(std::numeric_limits<float>::max()), 0x7F80u);
  EXPECT_EQ(encb16(-std::numeric_limits<float>::max()), 0xFF80u);
  EXPECT_EQ(encb16(kInf), 0x7F80u);
  EXPECT_EQ(encb16(-kInf), 0xFF80u);
}

TEST(Bf16Dtype, SubnormalsAndZeros) {
  EXPECT_EQ(encb16(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(encb16(bits_f32(0x00008000u)), 0x0000u);  // tie: even
  EXPECT_EQ(encb16(bits_f32(0x00008001u)), 0x0001u);
  EXPECT_EQ(encb16(bits_f32(0x00018000u)), 0x0002u);  // tie: odd rounds up
  EXPECT_EQ(encb16(bits_f32(0x007FFFFFu)), 0x0080u);  // largest f32 subnormal → smallest normal
  EXPECT_EQ(encb16(-0.0f), 0x8000u);
  EXPECT_EQ(encb16(0.0f), 0x0000u);
}

TEST(Bf16Dtype, NanStaysNan) {
  for (uint32_t b :
       {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0xFF800001u}) {
    const uint32_t c = encb16(bits_f32(b));
    EXPECT_TRUE(kBf16.is_nan(c)) << std::hex << b;
    EXPECT_EQ((c & 0x8000u) != 0, (b >> 31) != 0) << std::hex << b;
  }
}

TEST(Bf16Dtype, KnownValues) {
  EXPECT_EQ(encb16(1.0f), 0x3F80u);
  EXPECT_EQ(encb16(-2.0f), 0xC000u);
  EXPECT_EQ(encb16(3.14159265f), 0x4049u);
  EXPECT_EQ(decb16(0x4049), 3.140625f);
}

// fp8 e4m3 (OCP E4M3FN) -------------------------------------------------------------------------

TEST(Fp8Dtype, DecodesEveryCode) {
  check_decode_all(kFp8, 256, dec8);
}

TEST(Fp8Dtype, MatchesTheOcpTable) {
  // Entries of the OCP 8-bit floating point specification (E4M3 column).
  struct Entry {
    uint32_t code;
    float value;
  };
  for (const Entry& e :
       {Entry{0x00, 0.0f},         Entry{0x01, 0.001953125f}, Entry{0x02, 0.00390625f},
        Entry{0x07, 0.013671875f}, Entry{0x08, 0.015625f},    Entry{0x09, 0.017578125f},
        Entry{0x30, 0.5f},         Entry{0x38, 1.0f},         Entry{0x39, 1.125f},
        Entry{0x3F, 1.875f},       Entry{0x40, 2.0f},         Entry{0x70, 128.0f},
        Entry{0x77, 240.0f},       Entry{0x78, 256.0f},       Entry{0x7C, 384.0f},
        Entry{0x7D, 416.0f},       Entry{0x7E, 448.0f},       Entry{0xB8, -1.0f},
        Entry{0xFE, -448.0f},      Entry{0x81, -0.001953125f}}) {
    EXPECT_EQ(dec8(e.code), e.value) << std::hex << e.code;
  }
  EXPECT_TRUE(std::signbit(dec8(0x80)));
  EXPECT_EQ(dec8(0x80), 0.0f);
  EXPECT_TRUE(std::isnan(dec8(0x7F)));
  EXPECT_TRUE(std::isnan(dec8(0xFF)));
  // S.1111.000 … S.1111.110 are ordinary numbers in E4M3FN (no infinities).
  EXPECT_EQ(dec8(0x79), 288.0f);
  EXPECT_EQ(dec8(0xFA), -320.0f);
}

TEST(Fp8Dtype, RoundTripsEveryCode) {
  // Negative zero encodes back to 0x80 (the sign is kept), NaN to a NaN of the same sign.
  check_round_trip_all(kFp8, 256, enc8, dec8);
  EXPECT_EQ(enc8(-0.0f), 0x80u);
}

TEST(Fp8Dtype, MidpointsRoundToEven) {
  check_midpoints(kFp8, 0x7E, enc8, dec8);
}

TEST(Fp8Dtype, NearestForRandomFloats) {
  check_nearest_random(kFp8, 0x7E, 448.0f, enc8, dec8);
}

TEST(Fp8Dtype, SaturatesAt448) {
  for (float x : {448.0f, std::nextafter(448.0f, kInf), 449.0f, 464.0f, 480.0f, 500.0f, 1e6f,
                  std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(enc8(x), 0x7Eu) << x;
    EXPECT_EQ(enc8(-x), 0xFEu) << x;
  }
  EXPECT_EQ(enc8(447.0f), 0x7Eu);
  EXPECT_EQ(enc8(432.0f), 0x7Eu);  // midpoint of 416 (odd code) and 448
  EXPECT_EQ(enc8(std::nextafter(432.0f, 0.0f)), 0x7Du);
}

TEST(Fp8Dtype, SubnormalsAndZeros) {
  const float tiny = std::ldexp(1.0f, -9);  // smallest subnormal
  EXPECT_EQ(enc8(tiny / 2), 0x00u);         // tie: even
  EXPECT_EQ(enc8(std::nextafter(tiny / 2, 1.0f)), 0x01u);
  EXPECT_EQ(enc8(3 * tiny / 2), 0x02u);  // tie: odd rounds up
  EXPECT_EQ(enc8(7.5f * tiny), 0x08u);   // top subnormal tie → smallest normal
  EXPECT_EQ(enc8(std::numeric_limits<float>::denorm_min()), 0x00u);
  EXPECT_EQ(enc8(-std::numeric_limits<float>::denorm_min()), 0x80u);
  EXPECT_EQ(enc8(1e-30f), 0x00u);
  EXPECT_EQ(enc8(0.0f), 0x00u);
}

TEST(Fp8Dtype, NanStaysNan) {
  for (uint32_t b : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFFC00000u}) {
    const uint32_t c = enc8(bits_f32(b));
    EXPECT_TRUE(kFp8.is_nan(c)) << std::hex << b;
    EXPECT_EQ((c & 0x80u) != 0, (b >> 31) != 0) << std::hex << b;
    EXPECT_TRUE(std::isnan(dec8(c)));
  }
}

// int8 ------------------------------------------------------------------------------------------

int ref_int8(float x, float inv_scale) {
  const double q = std::round(static_cast<double>(x * inv_scale));  // half away from zero
  return static_cast<int>(std::clamp(q, -127.0, 127.0));
}

TEST(Int8Dtype, RoundsHalfAwayFromZero) {
  EXPECT_EQ(f32_to_int8(0.5f, 1.0f), 1);
  EXPECT_EQ(f32_to_int8(-0.5f, 1.0f), -1);
  EXPECT_EQ(f32_to_int8(1.5f, 1.0f), 2);
  EXPECT_EQ(f32_to_int8(2.5f, 1.0f), 3);
  EXPECT_EQ(f32_to_int8(-2.5f, 1.0f), -3);
  EXPECT_EQ(f32_to_int8(126.5f, 1.0f), 127);
  EXPECT_EQ(f32_to_int8(2.4999998f, 1.0f), 2);
  // Just below one half: adding 0.5 in float would round this up to 1.
  EXPECT_EQ(f32_to_int8(std::nextafter(0.5f, 0.0f), 1.0f), 0);
  EXPECT_EQ(f32_to_int8(-std::nextafter(0.5f, 0.0f), 1.0f), 0);
  EXPECT_EQ(f32_to_int8(0.0f, 1.0f), 0);
  EXPECT_EQ(f32_to_int8(-0.0f, 1.0f), 0);
  for (int i = -127; i <= 127; ++i) {
    EXPECT_EQ(f32_to_int8(static_cast<float>(i), 1.0f), i);
    EXPECT_EQ(int8_to_f32(static_cast<int8_t>(i)), static_cast<float>(i));
  }
}

TEST(Int8Dtype, ClampsToSymmetricRange) {
  for (float x : {127.4f, 127.5f, 128.0f, 200.0f, 1e30f, kInf}) {
    EXPECT_EQ(f32_to_int8(x, 1.0f), 127) << x;
    EXPECT_EQ(f32_to_int8(-x, 1.0f), -127) << x;  // never −128
  }
  EXPECT_EQ(f32_to_int8(3.0f, 100.0f), 127);
  EXPECT_EQ(f32_to_int8(kNan, 1.0f), 0);
  EXPECT_EQ(f32_to_int8(1.0f, kInf), 127);
}

TEST(Int8Dtype, ScalesThenRoundsLikeStdRound) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> x(-200.0f, 200.0f);
  std::uniform_real_distribution<float> log_scale(-8.0f, 3.0f);
  for (int i = 0; i < 200000; ++i) {
    const float inv = std::exp2(log_scale(rng));
    const float v = x(rng) / inv;
    ASSERT_EQ(f32_to_int8(v, inv), ref_int8(v, inv)) << v << " · " << inv;
  }
  // The 4096 floats on either side of every tie in [−127.5, 127.5].
  for (int k = -128; k <= 127; ++k) {
    const float tie = static_cast<float>(k) + 0.5f;
    float lo = tie;
    float hi = tie;
    for (int i = 0; i < 4096; ++i) {
      ASSERT_EQ(f32_to_int8(lo, 1.0f), ref_int8(lo, 1.0f)) << lo;
      ASSERT_EQ(f32_to_int8(hi, 1.0f), ref_int8(hi, 1.0f)) << hi;
      lo = std::nextafter(lo, -kInf);
      hi = std::nextafter(hi, kInf);
    }
  }
}

}  // namespace
}  // namespace kvpool::kernels

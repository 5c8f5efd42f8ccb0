// AVX2 + FMA + F16C inner loops of the CPU attention kernels (contracts in attention_avx2.h).
//
// Row conversion, 16 elements per step, bit-identical to detail::load_row:
//  - fp16: vcvtph2ps is exact for every finite code and for infinities, but it quiets signalling
//    NaNs (0x7C01 → 0x7FC02000 where fp16_to_f32 keeps 0x7F802000), so a step whose 16 codes hold
//    any exponent-31 code converts them with the scalar fp16_to_f32_fast instead;
//  - bf16: widen to 32 bits and shift left by 16;
//  - fp8 e4m3 → fp16 → fp32: sign-extending the byte to 16 bits and shifting left by 7 puts the
//    sign at bit 15 (and a copy at bit 14, masked off) and the 7 exponent-and-mantissa bits at
//    bits 7..13, i.e. the fp16 with the e4m3 exponent and mantissa fields, whose value is the
//    e4m3 value · 2^-8 for normals and subnormals alike (both have exponent bias 15 − 7 = 8 apart
//    and the same subnormal rule); vcvtph2ps widens it exactly. The e4m3 NaN S.1111.111 would
//    become ±1.875, so it is turned into the fp16 quiet NaN S.11111.1000000000, which widens to
//    the ±0x7FC00000 that fp8_e4m3_to_f32 returns. The 2^8 goes into the multiplier: y · (256 ·
//    scale) rounds the same real number v · scale as the baseline's v · scale, because y = v ·
//    2^-8 and 256 · scale are exact; when 256 · scale would overflow the row is multiplied in two
//    exact steps (· 256, then · scale) instead;
//  - int8: sign-extend to 32 bits, convert, multiply by scale.
// Elements past the last whole step go through the scalar conversions of attention_common.h.
//
// score_block: a tile of 4 query rows × 2 keys keeps 8 accumulators of 8 lanes in registers, so
// each 8-element step loads 6 vectors for 8 fused multiply-adds. Groups that are not a multiple of
// 4 (or blocks with an odd key count) repeat the last row (key) and drop the repeated results.
// accumulate_pv: a tile of 2 query rows × 32 accumulator floats stays in registers while the
// block's V rows stream through (6 loads for 8 fused multiply-adds per key), then 8-float tiles
// for the rest of d.
#include "kernels/cpu/attention_avx2.h"

#if KVPOOL_CPU_HAVE_AVX2
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "kernels/cpu/attention_common.h"
#include "kernels/online_softmax.h"
#endif

namespace kvpool::kernels::cpu::detail::avx2 {

#if KVPOOL_CPU_HAVE_AVX2

bool supported() {
  static const bool ok = [] {
    // __builtin_cpu_supports also checks that the OS saves the YMM registers. Not every compiler
    // knows "f16c" there (clang 14 does not), so that bit comes from CPUID leaf 1 (ECX bit 29).
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return ok;
}

#define KVPOOL_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace {

KVPOOL_AVX2 inline __m256i splat16(uint16_t x) {
  return _mm256_set1_epi16(static_cast<short>(x));
}

KVPOOL_AVX2 inline __m128i load16(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

KVPOOL_AVX2 void fp16_row(const uint16_t* s, uint32_t n, float* dst) {
  uint32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    // Signed compare: the masked magnitudes are ≤ 0x7FFF.
    const __m256i special =
        _mm256_cmpgt_epi16(_mm256_and_si256(h, splat16(0x7FFF)), splat16(0x7BFF));
    if (_mm256_testz_si256(special, special)) {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
      _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
    } else {
      for (uint32_t x = i; x < i + 16; ++x)
        dst[x] = fp16_to_f32_fast(s[x]);
    }
  }
  for (; i < n; ++i)
    dst[i] = fp16_to_f32_fast(s[i]);
}

KVPOOL_AVX2 void bf16_row(const uint16_t* s, uint32_t n, float* dst) {
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(load16(s + i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i)
    dst[i] = std::bit_cast<float>(uint32_t{s[i]} << 16);
}

// dst[0..16) = fp8_e4m3_to_f32(s[x]) · 2^-8 · mul (see the file comment).
KVPOOL_AVX2 inline void fp8x16(const uint8_t* s, __m256 mul, float* dst) {
  const __m256i w = _mm256_cvtepi8_epi16(load16(s));
  __m256i h = _mm256_and_si256(_mm256_slli_epi16(w, 7), splat16(0xBFFF));
  // h << 1 drops the sign: 0x7F00 exactly for the exponent-and-mantissa bits 0x7F, the NaN.
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_slli_epi16(h, 1), splat16(0x7F00));
  h = _mm256_xor_si256(h, _mm256_and_si256(nan, splat16(0x3F80 ^ 0x7E00)));
  _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), mul));
  _mm256_storeu_ps(dst + 8, _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), mul));
}

KVPOOL_AVX2 void fp8_row(const uint8_t* s, uint32_t n, float scale, float* dst) {
  const uint32_t whole = n / 16 * 16;
  const float scale256 = scale * 256.0f;
  const bool two_steps = std::isfinite(scale) && !std::isfinite(scale256);
  const __m256 mul = _mm256_set1_ps(two_steps ? 256.0f : scale256);
  for (uint32_t i = 0; i < whole; i += 16)
    fp8x16(s + i, mul, dst + i);
  if (two_steps) {
    for (uint32_t i = 0; i < whole; ++i)
      dst[i] *= scale;
  }
  for (uint32_t i = whole; i < n; ++i)
    dst[i] = fp8_e4m3_to_f32_fast(s[i]) * scale;
}

KVPOOL_AVX2 void int8_row(const int8_t* s, uint32_t n, float scale, float* dst) {
  const __m256 mul = _mm256_set1_ps(scale);
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepi8_epi32(
        _mm_loadl_epi64(static_cast<const __m128i*>(static_cast<const void*>(s + i))));
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(w), mul));
  }
  for (; i < n; ++i)
    dst[i] = static_cast<float>(s[i]) * scale;
}

KVPOOL_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

KVPOOL_AVX2 inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// exp(x) for x ≤ 0 (or NaN, which stays NaN): Cephes' expf, exp(x) = 2^k · exp(r) with k =
// round(x / ln 2), r = x − k · ln 2 in two exact-ish parts and a degree-6 polynomial for exp(r),
// |r| ≤ ln 2 / 2; within 2 ulp of exp. Below ln(2^-126) the result is 0 (expf would give a
// subnormal there). The min/max operand order keeps a NaN x (they return the second operand).
KVPOOL_AVX2 inline __m256 exp_nonpositive(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365478515625f);  // ln(2^-126)
  const __m256 underflow = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_setzero_ps(), x));
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // k ∈ [−126, 0] here, so 2^k is a normal float built from its exponent field.
  const __m256i pow2k =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(y, _mm256_castsi256_ps(pow2k)));
}

// One tile of accumulate_pv: W vectors of 8 floats of rows a0 and a1 (a1 == a0 and store_a1 false
// for the last row of an odd group), starting at the same column as v.
template <uint32_t W>
KVPOOL_AVX2 inline void pv_tile(float* a0, float* a1, bool store_a1, __m256 c0, __m256 c1,
                                const float* p0, const float* p1, const float* v, uint32_t n,
                                uint32_t v_stride) {
  __m256 t0[W];
  __m256 t1[W];
#pragma GCC unroll 8
  for (uint32_t w = 0; w < W; ++w) {
    t0[w] = _mm256_mul_ps(_mm256_loadu_ps(a0 + 8 * w), c0);
    t1[w] = _mm256_mul_ps(_mm256_loadu_ps(a1 + 8 * w), c1);
  }
  for (uint32_t j = 0; j < n; ++j) {
    const __m256 b0 = _mm256_broadcast_ss(p0 + j);
    const __m256 b1 = _mm256_broadcast_ss(p1 + j);
    const float* vj = v + size_t{j} * v_stride;
#pragma GCC unroll 8
    for (uint32_t w = 0; w < W; ++w) {
      const __m256 x = _mm256_loadu_ps(vj + 8 * w);
      t0[w] = _mm256_fmadd_ps(b0, x, t0[w]);
      t1[w] = _mm256_fmadd_ps(b1, x, t1[w]);
    }
  }
#pragma GCC unroll 8
  for (uint32_t w = 0; w < W; ++w) {
    _mm256_storeu_ps(a0 + 8 * w, t0[w]);
    if (store_a1) _mm256_storeu_ps(a1 + 8 * w, t1[w]);
  }
}

}  // namespace

KVPOOL_AVX2 void load_row(KvDtype dtype, const std::byte* src, uint32_t n, float scale,
                          float* dst) {
  switch (dtype) {
    case KvDtype::fp16:
      fp16_row(reinterpret_cast<const uint16_t*>(src), n, dst);
      break;
    case KvDtype::bf16:
      bf16_row(reinterpret_cast<const uint16_t*>(src), n, dst);
      break;
    case KvDtype::fp8_e4m3:
      fp8_row(reinterpret_cast<const uint8_t*>(src), n, scale, dst);
      break;
    case KvDtype::int8:
      int8_row(reinterpret_cast<const int8_t*>(src), n, scale, dst);
      break;
  }
}

KVPOOL_AVX2 void score_block(const float* q, uint32_t group, uint32_t d, const float* k, uint32_t n,
                             float scale, float* s, uint32_t s_stride) {
  constexpr uint32_t kRows = 4;
  constexpr uint32_t kKeys = 3;
  for (uint32_t h0 = 0; h0 < group; h0 += kRows) {
    const float* qr[kRows];
#pragma GCC unroll 8
    for (uint32_t r = 0; r < kRows; ++r)
      qr[r] = q + size_t{std::min(h0 + r, group - 1)} * d;
    for (uint32_t j0 = 0; j0 < n; j0 += kKeys) {
      const float* kr[kKeys];
#pragma GCC unroll 8
      for (uint32_t c = 0; c < kKeys; ++c)
        kr[c] = k + size_t{std::min(j0 + c, n - 1)} * d;
      __m256 acc[kRows][kKeys];
#pragma GCC unroll 8
      for (uint32_t r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
        for (uint32_t c = 0; c < kKeys; ++c)
          acc[r][c] = _mm256_setzero_ps();
      }
      for (uint32_t i = 0; i < d; i += 8) {
        __m256 kv[kKeys];
#pragma GCC unroll 8
        for (uint32_t c = 0; c < kKeys; ++c)
          kv[c] = _mm256_loadu_ps(kr[c] + i);
#pragma GCC unroll 8
        for (uint32_t r = 0; r < kRows; ++r) {
          const __m256 x = _mm256_loadu_ps(qr[r] + i);
#pragma GCC unroll 8
          for (uint32_t c = 0; c < kKeys; ++c)
            acc[r][c] = _mm256_fmadd_ps(x, kv[c], acc[r][c]);
        }
      }
      for (uint32_t r = 0; r < kRows && h0 + r < group; ++r) {
        float* row = s + size_t{h0 + r} * s_stride;
        for (uint32_t c = 0; c < kKeys && j0 + c < n; ++c)
          row[j0 + c] = hsum(acc[r][c]) * scale;
      }
    }
  }
}

KVPOOL_AVX2 void accumulate_pv(float* acc, const float* corr, const float* p, uint32_t p_stride,
                               const float* v, uint32_t v_stride, uint32_t group, uint32_t n,
                               uint32_t d) {
  for (uint32_t h0 = 0; h0 < group; h0 += 2) {
    const uint32_t h1 = std::min(h0 + 1, group - 1);
    float* a0 = acc + size_t{h0} * d;
    float* a1 = acc + size_t{h1} * d;
    const float* p0 = p + size_t{h0} * p_stride;
    const float* p1 = p + size_t{h1} * p_stride;
    const __m256 c0 = _mm256_set1_ps(corr[h0]);
    const __m256 c1 = _mm256_set1_ps(corr[h1]);
    uint32_t i = 0;
    for (; i + 48 <= d; i += 48)
      pv_tile<6>(a0 + i, a1 + i, h1 != h0, c0, c1, p0, p1, v + i, n, v_stride);
    for (; i + 32 <= d; i += 32)
      pv_tile<4>(a0 + i, a1 + i, h1 != h0, c0, c1, p0, p1, v + i, n, v_stride);
    for (; i < d; i += 8)
      pv_tile<1>(a0 + i, a1 + i, h1 != h0, c0, c1, p0, p1, v + i, n, v_stride);
  }
}

KVPOOL_AVX2 float softmax_block_scores(SoftmaxStats& st, float* s, uint32_t n) {
  const uint32_t whole = n / 8 * 8;
  // MAXPS returns its second operand when either is NaN: a NaN score is skipped, as in the
  // scalar max, and a NaN running max stays NaN.
  __m256 mv = _mm256_set1_ps(st.m);
  for (uint32_t j = 0; j < whole; j += 8)
    mv = _mm256_max_ps(_mm256_loadu_ps(s + j), mv);
  float m_new = hmax(mv);
  for (uint32_t j = whole; j < n; ++j)
    m_new = s[j] > m_new ? s[j] : m_new;
  if (m_new == -INFINITY) {
    // Every score −inf or NaN: the scalar function's rule (no weight, a NaN still propagates).
    return kvpool::kernels::softmax_block_scores(st, s, static_cast<int>(n));
  }
  const float corr = std::exp(st.m - m_new);
  const __m256 mb = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (uint32_t j = 0; j < n; j += 8) {
    // The last partial step works on a copy padded with −inf, whose exps are 0.
    float tail[8];
    float* x = s + j;
    if (j + 8 > n) {
      for (uint32_t t = 0; t < 8; ++t)
        tail[t] = j + t < n ? s[j + t] : -INFINITY;
      x = tail;
    }
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(x), mb));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(x, e);
    if (x == tail) {
      for (uint32_t t = 0; j + t < n; ++t)
        s[j + t] = tail[t];
    }
  }
  st.l = st.l * corr + hsum(sum);
  st.m = m_new;
  return corr;
}

#undef KVPOOL_AVX2

#else

bool supported() {
  return false;
}

#endif

}  // namespace kvpool::kernels::cpu::detail::avx2

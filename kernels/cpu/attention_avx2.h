// The AVX2 (+ FMA + F16C) versions of the CPU attention kernels' inner loops; internal to
// kernels/cpu. The kernels pick them at run time (kernels_cpu.h, Isa), so the library still runs
// on a baseline x86-64 CPU and still builds on other architectures.
//
// How it stays safe to link into a baseline build: every function here is compiled with
// __attribute__((target("avx2,fma,f16c"))) on its own definition (attention_avx2.cpp), not with
// -mavx2 on a translation unit. So no inline function, template or std:: instantiation shared
// with baseline code is ever emitted with AVX2 instructions (an -mavx2 TU could hand the linker an
// AVX2 copy of, say, std::min that baseline callers would then use). They are only called after
// supported() said yes.
//
// Contracts (the baseline functions of attention_common.h / decode.cpp are the reference):
//  - load_row: the same fp32 values bit for bit as detail::load_row, for every dtype, every n
//    and every scale (tested exhaustively over all codes): 16-bit codes exactly as
//    fp16_to_f32 / bf16_to_f32, 8-bit codes exactly as fp8_e4m3_to_f32(x) · scale and
//    int8_to_f32(x) · scale, NaNs included;
//  - score_block and accumulate_pv: same math as the baseline ones with fused multiply-adds and
//    8-lane partial sums, so their rounding differs from the baseline's (both are fp32 and within
//    the tests' tolerances) but is fixed for a given input: no dependence on threads or calls;
//  - score_block and accumulate_pv need head_dim (and a latent pool's value width) % 8 == 0
//    (kAvx2HeadDimMultiple); the kernels use the baseline code for other widths.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/geometry.h"
#include "kernels/online_softmax.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KVPOOL_CPU_HAVE_AVX2 1
#else
#define KVPOOL_CPU_HAVE_AVX2 0
#endif

namespace kvpool::kernels::cpu::detail::avx2 {

inline constexpr uint32_t kAvx2HeadDimMultiple = 8;

// True when this CPU (and the OS, which must save the YMM registers) supports AVX2, FMA and
// F16C; always false where KVPOOL_CPU_HAVE_AVX2 is 0.
bool supported();

#if KVPOOL_CPU_HAVE_AVX2

// Converts n elements of `dtype` at src into fp32 at dst; 8-bit values are multiplied by scale
// (16-bit ones are not, as in detail::load_row).
void load_row(KvDtype dtype, const std::byte* src, uint32_t n, float scale, float* dst);

// s[h · s_stride + j] = scale · (q_h · k_j) for h < group and j < n, with q_h = q + h · d and
// k_j = k + j · d (fp32 rows). d must be a multiple of 8.
void score_block(const float* q, uint32_t group, uint32_t d, const float* k, uint32_t n,
                 float scale, float* s, uint32_t s_stride);

// acc[h][0..d) = acc[h] · corr[h] + Σ_{j<n} p[h · p_stride + j] · v_j for h < group, with
// acc[h] = acc + h · d and v_j = v + j · v_stride (v_stride ≥ d). d must be a multiple of 8.
void accumulate_pv(float* acc, const float* corr, const float* p, uint32_t p_stride, const float* v,
                   uint32_t v_stride, uint32_t group, uint32_t n, uint32_t d);

// softmax_block_scores of online_softmax.h (same contract and edge cases) with the block's max,
// exps and sum in vectors; the exps are within 2 ulp of expf, so p_j and l differ from the
// scalar function's by a few ulp.
float softmax_block_scores(SoftmaxStats& st, float* s, uint32_t n);

#endif

}  // namespace kvpool::kernels::cpu::detail::avx2

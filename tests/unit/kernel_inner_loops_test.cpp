// The inner loops of the CPU attention kernels against their references. Baseline pieces
// (attention_common.h, softmax_add_block): fast conversions bit for bit, dot products against
// fp64, the block softmax against per-key updates. AVX2 pieces (attention_avx2.h, skipped where
// the CPU has no AVX2): row conversion bit for bit against the scalar conversions of kv_dtype.h
// for every code in every vector lane, scores and P·V against fp64, the vectorised softmax block
// against the scalar one of online_softmax.h (edge cases included). Whole-kernel checks of both
// instruction sets against the fp64 attention reference are in kernel_attention_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"
#include "kernels/online_softmax.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::kernels {
namespace {

// Baseline pieces (kernels/cpu/attention_common.h, softmax_add_block) ----------------------------

TEST(AttentionCommon, FastConversionsAreBitExact) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const auto x = static_cast<uint16_t>(h);
    ASSERT_EQ(f32_bits(cpu::detail::fp16_to_f32_fast(x)), f32_bits(fp16_to_f32(x))) << h;
  }
  for (uint32_t v = 0; v < 0x100u; ++v) {
    const auto x = static_cast<uint8_t>(v);
    ASSERT_EQ(f32_bits(cpu::detail::fp8_e4m3_to_f32_fast(x)), f32_bits(fp8_e4m3_to_f32(x))) << v;
  }
}

TEST(AttentionCommon, DotHeadsMatchesFp64) {
  std::mt19937_64 rng(5);
  for (uint32_t d : {1u, 7u, 8u, 72u, 128u}) {
    for (uint32_t heads : {1u, 3u, 4u, 5u, 9u}) {
      const std::vector<float> q = test::random_normal(rng, size_t{heads} * d, 1.0f);
      const std::vector<float> k = test::random_normal(rng, d, 1.0f);
      std::vector<float> part(size_t{heads} * cpu::detail::kDotLanes), s(heads);
      cpu::detail::dot_heads(q.data(), heads, d, k.data(), 0.5f, part.data(), s.data());
      for (uint32_t h = 0; h < heads; ++h) {
        double ref = 0.0;
        double mag = 0.0;
        for (uint32_t i = 0; i < d; ++i) {
          ref += double{q[size_t{h} * d + i]} * k[i];
          mag += std::fabs(double{q[size_t{h} * d + i]} * k[i]);
        }
        EXPECT_NEAR(s[h], 0.5 * ref, 0.5 * mag * 1e-6) << "d " << d << " heads " << heads;
      }
    }
  }
}

TEST(AttentionCommon, SoftmaxAddBlockMatchesPerKeySoftmax) {
  std::mt19937_64 rng(6);
  constexpr int kD = 12;
  const std::vector<int> blocks{5, 1, 16, 3, 16};  // the third block brings a new, larger max
  int keys = 0;
  for (int n : blocks)
    keys += n;
  std::vector<float> scores = test::random_normal(rng, static_cast<size_t>(keys), 3.0f);
  scores[8] = 20.0f;
  const std::vector<float> v = test::random_normal(rng, static_cast<size_t>(keys) * kD, 1.0f);

  SoftmaxStats ref;
  std::vector<float> acc_ref(kD, 0.0f);
  for (int j = 0; j < keys; ++j)
    softmax_add(ref, acc_ref.data(), v.data() + j * kD, kD, scores[static_cast<size_t>(j)]);

  SoftmaxStats st;
  std::vector<float> acc(kD, 0.0f);
  std::vector<float> s = scores;
  int j0 = 0;
  for (int n : blocks) {
    softmax_add_block(st, acc.data(), v.data() + j0 * kD, kD, kD, s.data() + j0, n);
    j0 += n;
  }
  EXPECT_EQ(st.m, ref.m);
  EXPECT_NEAR(st.l, ref.l, 1e-5 * ref.l);
  for (int i = 0; i < kD; ++i)
    EXPECT_NEAR(acc[static_cast<size_t>(i)] / st.l, acc_ref[static_cast<size_t>(i)] / ref.l, 1e-5);

  // A block of −inf scores carries no weight and leaves the state as it was.
  const SoftmaxStats before = st;
  const std::vector<float> acc_before = acc;
  float ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
  softmax_add_block(st, acc.data(), v.data(), kD, kD, ninf, 3);
  EXPECT_EQ(st.m, before.m);
  EXPECT_EQ(st.l, before.l);
  EXPECT_EQ(acc, acc_before);
  SoftmaxStats empty;
  std::fill(ninf, ninf + 3, -INFINITY);  // the call above turned them into p_j = 0
  EXPECT_EQ(softmax_block_scores(empty, ninf, 3), 1.0f);
  EXPECT_EQ(empty.l, 0.0f);
  EXPECT_EQ(empty.m, -INFINITY);
}

// Instruction sets ------------------------------------------------------------------------------

TEST(KernelIsa, NamesAndSupport) {
  EXPECT_EQ(cpu::isa_name(cpu::Isa::automatic), "automatic");
  EXPECT_EQ(cpu::isa_name(cpu::Isa::baseline), "baseline");
  EXPECT_EQ(cpu::isa_name(cpu::Isa::avx2), "avx2");
  EXPECT_TRUE(cpu::isa_supported(cpu::Isa::automatic));
  EXPECT_TRUE(cpu::isa_supported(cpu::Isa::baseline));
  EXPECT_EQ(cpu::isa_supported(cpu::Isa::avx2), cpu::detail::avx2::supported());
#if !KVPOOL_CPU_HAVE_AVX2
  EXPECT_FALSE(cpu::isa_supported(cpu::Isa::avx2));
#endif
}

#if KVPOOL_CPU_HAVE_AVX2

namespace avx2 = cpu::detail::avx2;

class KernelAvx2 : public testing::Test {
 protected:
  void SetUp() override {
    if (!avx2::supported()) GTEST_SKIP() << "this CPU has no AVX2 + FMA + F16C";
  }
};

// The scalar reference of one element, as detail::load_row defines it.
float reference_elem(KvDtype d, uint16_t code, float scale) {
  switch (d) {
    case KvDtype::fp16:
      return fp16_to_f32(code);
    case KvDtype::bf16:
      return bf16_to_f32(code);
    case KvDtype::fp8_e4m3:
      return fp8_e4m3_to_f32(static_cast<uint8_t>(code)) * scale;
    case KvDtype::int8:
      return int8_to_f32(static_cast<int8_t>(static_cast<uint8_t>(code))) * scale;
  }
  return 0.0f;
}

TEST_F(KernelAvx2, LoadRowIsBitIdenticalForEveryCodeInEveryLane) {
  for (KvDtype d : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    const uint32_t codes = dtype_bytes(d) == 2 ? 0x10000u : 0x100u;
    // Element i holds code (i + i / codes) mod codes: each pass over the codes is shifted by one
    // lane, so every code meets every lane of a 16-element step. The 7 extra elements make a tail.
    const uint32_t n = 16 * codes + 7;
    const uint32_t b = dtype_bytes(d);
    // One element of slack in front: the rows are also read from an address that is not a
    // multiple of the vector size.
    std::vector<std::byte> raw((size_t{n} + 1) * b);
    for (uint32_t i = 0; i < n; ++i) {
      const auto code = static_cast<uint16_t>((i + i / codes) % codes);
      std::memcpy(&raw[(size_t{i} + 1) * b], &code, b);
    }
    // 1e37 · 256 overflows: the fp8 path's two-step multiply.
    for (float scale : {1.0f, 0.37f, 3e-30f, 1e37f}) {
      std::vector<float> got(n, 0.0f);
      avx2::load_row(d, raw.data() + b, n, scale, got.data());
      for (uint32_t i = 0; i < n; ++i) {
        uint16_t code = 0;
        std::memcpy(&code, &raw[(size_t{i} + 1) * b], b);
        ASSERT_EQ(f32_bits(got[i]), f32_bits(reference_elem(d, code, scale)))
            << dtype_name(d) << " code " << code << " lane " << i % 16 << " scale " << scale;
      }
    }
  }
}

TEST_F(KernelAvx2, ScoreBlockMatchesFp64) {
  std::mt19937_64 rng(21);
  for (uint32_t d : {8u, 64u, 72u, 128u, 256u}) {
    for (uint32_t group : {1u, 2u, 3u, 4u, 5u, 8u}) {
      for (uint32_t n : {1u, 2u, 3u, 4u, 16u}) {
        const std::vector<float> q = test::random_normal(rng, size_t{group} * d, 1.0f);
        const std::vector<float> k = test::random_normal(rng, size_t{n} * d, 1.0f);
        constexpr uint32_t kStride = 17;
        std::vector<float> s(size_t{group} * kStride, 99.0f);
        avx2::score_block(q.data(), group, d, k.data(), n, 0.25f, s.data(), kStride);
        for (uint32_t h = 0; h < group; ++h) {
          for (uint32_t j = 0; j < kStride; ++j) {
            const float got = s[size_t{h} * kStride + j];
            if (j >= n) {
              ASSERT_EQ(got, 99.0f) << "wrote past the block";
              continue;
            }
            double ref = 0.0;
            double mag = 0.0;
            for (uint32_t i = 0; i < d; ++i) {
              ref += double{q[size_t{h} * d + i]} * k[size_t{j} * d + i];
              mag += std::fabs(double{q[size_t{h} * d + i]} * k[size_t{j} * d + i]);
            }
            EXPECT_NEAR(got, 0.25 * ref, 0.25 * mag * 1e-6)
                << "d " << d << " group " << group << " n " << n << " h " << h << " j " << j;
          }
        }
      }
    }
  }
}

TEST_F(KernelAvx2, AccumulatePvMatchesFp64) {
  std::mt19937_64 rng(22);
  for (uint32_t d : {8u, 40u, 64u, 72u, 128u, 256u}) {
    for (uint32_t group : {1u, 2u, 3u, 4u, 8u}) {
      for (uint32_t n : {1u, 5u, 16u}) {
        constexpr uint32_t kStride = 16;
        const std::vector<float> acc0 = test::random_normal(rng, size_t{group} * d, 1.0f);
        // Value rows wider than d every other time: a latent pool's rows are the key rows.
        const uint32_t v_stride = d + (n % 2 == 1 ? 8 : 0);
        const std::vector<float> v = test::random_normal(rng, size_t{n} * v_stride, 1.0f);
        std::vector<float> p(size_t{group} * kStride);
        std::uniform_real_distribution<float> unit(0.0f, 1.0f);
        for (float& x : p)
          x = unit(rng);
        std::vector<float> corr(group);
        for (float& x : corr)
          x = unit(rng);
        std::vector<float> acc = acc0;
        avx2::accumulate_pv(acc.data(), corr.data(), p.data(), kStride, v.data(), v_stride, group,
                            n, d);
        for (uint32_t h = 0; h < group; ++h) {
          for (uint32_t i = 0; i < d; ++i) {
            double ref = double{acc0[size_t{h} * d + i]} * corr[h];
            double mag = std::fabs(ref);
            for (uint32_t j = 0; j < n; ++j) {
              const double t = double{p[size_t{h} * kStride + j]} * v[size_t{j} * v_stride + i];
              ref += t;
              mag += std::fabs(t);
            }
            EXPECT_NEAR(acc[size_t{h} * d + i], ref, mag * 1e-6)
                << "d " << d << " group " << group << " n " << n << " h " << h << " i " << i;
          }
        }
      }
    }
  }
}

// The vector softmax block against online_softmax.h's scalar one on the same scores.
void expect_same_softmax(const SoftmaxStats& start, const std::vector<float>& scores) {
  SoftmaxStats want_st = start;
  std::vector<float> want = scores;
  const float want_corr = softmax_block_scores(want_st, want.data(), static_cast<int>(want.size()));
  SoftmaxStats got_st = start;
  std::vector<float> got = scores;
  const float got_corr =
      avx2::softmax_block_scores(got_st, got.data(), static_cast<uint32_t>(got.size()));
  // The vector exp gives 0 where expf's result is below the smallest normal float.
  auto close = [](float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    return a == b || std::fabs(a - b) <= 1e-6f * std::fabs(b) + FLT_MIN;
  };
  EXPECT_TRUE(close(got_st.m, want_st.m)) << got_st.m << " vs " << want_st.m;
  EXPECT_TRUE(close(got_st.l, want_st.l)) << got_st.l << " vs " << want_st.l;
  EXPECT_TRUE(close(got_corr, want_corr)) << got_corr << " vs " << want_corr;
  for (size_t j = 0; j < scores.size(); ++j)
    EXPECT_TRUE(close(got[j], want[j])) << "p[" << j << "] " << got[j] << " vs " << want[j];
}

TEST_F(KernelAvx2, SoftmaxBlockMatchesTheScalarBlock) {
  std::mt19937_64 rng(23);
  for (size_t n : {1u, 7u, 8u, 9u, 16u, 23u}) {
    for (float spread : {0.5f, 5.0f, 40.0f}) {
      const std::vector<float> s = test::random_normal(rng, n, spread);
      expect_same_softmax(SoftmaxStats{}, s);                      // empty state: corr = 0
      expect_same_softmax(SoftmaxStats{spread * 3.0f, 2.5f}, s);   // the old max stays
      expect_same_softmax(SoftmaxStats{-spread * 3.0f, 7.0f}, s);  // a new max
    }
  }
  const float inf = INFINITY;
  const float nan = std::nanf("");
  // Scores far below the max: exps that underflow.
  expect_same_softmax(SoftmaxStats{},
                      {0.0f, -80.0f, -87.0f, -88.0f, -100.0f, -inf, 1.0f, 2.0f, 3.0f});
  // A block of −inf scores carries no weight; a NaN score makes the state NaN.
  expect_same_softmax(SoftmaxStats{1.0f, 2.0f}, std::vector<float>(9, -inf));
  expect_same_softmax(SoftmaxStats{}, std::vector<float>(9, -inf));
  expect_same_softmax(SoftmaxStats{1.0f, 2.0f},
                      {0.5f, nan, 2.0f, -1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f});
  expect_same_softmax(SoftmaxStats{}, {-inf, nan, -inf});
}

TEST_F(KernelAvx2, SoftmaxExpsAreAccurate) {
  // With the block max at 0, p_j = exp(s_j): compare with fp64 over the range that matters.
  std::vector<float> s;
  for (float x = -87.0f; x <= 0.0f; x += 0.0137f)
    s.push_back(x);
  s.push_back(0.0f);
  SoftmaxStats st;
  std::vector<float> p = s;
  avx2::softmax_block_scores(st, p.data(), static_cast<uint32_t>(p.size()));
  EXPECT_EQ(st.m, 0.0f);
  double worst = 0.0;
  for (size_t j = 0; j < s.size(); ++j) {
    const double ref = std::exp(double{s[j]});
    worst = std::max(worst, std::fabs(double{p[j]} - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7) << "largest relative error of the vector exp";
}

TEST(KernelAvx2Dispatch, ForcedAvx2IsCheckedBeforeAnythingRuns) {
  const Geometry g{1, 1, 20, 16, KvDtype::bf16};  // head_dim 20: not a multiple of 8
  std::vector<std::byte> pool(page_data_bytes(g));
  const std::vector<float> q(20, 1.0f);
  std::vector<float> out(20, 7.0f);
  const PageId table[1] = {0};
  const uint32_t ctx[1] = {3};
  DecodeArgs a;
  a.kv = PagedKv{pool.data(), page_data_bytes(g), nullptr, g};
  a.num_seqs = 1;
  a.num_q_heads = 1;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = table;
  a.block_table_stride = 1;
  a.context_lens = ctx;
  const std::string e = cpu::decode(a, 1, 1, cpu::Isa::avx2);
  EXPECT_NE(e.find("avx2"), std::string::npos) << e;
  for (float x : out)
    EXPECT_EQ(x, 7.0f);
  // automatic falls back to the baseline loops for this head dim.
  EXPECT_EQ(cpu::decode(a, 1, 1, cpu::Isa::automatic), "");
}

#endif

}  // namespace
}  // namespace kvpool::kernels

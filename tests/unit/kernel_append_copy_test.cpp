// cpu::append_kv and cpu::copy_pages against the page layout of common/geometry.h.
//
// Pools are host vectors filled with a sentinel (and, for 8-bit pools, stale scales), so that any
// byte a kernel should not have touched is caught by comparing the whole pool with the expected
// image. 16-bit appends are checked code for code; 8-bit appends by the scale rules of
// kernels/paged_kv.h and by dequantised values within half a quantisation step.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/geometry.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"

namespace kvpool::kernels {
namespace {

constexpr uint8_t kSentinel = 0xA5;
constexpr float kStaleScale = 1e6f;  // what a previous owner of a page might have left
constexpr KvDtype kAllDtypes[] = {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8};
constexpr KvDtype k8BitDtypes[] = {KvDtype::fp8_e4m3, KvDtype::int8};

std::vector<Geometry> geometries(KvDtype dt) {
  return {Geometry{2, 2, 8, 4, dt}, Geometry{3, 1, 64, 16, dt}, Geometry{1, 4, 16, 1, dt},
          Geometry{2, 3, 5, 3, dt}, Geometry{1, 2, 128, 8, dt}};
}

std::string describe(const Geometry& g) {
  return "L=" + std::to_string(g.layers) + " H=" + std::to_string(g.kv_heads) +
         " D=" + std::to_string(g.head_dim) + " T=" + std::to_string(g.tokens_per_page) + " " +
         std::string(dtype_name(g.dtype));
}

float range_of(KvDtype dt) {
  return dt == KvDtype::int8 ? kInt8Max : kFp8Max;
}

struct Pool {
  Geometry g;
  uint32_t num_pages;
  uint64_t stride;
  std::vector<uint8_t> bytes;
  std::vector<float> scales;

  Pool(const Geometry& geo, uint32_t pages)
      : g(geo),
        num_pages(pages),
        stride(page_data_bytes(geo) + 24),  // padding between pages must stay untouched
        bytes(pages * stride, kSentinel),
        scales(pages * page_scale_bytes(geo) / sizeof(float), kStaleScale) {}

  PagedKv kv() {
    return PagedKv{bytes.data(), stride, scales.empty() ? nullptr : scales.data(), g};
  }
  // Byte index of element (page, layer, head, offset, dim) of K or V.
  uint64_t at(uint64_t page, uint32_t layer, uint32_t head, uint32_t off, uint32_t d,
              bool is_v) const {
    const uint64_t e =
        is_v ? page_v_offset(g, layer, head, off, d) : page_k_offset(g, layer, head, off, d);
    return page * stride + e * dtype_bytes(g.dtype);
  }
  float& scale(uint64_t page, uint32_t layer, uint32_t head, bool is_v) {
    return scales[((page * g.layers + layer) * g.kv_heads + head) * 2 + (is_v ? 1 : 0)];
  }
  // The value an element stands for (dequantised with its page's scale for 8-bit pools).
  float value(uint64_t page, uint32_t layer, uint32_t head, uint32_t off, uint32_t d, bool is_v) {
    const uint64_t i = at(page, layer, head, off, d, is_v);
    switch (g.dtype) {
      case KvDtype::fp16:
      case KvDtype::bf16: {
        uint16_t c;
        std::memcpy(&c, &bytes[i], 2);
        return g.dtype == KvDtype::fp16 ? fp16_to_f32(c) : bf16_to_f32(c);
      }
      case KvDtype::fp8_e4m3:
        return fp8_e4m3_to_f32(bytes[i]) * scale(page, layer, head, is_v);
      case KvDtype::int8:
        return int8_to_f32(static_cast<int8_t>(bytes[i])) * scale(page, layer, head, is_v);
    }
    return 0.0f;
  }
};

// The bytes of pages [first, last) of a pool, padding included.
std::vector<uint8_t> pages_of(const Pool& pool, uint64_t first, uint64_t last) {
  const auto* b = pool.bytes.data();
  return std::vector<uint8_t>(b + first * pool.stride, b + last * pool.stride);
}

// K and V rows of n tokens, [n][kv_heads][head_dim] each.
struct Tokens {
  std::vector<float> k, v;
  std::vector<int64_t> slots;
  uint32_t row(uint32_t token, uint32_t head, uint32_t d, const Geometry& g) const {
    return (token * g.kv_heads + head) * g.head_dim + d;
  }
};

Tokens random_tokens(const Geometry& g, std::vector<int64_t> slots, std::mt19937& rng,
                     float magnitude = 1.0f) {
  Tokens t;
  const size_t n = slots.size() * g.kv_heads * g.head_dim;
  std::normal_distribution<float> dist(0.0f, magnitude);
  t.k.resize(n);
  t.v.resize(n);
  for (float& x : t.k)
    x = dist(rng);
  for (float& x : t.v)
    x = dist(rng);
  t.slots = std::move(slots);
  return t;
}

AppendArgs append_args(Pool& p, uint32_t layer, const Tokens& t) {
  AppendArgs a;
  a.kv = p.kv();
  a.layer = layer;
  a.num_tokens = static_cast<uint32_t>(t.slots.size());
  a.k = t.k.data();
  a.v = t.v.data();
  a.slots = t.slots.data();
  return a;
}

::testing::AssertionResult same_bytes(const std::vector<uint8_t>& got,
                                      const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure() << "first difference at byte " << i << ": "
                                           << int{got[i]} << " instead of " << int{want[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_floats(const std::vector<float>& got,
                                       const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at scale " << i << ": " << got[i] << " instead of " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Half a quantisation step around x (in x's units) for an 8-bit pool with this scale, plus
// slack for the float rounding of x · (1 / scale).
float half_step(KvDtype dt, float x, float scale) {
  float h;
  if (dt == KvDtype::int8) {
    h = 0.5f * scale;
  } else {
    const float y = std::fabs(x) / scale;
    const float step = y < 0.015625f ? 0.001953125f : std::exp2(std::floor(std::log2(y)) - 3.0f);
    h = 0.5f * step * scale;
  }
  return h * (1.0f + 1e-5f) + std::fabs(x) * 1e-6f;
}

// Slots: every slot of pages {1, 3} plus a few of page 4 (in page 4, offsets 0..T/2), shuffled,
// with −1 entries mixed in.
std::vector<int64_t> scattered_slots(const Geometry& g, std::mt19937& rng) {
  const int64_t t = g.tokens_per_page;
  std::vector<int64_t> s;
  for (int64_t page : {1, 3}) {
    for (int64_t o = 0; o < t; ++o)
      s.push_back(page * t + o);
  }
  for (int64_t o = 0; o <= t / 2; ++o)
    s.push_back(4 * t + o);
  s.push_back(-1);
  s.push_back(-1);
  std::shuffle(s.begin(), s.end(), rng);
  return s;
}

// append: 16-bit ---------------------------------------------------------------------------------

TEST(AppendKv, WritesConvertedRowsIntoTheirSlots16Bit) {
  std::mt19937 rng(7);
  for (KvDtype dt : {KvDtype::fp16, KvDtype::bf16}) {
    for (const Geometry& g : geometries(dt)) {
      SCOPED_TRACE(describe(g));
      Pool pool(g, 6);
      const uint32_t layer = g.layers > 1 ? 1 : 0;
      const Tokens t = random_tokens(g, scattered_slots(g, rng), rng, 3.0f);
      ASSERT_EQ(cpu::append_kv(append_args(pool, layer, t), pool.num_pages), "");

      std::vector<uint8_t> want(pool.bytes.size(), kSentinel);
      for (uint32_t i = 0; i < t.slots.size(); ++i) {
        if (t.slots[i] < 0) continue;
        const auto page = static_cast<uint64_t>(t.slots[i]) / g.tokens_per_page;
        const auto off = static_cast<uint32_t>(t.slots[i] % g.tokens_per_page);
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            for (bool is_v : {false, true}) {
              const float x = (is_v ? t.v : t.k)[t.row(i, h, d, g)];
              const uint16_t c = dt == KvDtype::fp16 ? f32_to_fp16(x) : f32_to_bf16(x);
              std::memcpy(&want[pool.at(page, layer, h, off, d, is_v)], &c, 2);
            }
          }
        }
      }
      // Also covers: skipped slots, other layers, other pages and the padding stay sentinel.
      EXPECT_TRUE(same_bytes(pool.bytes, want));
    }
  }
}

TEST(AppendKv, SkippedSlotsAndOtherLayersStayUntouched) {
  std::mt19937 rng(8);
  for (KvDtype dt : kAllDtypes) {
    const Geometry g{3, 2, 16, 4, dt};
    SCOPED_TRACE(describe(g));
    Pool pool(g, 3);
    const Tokens t = random_tokens(g, {-1, -1, -1}, rng);
    ASSERT_EQ(cpu::append_kv(append_args(pool, 1, t), pool.num_pages), "");
    EXPECT_TRUE(same_bytes(pool.bytes, std::vector<uint8_t>(pool.bytes.size(), kSentinel)));
    EXPECT_TRUE(same_floats(pool.scales, std::vector<float>(pool.scales.size(), kStaleScale)));

    // One real token in layer 1: only layer 1's rows of that slot (and its scales) change.
    const Tokens one = random_tokens(g, {-1, 5, -1}, rng);
    ASSERT_EQ(cpu::append_kv(append_args(pool, 1, one), pool.num_pages), "");
    for (uint64_t i = 0; i < pool.bytes.size(); ++i) {
      const uint64_t page = i / pool.stride;
      bool in_row = false;
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (bool is_v : {false, true}) {
          const uint64_t row = pool.at(1, 1, h, 1, 0, is_v);
          in_row |= page == 1 && i >= row && i < row + uint64_t{g.head_dim} * dtype_bytes(dt);
        }
      }
      if (!in_row) {
        ASSERT_EQ(pool.bytes[i], kSentinel) << "byte " << i;
      }
    }
    for (uint64_t i = 0; i < pool.scales.size(); ++i) {
      const bool mine = i / (2 * g.kv_heads) == 1 * g.layers + 1;  // page 1, layer 1
      if (!mine) {
        ASSERT_EQ(pool.scales[i], kStaleScale) << "scale " << i;
      }
    }
  }
}

// append: 8-bit ----------------------------------------------------------------------------------

TEST(AppendKv, QuantisedValuesWithinHalfAStep) {
  std::mt19937 rng(9);
  for (KvDtype dt : k8BitDtypes) {
    for (const Geometry& g : geometries(dt)) {
      SCOPED_TRACE(describe(g));
      Pool pool(g, 6);
      const uint32_t layer = g.layers - 1;
      Tokens t = random_tokens(g, scattered_slots(g, rng), rng, 2.0f);
      // Make each page's offset-0 token the largest, so no scale is raised within the call and
      // every row is quantised once with the page's final scale.
      for (uint32_t i = 0; i < t.slots.size(); ++i) {
        if (t.slots[i] >= 0 && t.slots[i] % g.tokens_per_page == 0) {
          for (uint32_t h = 0; h < g.kv_heads; ++h) {
            t.k[t.row(i, h, 0, g)] = 100.0f;
            t.v[t.row(i, h, g.head_dim - 1, g)] = -50.0f;
          }
        }
      }
      ASSERT_EQ(cpu::append_kv(append_args(pool, layer, t), pool.num_pages), "");
      for (uint64_t page : {1u, 3u, 4u}) {
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          EXPECT_EQ(pool.scale(page, layer, h, false), 100.0f / range_of(dt));
          EXPECT_EQ(pool.scale(page, layer, h, true), 50.0f / range_of(dt));
        }
      }
      for (uint32_t i = 0; i < t.slots.size(); ++i) {
        if (t.slots[i] < 0) continue;
        const auto page = static_cast<uint64_t>(t.slots[i]) / g.tokens_per_page;
        const auto off = static_cast<uint32_t>(t.slots[i] % g.tokens_per_page);
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            for (bool is_v : {false, true}) {
              const float x = (is_v ? t.v : t.k)[t.row(i, h, d, g)];
              const float got = pool.value(page, layer, h, off, d, is_v);
              ASSERT_NEAR(got, x, half_step(dt, x, pool.scale(page, layer, h, is_v)))
                  << "token " << i << " head " << h << " dim " << d << (is_v ? " V" : " K");
            }
          }
        }
      }
      // Untouched: page 0, 2, 5 entirely, and page 4 beyond offset T/2.
      for (uint64_t page : {0u, 2u, 5u}) {
        for (uint64_t b = 0; b < pool.stride; ++b) {
          ASSERT_EQ(pool.bytes[page * pool.stride + b], kSentinel) << "page " << page;
        }
      }
      for (uint32_t off = g.tokens_per_page / 2 + 1; off < g.tokens_per_page; ++off) {
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          for (bool is_v : {false, true}) {
            ASSERT_EQ(pool.bytes[pool.at(4, layer, h, off, 0, is_v)], kSentinel);
          }
        }
      }
    }
  }
}

// Fills a K or V row with values in [−amax, amax] whose largest magnitude is exactly amax.
void fill_row(std::vector<float>& rows, uint32_t first, uint32_t n, float amax, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-amax, amax);
  for (uint32_t d = 0; d < n; ++d)
    rows[first + d] = u(rng);
  rows[first + n / 2] = -amax;
}

TEST(AppendKv, OffsetZeroSetsTheScaleIgnoringAStaleOne) {
  std::mt19937 rng(10);
  for (KvDtype dt : k8BitDtypes) {
    const Geometry g{2, 2, 32, 4, dt};
    SCOPED_TRACE(describe(g));
    for (float stale : {kStaleScale, 1e-9f, 0.0f, -3.0f, std::numeric_limits<float>::quiet_NaN()}) {
      Pool pool(g, 3);
      std::fill(pool.scales.begin(), pool.scales.end(), stale);
      Tokens t = random_tokens(g, {2 * 4 + 0}, rng);
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        fill_row(t.k, t.row(0, h, 0, g), g.head_dim, 0.75f + static_cast<float>(h), rng);
        fill_row(t.v, t.row(0, h, 0, g), g.head_dim, 3.0f, rng);
      }
      ASSERT_EQ(cpu::append_kv(append_args(pool, 1, t), pool.num_pages), "");
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        EXPECT_EQ(pool.scale(2, 1, h, false), (0.75f + static_cast<float>(h)) / range_of(dt));
        EXPECT_EQ(pool.scale(2, 1, h, true), 3.0f / range_of(dt));
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          for (bool is_v : {false, true}) {
            const float x = (is_v ? t.v : t.k)[t.row(0, h, d, g)];
            ASSERT_NEAR(pool.value(2, 1, h, 0, d, is_v), x,
                        half_step(dt, x, pool.scale(2, 1, h, is_v)));
          }
        }
        // Layer 0's scales of the page are not this call's business.
        EXPECT_TRUE(std::memcmp(&pool.scale(2, 0, h, false), &stale, sizeof(float)) == 0);
      }
    }
  }
}

TEST(AppendKv, LargerLaterTokenRaisesTheScaleAndRequantises) {
  std::mt19937 rng(11);
  for (KvDtype dt : k8BitDtypes) {
    const Geometry g{1, 2, 64, 8, dt};
    SCOPED_TRACE(describe(g));
    const float r = range_of(dt);
    Pool pool(g, 4);
    const int64_t page = 3;
    Tokens t0 = random_tokens(g, {page * 8 + 0}, rng);
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      fill_row(t0.k, t0.row(0, h, 0, g), g.head_dim, 1.0f, rng);
      fill_row(t0.v, t0.row(0, h, 0, g), g.head_dim, 1.0f, rng);
    }
    ASSERT_EQ(cpu::append_kv(append_args(pool, 0, t0), pool.num_pages), "");
    const float old_scale = 1.0f / r;
    ASSERT_EQ(pool.scale(page, 0, 0, false), old_scale);
    const std::vector<uint8_t> before = pool.bytes;

    // Token 1: K of head 0 is 4× larger; head 1's K and every V stay within the old range.
    Tokens t1 = random_tokens(g, {page * 8 + 1}, rng);
    fill_row(t1.k, t1.row(0, 0, 0, g), g.head_dim, 4.0f, rng);
    fill_row(t1.k, t1.row(0, 1, 0, g), g.head_dim, 0.5f, rng);
    for (uint32_t h = 0; h < g.kv_heads; ++h) {
      fill_row(t1.v, t1.row(0, h, 0, g), g.head_dim, 1.0f, rng);
    }
    ASSERT_EQ(cpu::append_kv(append_args(pool, 0, t1), pool.num_pages), "");
    const float new_scale = 4.0f / r;
    EXPECT_EQ(pool.scale(page, 0, 0, false), new_scale);
    EXPECT_EQ(pool.scale(page, 0, 1, false), old_scale);
    EXPECT_EQ(pool.scale(page, 0, 0, true), old_scale);
    EXPECT_EQ(pool.scale(page, 0, 1, true), old_scale);

    bool requantised = false;
    for (uint32_t d = 0; d < g.head_dim; ++d) {
      // Token 0's K of head 0 went through two roundings: old half step + new half step.
      const float x0 = t0.k[t0.row(0, 0, d, g)];
      const float h0 = half_step(dt, x0, old_scale);
      const float tol0 = h0 + half_step(dt, std::fabs(x0) + h0, new_scale);
      ASSERT_NEAR(pool.value(page, 0, 0, 0, d, false), x0, tol0) << d;
      requantised |=
          pool.bytes[pool.at(page, 0, 0, 0, d, false)] != before[pool.at(page, 0, 0, 0, d, false)];
      const float x1 = t1.k[t1.row(0, 0, d, g)];
      ASSERT_NEAR(pool.value(page, 0, 0, 1, d, false), x1, half_step(dt, x1, new_scale)) << d;
      // Rows whose scale did not change keep their bytes and stay within half a step.
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (bool is_v : {false, true}) {
          if (h == 0 && !is_v) continue;
          const uint64_t i = pool.at(page, 0, h, 0, d, is_v);
          ASSERT_EQ(pool.bytes[i], before[i]);
          const float x = (is_v ? t1.v : t1.k)[t1.row(0, h, d, g)];
          ASSERT_NEAR(pool.value(page, 0, h, 1, d, is_v), x, half_step(dt, x, old_scale));
        }
      }
    }
    EXPECT_TRUE(requantised);
  }
}

TEST(AppendKv, ZeroRowsGetAPositiveScale) {
  std::mt19937 rng(12);
  for (KvDtype dt : k8BitDtypes) {
    const Geometry g{1, 1, 16, 4, dt};
    SCOPED_TRACE(describe(g));
    Pool pool(g, 2);
    Tokens t0 = random_tokens(g, {4}, rng);
    std::fill(t0.k.begin(), t0.k.end(), 0.0f);
    std::fill(t0.v.begin(), t0.v.end(), -0.0f);
    ASSERT_EQ(cpu::append_kv(append_args(pool, 0, t0), pool.num_pages), "");
    for (bool is_v : {false, true}) {
      const float s = pool.scale(1, 0, 0, is_v);
      EXPECT_TRUE(std::isfinite(s) && s > 0.0f) << s;
      EXPECT_TRUE(std::isfinite(1.0f / s));
      for (uint32_t d = 0; d < g.head_dim; ++d)
        EXPECT_EQ(pool.value(1, 0, 0, 0, d, is_v), 0.0f);
    }
    // A later real token raises the scale; the zero row stays zero.
    const Tokens t1 = random_tokens(g, {5}, rng);
    ASSERT_EQ(cpu::append_kv(append_args(pool, 0, t1), pool.num_pages), "");
    for (bool is_v : {false, true}) {
      const float s = pool.scale(1, 0, 0, is_v);
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        EXPECT_EQ(pool.value(1, 0, 0, 0, d, is_v), 0.0f);
        const float x = (is_v ? t1.v : t1.k)[d];
        EXPECT_NEAR(pool.value(1, 0, 0, 1, d, is_v), x, half_step(dt, x, s));
      }
    }
  }
}

// One call holding several tokens of a page, in any order, equals one call per token in slot
// order (the rules apply in slot order within a page); for every dtype.
TEST(AppendKv, OneCallEqualsTokenByTokenInSlotOrder) {
  std::mt19937 rng(13);
  for (KvDtype dt : kAllDtypes) {
    for (const Geometry& g : geometries(dt)) {
      SCOPED_TRACE(describe(g));
      Pool together(g, 6);
      Pool apart(g, 6);
      const uint32_t layer = g.layers - 1;
      Tokens t = random_tokens(g, scattered_slots(g, rng), rng);
      // Magnitudes growing with the offset, so 8-bit pages raise their scales along the way.
      for (uint32_t i = 0; i < t.slots.size(); ++i) {
        const float grow = 1.0f + static_cast<float>(t.slots[i] < 0 ? 0 : t.slots[i] % 7);
        for (uint32_t e = 0; e < g.kv_heads * g.head_dim; ++e) {
          t.k[i * g.kv_heads * g.head_dim + e] *= grow;
          t.v[i * g.kv_heads * g.head_dim + e] *= 8.0f - grow;
        }
      }
      ASSERT_EQ(cpu::append_kv(append_args(together, layer, t), together.num_pages), "");

      std::vector<uint32_t> order(t.slots.size());
      for (uint32_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](uint32_t a, uint32_t b) { return t.slots[a] < t.slots[b]; });
      const uint32_t per_token = g.kv_heads * g.head_dim;
      for (uint32_t i : order) {
        Tokens one;
        one.k.assign(t.k.begin() + i * per_token, t.k.begin() + (i + 1) * per_token);
        one.v.assign(t.v.begin() + i * per_token, t.v.begin() + (i + 1) * per_token);
        one.slots = {t.slots[i]};
        ASSERT_EQ(cpu::append_kv(append_args(apart, layer, one), apart.num_pages), "");
      }
      EXPECT_TRUE(same_bytes(together.bytes, apart.bytes));
      EXPECT_TRUE(same_floats(together.scales, apart.scales));
    }
  }
}

// append: validation ----------------------------------------------------------------------------

TEST(AppendKv, RejectsBadArgumentsAndChangesNothing) {
  std::mt19937 rng(14);
  for (KvDtype dt : kAllDtypes) {
    const Geometry g{2, 2, 8, 4, dt};
    SCOPED_TRACE(describe(g));
    Pool pool(g, 3);  // 12 slots
    const std::vector<uint8_t> bytes0 = pool.bytes;
    const std::vector<float> scales0 = pool.scales;
    auto unchanged = [&] {
      EXPECT_TRUE(same_bytes(pool.bytes, bytes0));
      EXPECT_TRUE(same_floats(pool.scales, scales0));
    };
    // Each case: slots, and a piece the error must name.
    struct Case {
      std::vector<int64_t> slots;
      std::string names;
    };
    for (const Case& c :
         {Case{{0, 12}, "slot 12"}, Case{{0, 1, -2}, "slot -2"}, Case{{3, 99999999999}, "token 1"},
          Case{{5, 6, 5}, "slot 5"}, Case{{0, std::numeric_limits<int64_t>::min()}, "token 1"}}) {
      const Tokens t = random_tokens(g, c.slots, rng);
      const std::string err = cpu::append_kv(append_args(pool, 0, t), pool.num_pages);
      EXPECT_NE(err.find(c.names), std::string::npos) << err;
      unchanged();
    }
    const Tokens t = random_tokens(g, {0, 1}, rng);
    AppendArgs a = append_args(pool, 2, t);
    std::string err = cpu::append_kv(a, pool.num_pages);
    EXPECT_NE(err.find("layer 2"), std::string::npos) << err;
    a = append_args(pool, 0, t);
    a.k = nullptr;
    EXPECT_NE(cpu::append_kv(a, pool.num_pages), "");
    a = append_args(pool, 0, t);
    a.slots = nullptr;
    EXPECT_NE(cpu::append_kv(a, pool.num_pages), "");
    a = append_args(pool, 0, t);
    a.kv.page_stride = page_data_bytes(g) - 1;
    EXPECT_NE(cpu::append_kv(a, pool.num_pages), "");
    a = append_args(pool, 0, t);
    a.kv.geometry.head_dim = 0;
    EXPECT_NE(cpu::append_kv(a, pool.num_pages), "");
    if (dtype_is_quantized(dt)) {
      a = append_args(pool, 0, t);
      a.kv.scales = nullptr;
      err = cpu::append_kv(a, pool.num_pages);
      EXPECT_NE(err.find("scales"), std::string::npos) << err;
    }
    // The slot bound follows num_pages, not the buffer.
    a = append_args(pool, 0, t);
    EXPECT_NE(cpu::append_kv(a, 0), "");
    unchanged();
    // Nothing to do is fine.
    a.num_tokens = 0;
    EXPECT_EQ(cpu::append_kv(a, pool.num_pages), "");
    unchanged();
  }
}

// copy_pages ------------------------------------------------------------------------------------

void randomise(Pool& pool, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : pool.bytes)
    b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> sc(0.001f, 1.0f);
  for (float& s : pool.scales)
    s = sc(rng);
}

CopyPagesArgs copy_args(Pool& pool, const std::vector<PageId>& src,
                        const std::vector<PageId>& dst) {
  CopyPagesArgs a;
  a.kv = pool.kv();
  a.num_pairs = static_cast<uint32_t>(src.size());
  a.src = src.data();
  a.dst = dst.data();
  return a;
}

TEST(CopyPages, CopiesPageBytesAndScales) {
  std::mt19937 rng(20);
  for (KvDtype dt : kAllDtypes) {
    for (const Geometry& g : geometries(dt)) {
      SCOPED_TRACE(describe(g));
      Pool pool(g, 8);
      randomise(pool, rng);
      const Pool before = pool;
      // Page 1 fans out to two pages (copy-on-write of a shared page).
      const std::vector<PageId> src{1, 1, 2, 7};
      const std::vector<PageId> dst{4, 6, 0, 3};
      ASSERT_EQ(cpu::copy_pages(copy_args(pool, src, dst), pool.num_pages), "");
      const uint64_t data = page_data_bytes(g);
      const uint64_t nscales = page_scale_bytes(g) / sizeof(float);
      for (PageId p = 0; p < pool.num_pages; ++p) {
        const auto it = std::find(dst.begin(), dst.end(), p);
        const PageId from = it == dst.end() ? p : src[static_cast<size_t>(it - dst.begin())];
        ASSERT_EQ(
            std::memcmp(&pool.bytes[p * pool.stride], &before.bytes[from * pool.stride], data), 0)
            << "page " << p;
        for (uint64_t i = 0; i < nscales; ++i) {
          ASSERT_EQ(pool.scales[p * nscales + i], before.scales[from * nscales + i])
              << "page " << p << " scale " << i;
        }
      }
      EXPECT_TRUE(same_bytes(pages_of(pool, 1, 3), pages_of(before, 1, 3)))
          << "sources 1 and 2 must not change";
    }
  }
}

TEST(CopyPages, CopiedPageDecodesLikeItsSourceAndDivergesIndependently) {
  std::mt19937 rng(21);
  for (KvDtype dt : kAllDtypes) {
    const Geometry g{2, 2, 16, 4, dt};
    SCOPED_TRACE(describe(g));
    Pool pool(g, 4);
    const Tokens t = random_tokens(g, {4, 5}, rng);  // page 1, offsets 0 and 1
    ASSERT_EQ(cpu::append_kv(append_args(pool, 1, t), pool.num_pages), "");
    const std::vector<PageId> src{1}, dst{2};
    ASSERT_EQ(cpu::copy_pages(copy_args(pool, src, dst), pool.num_pages), "");
    for (uint32_t off = 0; off < 2; ++off) {
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t d = 0; d < g.head_dim; ++d) {
          for (bool is_v : {false, true}) {
            ASSERT_EQ(pool.value(2, 1, h, off, d, is_v), pool.value(1, 1, h, off, d, is_v));
          }
        }
      }
    }
    // Appending to the copy (a larger token, so 8-bit pages re-quantise) leaves the source alone.
    const std::vector<uint8_t> source = pages_of(pool, 1, 2);
    const Tokens more = random_tokens(g, {2 * 4 + 2}, rng, 10.0f);
    ASSERT_EQ(cpu::append_kv(append_args(pool, 1, more), pool.num_pages), "");
    EXPECT_TRUE(same_bytes(pages_of(pool, 1, 2), source));
  }
}

TEST(CopyPages, RejectsBadPairsAndChangesNothing) {
  std::mt19937 rng(22);
  for (KvDtype dt : kAllDtypes) {
    const Geometry g{2, 2, 8, 4, dt};
    SCOPED_TRACE(describe(g));
    Pool pool(g, 6);
    randomise(pool, rng);
    const std::vector<uint8_t> bytes0 = pool.bytes;
    const std::vector<float> scales0 = pool.scales;
    struct Case {
      std::vector<PageId> src, dst;
      std::string names;
    };
    for (const Case& c : {
             Case{{0, 6}, {1, 2}, "source page 6"},       // source out of range
             Case{{0, 1}, {2, 6}, "destination page 6"},  // destination out of range
             Case{{0, kNoPage}, {1, 2}, "pair 1"},        // the "no page" id
             Case{{3}, {3}, "page 3"},                    // a page onto itself
             Case{{0, 1}, {1, 2}, "page 1"},              // 1 is source and destination
             Case{{0, 4, 5}, {2, 3, 0}, "page 0"},        // the same, other way round
             Case{{0, 1, 4}, {2, 3, 2}, "page 2"},        // two copies into page 2
         }) {
      const std::string err = cpu::copy_pages(copy_args(pool, c.src, c.dst), pool.num_pages);
      EXPECT_NE(err.find(c.names), std::string::npos) << "'" << err << "' should name " << c.names;
      EXPECT_TRUE(same_bytes(pool.bytes, bytes0));
      EXPECT_TRUE(same_floats(pool.scales, scales0));
    }
    const std::vector<PageId> src{0}, dst{1};
    CopyPagesArgs a = copy_args(pool, src, dst);
    a.dst = nullptr;
    EXPECT_NE(cpu::copy_pages(a, pool.num_pages), "");
    a = copy_args(pool, src, dst);
    a.kv.page_stride = page_data_bytes(g) - 1;
    EXPECT_NE(cpu::copy_pages(a, pool.num_pages), "");
    if (dtype_is_quantized(dt)) {
      a = copy_args(pool, src, dst);
      a.kv.scales = nullptr;
      EXPECT_NE(cpu::copy_pages(a, pool.num_pages), "");
    }
    EXPECT_NE(cpu::copy_pages(copy_args(pool, src, dst), 1), "");  // page 1 ≥ num_pages = 1
    EXPECT_TRUE(same_bytes(pool.bytes, bytes0));
    EXPECT_TRUE(same_floats(pool.scales, scales0));
    a = copy_args(pool, src, dst);
    a.num_pairs = 0;
    EXPECT_EQ(cpu::copy_pages(a, pool.num_pages), "");
    EXPECT_TRUE(same_bytes(pool.bytes, bytes0));
  }
}

}  // namespace
}  // namespace kvpool::kernels

// kvpool GPU check: the CUDA kernels against the CPU kernels on the same pools (page_major and
// layer_major), then the decode bandwidth table. Built by CMake when nvcc is present (ctest label gpu; exits 77, "skipped",
// without a GPU) or by tests/gpu/run.sh with nvcc alone on a GPU machine.
//
//   kvpool_gpu_check            tests, then the benchmark table
//   kvpool_gpu_check --tests    tests only
//   kvpool_gpu_check --bench    benchmark only

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"

namespace {

using namespace kvpool;
using namespace kvpool::kernels;

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

template <typename T>
T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
  if (!v.empty()) CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// A host pool with its pages filled through cpu::append_kv, and its device copy.
struct Pool {
  Geometry g;
  uint32_t num_pages = 0;
  uint64_t stride = 0;
  std::vector<std::byte> mem;
  std::vector<float> scales;
  KvLayout layout = KvLayout::page_major;
  PagedKv host() {
    return PagedKv{mem.data(), stride, scales.empty() ? nullptr : scales.data(), g, layout,
                   num_pages};
  }
};

struct Case {
  KvDtype dtype;
  uint32_t head_dim;
  uint32_t group;
  uint32_t tpp;
  std::vector<uint32_t> contexts;
  std::vector<uint32_t> splits;  // decode split_tokens to run: 0 = planned, 1 << 20 = no split
  KvLayout layout = KvLayout::page_major;
};

int failures = 0;

void expect_close(const char* what, const Case& c, uint32_t detail, const std::vector<float>& got,
                  const std::vector<float>& want) {
  double worst = 0;
  double scale = 1e-6;
  for (float w : want)
    scale = std::max(scale, double(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
  }
  // fp32 accumulation on both sides in a different order: a few ulps of the output range.
  const bool ok = worst <= 2e-5 * scale + 1e-6;
  if (!ok) ++failures;
  std::printf("%-7s %-11s %-9s D=%-3u group=%u T=%-2u seqs=%zu %s=%-7u max|err|=%.2e  %s\n", what,
              std::string(layout_name(c.layout)).c_str(),
              std::string(dtype_name(c.dtype)).c_str(), c.head_dim, c.group, c.tpp,
              c.contexts.size(), what[0] == 'd' ? "split" : "new", detail, worst,
              ok ? "ok" : "FAILED");
}

// A stored element that is not a number (int8 has none: −128), for the slots no token uses.
uint16_t nan_bits(KvDtype d) {
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

template <typename T>
void free_all(std::initializer_list<T*> ptrs) {
  for (T* ptr : ptrs) {
    if (ptr) cudaFree(ptr);
  }
}

// One pool (layer 1 of 2; layer 0, unused slots and unused pages' scales hold NaN) holding the
// case's sequences on scattered pages; decode for every split of the case and extend with a
// cached prefix (the last min(ctx, 5) tokens new) and without one (every token new where ctx ≤
// 300, else the last 70), each against the CPU kernels on the same pool.
void run_case(const Case& c, std::mt19937& rng, int sm_count) {
  const uint32_t kv_heads = 2;
  const uint32_t layer = 1;
  const uint32_t q_heads = kv_heads * c.group;
  const Geometry g{2, kv_heads, c.head_dim, c.tpp, c.dtype};
  uint32_t blocks = 0;
  uint32_t max_ctx = 0;
  for (uint32_t ctx : c.contexts) {
    blocks = std::max(blocks, (ctx + c.tpp - 1) / c.tpp);
    max_ctx = std::max(max_ctx, ctx);
  }
  const auto nseq = static_cast<uint32_t>(c.contexts.size());
  Pool p;
  p.g = g;
  p.layout = c.layout;
  p.num_pages = blocks * nseq * 2;
  p.stride = page_data_bytes(g);
  p.mem.resize(p.num_pages * p.stride);
  const uint16_t nan = nan_bits(g.dtype);
  for (size_t i = 0; i < p.mem.size(); i += dtype_bytes(g.dtype))
    std::memcpy(&p.mem[i], &nan, dtype_bytes(g.dtype));
  if (dtype_is_quantized(g.dtype)) p.scales.assign(p.num_pages * 2 * 2 * kv_heads, std::nanf(""));
  std::vector<PageId> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<PageId> tables(size_t(nseq) * blocks);
  for (size_t i = 0; i < tables.size(); ++i)
    tables[i] = perm[i];
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Fill every sequence's tokens through the CPU append, in order.
  for (uint32_t s = 0; s < nseq; ++s) {
    for (uint32_t t = 0; t < c.contexts[s]; ++t) {
      std::vector<float> k(kv_heads * c.head_dim), v(k.size());
      for (auto& x : k)
        x = nd(rng);
      for (auto& x : v)
        x = nd(rng);
      const int64_t slot = int64_t(tables[s * blocks + t / c.tpp]) * c.tpp + t % c.tpp;
      AppendArgs a{p.host(), layer, 1, k.data(), v.data(), &slot};
      if (const std::string e = cpu::append_kv(a, p.num_pages); !e.empty()) {
        std::fprintf(stderr, "append: %s\n", e.c_str());
        std::exit(1);
      }
    }
  }
  std::vector<float> q(size_t(nseq) * q_heads * c.head_dim);
  for (auto& x : q)
    x = nd(rng);
  std::vector<float> want(q.size()), got(q.size());
  DecodeArgs a;
  a.kv = p.host();
  a.layer = layer;
  a.num_seqs = nseq;
  a.num_q_heads = q_heads;
  a.q = q.data();
  a.out = want.data();
  a.block_tables = tables.data();
  a.block_table_stride = blocks;
  a.context_lens = c.contexts.data();
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  if (const std::string e = cpu::decode(a, p.num_pages); !e.empty()) {
    std::fprintf(stderr, "cpu decode: %s\n", e.c_str());
    std::exit(1);
  }
  // The same on the device, for every split.
  DecodeArgs d = a;
  d.kv.base = to_device(p.mem);
  d.kv.scales = p.scales.empty() ? nullptr : to_device(p.scales);
  d.q = to_device(q);
  float* out = nullptr;
  CHECK_CUDA(cudaMalloc(&out, got.size() * sizeof(float)));
  d.out = out;
  d.block_tables = to_device(tables);
  d.context_lens = to_device(c.contexts);
  for (uint32_t split : c.splits) {
    d.split_tokens = split;
    const size_t ws_bytes = cuda::decode_workspace_bytes(d, max_ctx, sm_count);
    void* ws = nullptr;
    if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    CHECK_CUDA(cudaMemset(out, 0xff, got.size() * sizeof(float)));  // NaN until written
    if (const std::string e = cuda::decode(d, max_ctx, sm_count, ws, ws_bytes, nullptr);
        !e.empty()) {
      std::fprintf(stderr, "cuda decode: %s\n", e.c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(got.data(), out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    expect_close("decode", c, split, got, want);
    if (ws) cudaFree(ws);
  }

  // Extend over the same pool.
  for (const bool with_prefix : {true, false}) {
    std::vector<uint32_t> offsets{0};
    uint32_t longest = 0;
    for (uint32_t s = 0; s < nseq; ++s) {
      const uint32_t ctx = c.contexts[s];
      const uint32_t n = with_prefix ? std::min(ctx, 5u) : (ctx <= 300 ? ctx : 70u);
      offsets.push_back(offsets.back() + n);
      longest = std::max(longest, n);
    }
    std::vector<float> eq(size_t(offsets.back()) * q_heads * c.head_dim);
    for (auto& x : eq)
      x = nd(rng);
    std::vector<float> ewant(eq.size()), egot(eq.size());
    ExtendArgs e{p.host(),       layer,         nseq,   q_heads,           eq.data(), ewant.data(),
                 offsets.data(), tables.data(), blocks, c.contexts.data(), a.scale};
    if (const std::string err = cpu::extend(e, p.num_pages); !err.empty()) {
      std::fprintf(stderr, "cpu extend: %s\n", err.c_str());
      std::exit(1);
    }
    ExtendArgs ed = e;
    ed.kv = d.kv;
    ed.q = to_device(eq);
    float* eout = nullptr;
    CHECK_CUDA(cudaMalloc(&eout, egot.size() * sizeof(float)));
    CHECK_CUDA(cudaMemset(eout, 0xff, egot.size() * sizeof(float)));
    ed.out = eout;
    ed.q_offsets = to_device(offsets);
    ed.block_tables = d.block_tables;
    ed.context_lens = d.context_lens;
    if (const std::string err = cuda::extend(ed, offsets.back(), nullptr); !err.empty()) {
      std::fprintf(stderr, "cuda extend: %s\n", err.c_str());
      std::exit(1);
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(egot.data(), eout, egot.size() * sizeof(float), cudaMemcpyDeviceToHost));
    expect_close("extend", c, longest, egot, ewant);
    free_all<void>({const_cast<float*>(ed.q), eout, const_cast<uint32_t*>(ed.q_offsets)});
  }

  free_all<void>({d.kv.base, d.kv.scales, const_cast<float*>(d.q), out,
                  const_cast<PageId*>(d.block_tables), const_cast<uint32_t*>(d.context_lens)});
}

// The GPU append writes the same values the CPU append does (compared dequantised); then the
// GPU copy-pages copies what the CPU one does.
void run_append_case(KvDtype dtype, KvLayout layout, std::mt19937& rng) {
  const Geometry g{2, 2, 128, 16, dtype};
  const uint32_t pages = 8;
  Pool cpu_pool;
  cpu_pool.g = g;
  cpu_pool.layout = layout;
  cpu_pool.num_pages = pages;
  cpu_pool.stride = page_data_bytes(g);
  cpu_pool.mem.assign(pages * cpu_pool.stride, std::byte{0});
  if (dtype_is_quantized(dtype)) cpu_pool.scales.assign(pages * 2 * 2 * 2, 0.0f);
  const uint32_t n = 40;
  std::vector<float> k(n * 2 * 128), v(k.size());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : k)
    x = nd(rng) * (1.0f + float(&x - k.data()) / float(k.size()) * 4.0f);
  for (auto& x : v)
    x = nd(rng);
  std::vector<int64_t> slots(n);
  for (uint32_t t = 0; t < n; ++t)
    slots[t] = t == 7 ? -1 : int64_t(3 * 16 + t);
  AppendArgs a{cpu_pool.host(), 1, n, k.data(), v.data(), slots.data()};
  if (const std::string e = cpu::append_kv(a, pages); !e.empty()) {
    std::fprintf(stderr, "cpu append: %s\n", e.c_str());
    std::exit(1);
  }
  AppendArgs d = a;
  std::vector<std::byte> zero(cpu_pool.mem.size(), std::byte{0});
  std::vector<float> zero_scales(cpu_pool.scales.size(), 0.0f);
  d.kv.base = to_device(zero);
  d.kv.scales = zero_scales.empty() ? nullptr : to_device(zero_scales);
  d.k = to_device(k);
  d.v = to_device(v);
  d.slots = to_device(slots);
  if (const std::string e = cuda::append_kv(d, nullptr); !e.empty()) {
    std::fprintf(stderr, "cuda append: %s\n", e.c_str());
    std::exit(1);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<std::byte> got(zero.size());
  std::vector<float> got_scales(zero_scales.size());
  CHECK_CUDA(cudaMemcpy(got.data(), d.kv.base, got.size(), cudaMemcpyDeviceToHost));
  if (!got_scales.empty()) {
    CHECK_CUDA(
        cudaMemcpy(got_scales.data(), d.kv.scales, got_scales.size() * 4, cudaMemcpyDeviceToHost));
  }
  bool same = got == cpu_pool.mem;
  if (!got_scales.empty()) {
    for (size_t i = 0; i < got_scales.size(); ++i) {
      same = same &&
             std::fabs(got_scales[i] - cpu_pool.scales[i]) <= 1e-6f * std::fabs(cpu_pool.scales[i]);
    }
  }
  if (!same) ++failures;
  std::printf("append   %-11s %-9s bytes and scales %s\n", std::string(layout_name(layout)).c_str(),
              std::string(dtype_name(dtype)).c_str(),
              same ? "identical to the CPU append: ok" : "differ from the CPU append: FAILED");

  // Copy pages 3 and 4 (the appended ones) onto 6 and 1, on both sides, from the CPU's bytes.
  const std::vector<PageId> src{3, 4}, dst{6, 1};
  CopyPagesArgs cc{cpu_pool.host(), 2, src.data(), dst.data()};
  if (const std::string e = cpu::copy_pages(cc, pages); !e.empty()) {
    std::fprintf(stderr, "cpu copy: %s\n", e.c_str());
    std::exit(1);
  }
  CHECK_CUDA(cudaMemcpy(d.kv.base, got.data(), got.size(), cudaMemcpyHostToDevice));
  if (!got_scales.empty()) {
    CHECK_CUDA(
        cudaMemcpy(d.kv.scales, got_scales.data(), got_scales.size() * 4, cudaMemcpyHostToDevice));
  }
  CopyPagesArgs dc = cc;
  dc.kv = d.kv;
  dc.src = to_device(src);
  dc.dst = to_device(dst);
  if (const std::string e = cuda::copy_pages(dc, nullptr); !e.empty()) {
    std::fprintf(stderr, "cuda copy: %s\n", e.c_str());
    std::exit(1);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<std::byte> copied(got.size());
  CHECK_CUDA(cudaMemcpy(copied.data(), d.kv.base, copied.size(), cudaMemcpyDeviceToHost));
  // The device pool started from the GPU append's bytes, equal to the CPU's when `same`.
  const bool copy_same = same && copied == cpu_pool.mem;
  if (!copy_same) ++failures;
  std::printf("copy     %-11s %-9s bytes %s\n", std::string(layout_name(layout)).c_str(),
              std::string(dtype_name(dtype)).c_str(),
              copy_same ? "identical to the CPU copy: ok" : "differ from the CPU copy: FAILED");
  cudaFree(const_cast<PageId*>(dc.src));
  cudaFree(const_cast<PageId*>(dc.dst));
  cudaFree(d.kv.base);
  if (d.kv.scales) cudaFree(d.kv.scales);
  cudaFree(const_cast<float*>(d.k));
  cudaFree(const_cast<float*>(d.v));
  cudaFree(const_cast<int64_t*>(d.slots));
}

int run_tests(int sm_count) {
  std::mt19937 rng(42);
  std::vector<Case> cases;
  constexpr uint32_t kNoSplit = 1u << 20;
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    // Every dtype × head dim × group bucket × page size; contexts around page boundaries (ragged
    // last pages) and across several tiles; the planned split and none.
    for (uint32_t d : {64u, 128u, 256u}) {
      for (uint32_t grp : {1u, 4u, 8u}) {
        for (uint32_t t : {8u, 16u, 32u}) {
          cases.push_back(
              {dt, d, grp, t, {1, t - 1, t, t + 1, 3 * t + 5, 300, 1000}, {0, kNoSplit}});
        }
      }
    }
    // Groups that pad their bucket (2 → 4, 3 → 4, 5 → 8).
    cases.push_back({dt, 64, 2, 16, {1, 17, 333}, {0, kNoSplit}});
    cases.push_back({dt, 256, 3, 8, {9, 100}, {0, kNoSplit}});
    cases.push_back({dt, 128, 5, 32, {31, 65}, {0, kNoSplit}});
    // Long contexts with forced splits: chunks of one page, of a few tiles, planned, none.
    cases.push_back({dt, 128, 4, 8, {2049, 5, 4096}, {8, 256, 0, kNoSplit}});
    cases.push_back({dt, 128, 8, 32, {3000, 1}, {32, 96, 0}});
    cases.push_back({dt, 64, 1, 16, {5000}, {16, 0}});
    // layer_major: every head dim and group bucket, ragged pages, splits.
    for (uint32_t d : {64u, 128u, 256u}) {
      for (uint32_t grp : {1u, 4u, 8u}) {
        cases.push_back({dt, d, grp, 16, {1, 15, 16, 17, 53, 300, 1000}, {0, 32, kNoSplit},
                         KvLayout::layer_major});
      }
    }
    cases.push_back({dt, 128, 3, 8, {9, 2049}, {8, 0}, KvLayout::layer_major});
  }
  for (const Case& c : cases)
    run_case(c, rng, sm_count);
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    for (KvLayout layout : {KvLayout::page_major, KvLayout::layer_major})
      run_append_case(dt, layout, rng);
  }
  std::printf("%s: %d failure(s)\n", failures == 0 ? "GPU TESTS PASSED" : "GPU TESTS FAILED",
              failures);
  return failures == 0 ? 0 : 1;
}

// Benchmark ------------------------------------------------------------------------------------

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

int run_bench(int sm_count) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  // L2 flush buffer: writing it evicts everything the last run left in L2.
  const size_t flush_bytes = size_t(256) << 20;
  void* flush = nullptr;
  CHECK_CUDA(cudaMalloc(&flush, flush_bytes));
  auto cold = [&] { CHECK_CUDA(cudaMemsetAsync(flush, 0, flush_bytes)); };

  // Device copy bandwidth: bytes read / time, the same accounting as decode (which only reads).
  const size_t copy_bytes = size_t(4) << 30;
  uint4 *src = nullptr, *dst = nullptr;
  CHECK_CUDA(cudaMalloc(&src, copy_bytes));
  CHECK_CUDA(cudaMalloc(&dst, copy_bytes));
  CHECK_CUDA(cudaMemset(src, 1, copy_bytes));
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    cold();
    CHECK_CUDA(cudaEventRecord(e0));
    copy_kernel<<<sm_count * 8, 512>>>(src, dst, copy_bytes / 16);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    best = std::min(best, time_ms(e0, e1));
  }
  const double copy_read_gbs = double(copy_bytes) / (best * 1e-3) / 1e9;
  std::printf("device copy: %.0f GB/s read (+ as much written), 4 GiB, best of 5\n", copy_read_gbs);
  cudaFree(src);
  cudaFree(dst);

  std::printf("\n%-9s %5s %7s %10s %10s %9s %8s\n", "dtype", "batch", "context", "KV MB", "time us",
              "GB/s", "of copy");
  std::mt19937 rng(7);
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    const Geometry g{1, 8, 128, 16, dt};
    const uint64_t per_token = 2ull * 8 * 128 * dtype_bytes(dt);
    for (uint32_t batch : {1u, 16u, 64u}) {
      for (uint32_t ctx : {1024u, 4096u, 16384u, 65536u}) {
        const uint32_t blocks = ctx / 16;
        const uint32_t pages = batch * blocks;
        const uint64_t stride = page_data_bytes(g);
        void* base = nullptr;
        CHECK_CUDA(cudaMalloc(&base, uint64_t(pages) * stride));
        CHECK_CUDA(cudaMemset(base, 0x3c, uint64_t(pages) * stride));
        std::vector<float> scales_h(dtype_is_quantized(dt) ? size_t(pages) * 16 : 0, 0.01f);
        float* scales = scales_h.empty() ? nullptr : to_device(scales_h);
        std::vector<PageId> table(pages);
        std::iota(table.begin(), table.end(), 0u);
        std::shuffle(table.begin(), table.end(), rng);
        PageId* d_table = to_device(table);
        std::vector<uint32_t> lens(batch, ctx);
        uint32_t* d_lens = to_device(lens);
        std::vector<float> q(size_t(batch) * 32 * 128, 0.01f);
        float* d_q = to_device(q);
        float* d_out = nullptr;
        CHECK_CUDA(cudaMalloc(&d_out, q.size() * sizeof(float)));
        DecodeArgs a;
        a.kv = PagedKv{base, stride, scales, g};
        a.num_seqs = batch;
        a.num_q_heads = 32;
        a.q = d_q;
        a.out = d_out;
        a.block_tables = d_table;
        a.block_table_stride = blocks;
        a.context_lens = d_lens;
        a.scale = 0.088f;
        const size_t ws_bytes = cuda::decode_workspace_bytes(a, ctx, sm_count);
        void* ws = nullptr;
        if (ws_bytes) CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
        float t = 1e30f;
        for (int r = 0; r < 5; ++r) {
          cold();
          CHECK_CUDA(cudaEventRecord(e0));
          const std::string err = cuda::decode(a, ctx, sm_count, ws, ws_bytes, nullptr);
          CHECK_CUDA(cudaEventRecord(e1));
          CHECK_CUDA(cudaEventSynchronize(e1));
          if (!err.empty()) {
            std::fprintf(stderr, "decode: %s\n", err.c_str());
            return 1;
          }
          t = std::min(t, time_ms(e0, e1));
        }
        const double bytes = double(batch) * ctx * per_token;
        const double gbs = bytes / (t * 1e-3) / 1e9;
        std::printf("%-9s %5u %7u %10.1f %10.1f %9.0f %7.0f%%\n",
                    std::string(dtype_name(dt)).c_str(), batch, ctx, bytes / 1e6, t * 1e3, gbs,
                    100.0 * gbs / copy_read_gbs);
        for (void* ptr :
             {base, static_cast<void*>(scales), static_cast<void*>(d_table),
              static_cast<void*>(d_lens), static_cast<void*>(d_q), static_cast<void*>(d_out), ws}) {
          if (ptr) cudaFree(ptr);
        }
      }
    }
  }
  cudaFree(flush);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool tests = argc < 2 || std::strcmp(argv[1], "--bench") != 0;
  const bool bench = argc < 2 || std::strcmp(argv[1], "--tests") != 0;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("kvpool_gpu_check: no CUDA device (or no driver): GPU checks skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f GB\n", prop.name, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / 1e9);
  int rc = 0;
  if (tests) rc |= run_tests(prop.multiProcessorCount);
  if (bench) rc |= run_bench(prop.multiProcessorCount);
  return rc;
}

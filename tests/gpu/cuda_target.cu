// The CUDA kernels as a target of the kernel check, and the decode bandwidth benchmark.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/kernels_cuda.h"
#include "tests/gpu/cuda_target.h"

namespace kvpool::gpu_check {

using namespace kvpool::kernels;

namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return e == cudaSuccess ? std::string() : std::string(what) + ": " + cudaGetErrorString(e);
}

class CudaTarget final : public KernelTarget {
 public:
  CudaTarget(std::string name, int sm_count) : name_(std::move(name)), sm_count_(sm_count) {}
  std::string name() const override { return name_; }

  std::string alloc(void** ptr, size_t bytes) override {
    return cuda_error("cudaMalloc", cudaMalloc(ptr, bytes));
  }
  void release(void* ptr) override {
    if (ptr != nullptr) cudaFree(ptr);
  }
  std::string upload(void* dst, const void* src, size_t bytes) override {
    return cuda_error("cudaMemcpy to the device",
                      cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  std::string download(void* dst, const void* src, size_t bytes) override {
    return cuda_error("cudaMemcpy to the host",
                      cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  std::string fill(void* dst, int byte, size_t bytes) override {
    return cuda_error("cudaMemset", cudaMemset(dst, byte, bytes));
  }
  std::string synchronize() override {
    if (std::string e = cuda_error("cudaDeviceSynchronize", cudaDeviceSynchronize()); !e.empty())
      return e;
    return cuda_error("kernel", cudaGetLastError());
  }

  size_t decode_workspace_bytes(const DecodeArgs& a, uint32_t max_context) override {
    return cuda::decode_workspace_bytes(a, max_context, sm_count_);
  }
  std::string decode(const DecodeArgs& a, uint32_t max_context, uint32_t, void* workspace,
                     size_t workspace_bytes) override {
    return cuda::decode(a, max_context, sm_count_, workspace, workspace_bytes, nullptr);
  }
  std::string extend(const ExtendArgs& a, uint32_t total_new_tokens, uint32_t) override {
    return cuda::extend(a, total_new_tokens, nullptr);
  }
  std::string append_kv(const AppendArgs& a, uint32_t) override {
    return cuda::append_kv(a, nullptr);
  }
  std::string copy_pages(const CopyPagesArgs& a, uint32_t) override {
    return cuda::copy_pages(a, nullptr);
  }
  std::string convert_pages(const ConvertPagesArgs& a, uint32_t, uint32_t) override {
    return cuda::convert_pages(a, nullptr);
  }

 private:
  std::string name_;
  int sm_count_;
};

// The benchmark runs in a process of its own: a CUDA error ends it.
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

}  // namespace

int run_cuda_bench() {
  int sm_count = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
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
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    best = std::min(best, time_ms(e0, e1));
  }
  const double copy_read_gbs = double(copy_bytes) / (best * 1e-3) / 1e9;
  std::printf("device copy: %.0f GB/s read (+ as much written), 4 GiB, best of 5\n", copy_read_gbs);
  cudaFree(src);
  cudaFree(dst);

  // One decode call's best time of 5 (ms) over batch sequences of ctx tokens, 32 query heads over
  // 8 KV heads of dim 128, 16 tokens a page, pages in a random order; layer_major pools segmented
  // when segment_pages > 0 (an elastic pool's layout: a block of slack after each segment).
  // recent > 0: a mixed call (DecodeArgs::mixed), each sequence's full blocks before its last
  // `recent` tokens read from an fp8_e4m3 pool of the same page count (MixedSequence's table).
  std::mt19937 rng(7);
  auto measure = [&](KvDtype dt, KvLayout layout, uint32_t segment_pages, uint32_t batch,
                     uint32_t ctx, uint32_t recent = 0) -> float {
    const Geometry g{1, 8, 128, 16, dt};
    const uint32_t blocks = ctx / 16;
    const uint32_t pages = batch * blocks;
    const uint64_t stride = page_data_bytes(g);
    uint64_t segment_stride = 0;
    uint64_t bytes = uint64_t(pages) * stride;
    if (segment_pages != 0) {
      segment_stride = uint64_t(segment_pages) * stride + stride / 2;  // + one block
      bytes = (pages + segment_pages - 1) / segment_pages * segment_stride;
    }
    void* base = nullptr;
    CHECK_CUDA(cudaMalloc(&base, bytes));
    CHECK_CUDA(cudaMemset(base, 0x3c, bytes));
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
    a.kv = PagedKv{base, stride, scales, g, layout, pages, segment_pages, segment_stride};
    a.num_seqs = batch;
    a.num_q_heads = 32;
    a.q = d_q;
    a.out = d_out;
    a.block_tables = d_table;
    a.block_table_stride = blocks;
    a.context_lens = d_lens;
    a.scale = 0.088f;
    void* older_base = nullptr;
    float* older_scales = nullptr;
    uint32_t* d_older = nullptr;
    if (recent != 0) {
      const Geometry og{1, 8, 128, 16, KvDtype::fp8_e4m3};
      const uint64_t older_stride = page_data_bytes(og);
      CHECK_CUDA(cudaMalloc(&older_base, uint64_t(pages) * older_stride));
      CHECK_CUDA(cudaMemset(older_base, 0x3c, uint64_t(pages) * older_stride));
      older_scales = to_device(std::vector<float>(size_t(pages) * 16, 0.01f));
      d_older = to_device(std::vector<uint32_t>(batch, ctx > recent ? (ctx - recent) / 16 : 0));
      a.mixed = MixedPrecision{
          PagedKv{older_base, older_stride, older_scales, og, KvLayout::page_major, pages}, d_older,
          pages};
    }
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
        t = -1.0f;
        break;
      }
      t = std::min(t, time_ms(e0, e1));
    }
    for (void* ptr :
         {base, static_cast<void*>(scales), static_cast<void*>(d_table), static_cast<void*>(d_lens),
          static_cast<void*>(d_q), static_cast<void*>(d_out), ws, older_base,
          static_cast<void*>(older_scales), static_cast<void*>(d_older)}) {
      if (ptr) cudaFree(ptr);
    }
    return t;
  };
  auto gbs_of = [](KvDtype dt, uint32_t batch, uint32_t ctx, float ms) {
    return double(batch) * ctx * 2.0 * 8 * 128 * dtype_bytes(dt) / (ms * 1e-3) / 1e9;
  };

  std::printf("\n%-9s %5s %7s %10s %10s %9s %8s\n", "dtype", "batch", "context", "KV MB", "time us",
              "GB/s", "of copy");
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp8_e4m3}) {
    for (uint32_t batch : {1u, 16u, 64u}) {
      for (uint32_t ctx : {1024u, 4096u, 16384u, 65536u}) {
        const float t = measure(dt, KvLayout::page_major, 0, batch, ctx);
        if (t < 0) return 1;
        const double gbs = gbs_of(dt, batch, ctx, t);
        std::printf("%-9s %5u %7u %10.1f %10.1f %9.0f %7.0f%%\n",
                    std::string(dtype_name(dt)).c_str(), batch, ctx,
                    double(batch) * ctx * 2.0 * 8 * 128 * dtype_bytes(dt) / 1e6, t * 1e3, gbs,
                    100.0 * gbs / copy_read_gbs);
      }
    }
  }

  // The layouts side by side: page_major, layer_major (one plane per layer), and segmented
  // layer_major (an elastic pool's, segments of 1,024 pages: 64 MiB), bf16, GB/s.
  std::printf("\n%-9s %5s %7s %11s %12s %10s %10s\n", "dtype", "batch", "context", "page_major",
              "layer_major", "segmented", "seg/plain");
  for (uint32_t batch : {16u, 64u}) {
    for (uint32_t ctx : {4096u, 65536u}) {
      double gbs[3];
      const uint32_t seg[3] = {0, 0, 1024};
      const KvLayout lay[3] = {KvLayout::page_major, KvLayout::layer_major, KvLayout::layer_major};
      for (int i = 0; i < 3; ++i) {
        const float t = measure(KvDtype::bf16, lay[i], seg[i], batch, ctx);
        if (t < 0) return 1;
        gbs[i] = gbs_of(KvDtype::bf16, batch, ctx, t);
      }
      std::printf("%-9s %5u %7u %11.0f %12.0f %10.0f %9.2fx\n", "bf16", batch, ctx, gbs[0], gbs[1],
                  gbs[2], gbs[2] / gbs[1]);
    }
  }
  // Mixed precision (issue 25): the last 1,024 tokens of each sequence in bf16, the full blocks
  // before them in fp8_e4m3, against all-bf16 and all-fp8 in the same run. "speed" is all-bf16's
  // time over the call's (tokens per second, the same tokens); GB/s counts the bytes read.
  constexpr uint32_t kRecent = 1024;
  std::printf("\nmixed decode: bf16 for the last %u tokens, fp8_e4m3 before them\n", kRecent);
  std::printf("%5s %7s %9s %9s %9s %11s %10s\n", "batch", "context", "bf16 us", "fp8 us",
              "mixed us", "mixed GB/s", "speed/bf16");
  for (uint32_t batch : {16u, 64u}) {
    for (uint32_t ctx : {4096u, 32768u}) {
      const float t16 = measure(KvDtype::bf16, KvLayout::page_major, 0, batch, ctx);
      const float t8 = measure(KvDtype::fp8_e4m3, KvLayout::page_major, 0, batch, ctx);
      const float tm = measure(KvDtype::bf16, KvLayout::page_major, 0, batch, ctx, kRecent);
      if (t16 < 0 || t8 < 0 || tm < 0) return 1;
      const uint32_t older_tokens = (ctx - kRecent) / 16 * 16;
      const double bytes =
          double(batch) * 2.0 * 8 * 128 * (older_tokens * 1.0 + (ctx - older_tokens) * 2.0);
      std::printf("%5u %7u %9.1f %9.1f %9.1f %11.0f %9.2fx\n", batch, ctx, t16 * 1e3, t8 * 1e3,
                  tm * 1e3, bytes / (tm * 1e-3) / 1e9, t16 / tm);
    }
  }

  // Conversion cost (convert_pages, issue 25): whole pages of a Llama-3.1-8B geometry (32 layers,
  // 8 KV heads, head_dim 128, 16 tokens: 2 MiB in bf16) into fp8_e4m3 and int8, best of 5.
  {
    constexpr uint32_t kPages = 512;
    const Geometry src_g{32, 8, 128, 16, KvDtype::bf16};
    const uint64_t src_stride = page_data_bytes(src_g);
    void* src_base = nullptr;
    CHECK_CUDA(cudaMalloc(&src_base, uint64_t(kPages) * src_stride));
    CHECK_CUDA(cudaMemset(src_base, 0x3c, uint64_t(kPages) * src_stride));
    std::vector<PageId> ids(kPages);
    std::iota(ids.begin(), ids.end(), 0u);
    std::shuffle(ids.begin(), ids.end(), rng);
    PageId* d_src_ids = to_device(ids);
    std::iota(ids.begin(), ids.end(), 0u);
    PageId* d_dst_ids = to_device(ids);
    std::printf("\nconvert_pages: %u pages of 2 MiB bf16 (32 layers, 8 KV heads, head_dim 128)\n",
                kPages);
    std::printf("%-9s %12s %14s\n", "to", "us per page", "GB/s of bf16");
    for (KvDtype to : {KvDtype::fp8_e4m3, KvDtype::int8}) {
      Geometry dst_g = src_g;
      dst_g.dtype = to;
      const uint64_t dst_stride = page_data_bytes(dst_g);
      void* dst_base = nullptr;
      CHECK_CUDA(cudaMalloc(&dst_base, uint64_t(kPages) * dst_stride));
      float* dst_scales = to_device(std::vector<float>(kPages * page_scale_bytes(dst_g) / 4));
      ConvertPagesArgs c{
          PagedKv{src_base, src_stride, nullptr, src_g, KvLayout::page_major, kPages},
          PagedKv{dst_base, dst_stride, dst_scales, dst_g, KvLayout::page_major, kPages}, kPages,
          d_src_ids, d_dst_ids};
      float t = 1e30f;
      for (int r = 0; r < 5; ++r) {
        cold();
        CHECK_CUDA(cudaEventRecord(e0));
        const std::string err = cuda::convert_pages(c, nullptr);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        if (!err.empty()) {
          std::fprintf(stderr, "convert_pages: %s\n", err.c_str());
          return 1;
        }
        t = std::min(t, time_ms(e0, e1));
      }
      std::printf("%-9s %12.2f %14.0f\n", std::string(dtype_name(to)).c_str(), t * 1e3 / kPages,
                  double(kPages) * src_stride / (t * 1e-3) / 1e9);
      cudaFree(dst_base);
      cudaFree(dst_scales);
    }
    cudaFree(src_base);
    cudaFree(d_src_ids);
    cudaFree(d_dst_ids);
  }
  cudaFree(flush);
  return 0;
}

std::unique_ptr<KernelTarget> make_cuda_target(std::string& device, std::string& err) {
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    err = cuda_error("cudaGetDeviceCount", e);
    return nullptr;
  }
  if (devices == 0) {
    err = "cudaGetDeviceCount: no CUDA device";
    return nullptr;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    err = cuda_error("cudaGetDeviceProperties", e);
    return nullptr;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s, %d SMs, %.0f GB, compute %d.%d", prop.name,
                prop.multiProcessorCount, double(prop.totalGlobalMem) / 1e9, prop.major,
                prop.minor);
  device = buf;
  return std::make_unique<CudaTarget>(std::string("CUDA on ") + prop.name,
                                      prop.multiProcessorCount);
}

}  // namespace kvpool::gpu_check

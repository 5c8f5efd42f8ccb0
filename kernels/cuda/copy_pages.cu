// Copy-pages on the GPU: one block per (source, destination) pair, 16-byte vector copies of the
// whole page (all layers, K and V), then the page's scales for 8-bit pools.

#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::kernels::cuda {

namespace {

__global__ void copy_pages_kernel(CopyPagesArgs a, uint64_t vec16, uint64_t tail_bytes,
                                  uint32_t scale_floats) {
  const uint32_t i = blockIdx.x;
  const PageId src = a.src[i];
  const PageId dst = a.dst[i];
  auto* base = static_cast<char*>(a.kv.base);
  const auto* s = reinterpret_cast<const uint4*>(base + uint64_t(src) * a.kv.page_stride);
  auto* d = reinterpret_cast<uint4*>(base + uint64_t(dst) * a.kv.page_stride);
  for (uint64_t k = threadIdx.x; k < vec16; k += blockDim.x)
    d[k] = s[k];
  const auto* sb = reinterpret_cast<const char*>(s + vec16);
  auto* db = reinterpret_cast<char*>(d + vec16);
  for (uint64_t k = threadIdx.x; k < tail_bytes; k += blockDim.x)
    db[k] = sb[k];
  if (scale_floats != 0) {
    const float* ss = a.kv.scales + uint64_t(src) * scale_floats;
    float* ds = a.kv.scales + uint64_t(dst) * scale_floats;
    for (uint32_t k = threadIdx.x; k < scale_floats; k += blockDim.x)
      ds[k] = ss[k];
  }
}

}  // namespace

std::string copy_pages(const CopyPagesArgs& a, void* stream) {
  const Geometry& g = a.kv.geometry;
  if (!validate(g).empty()) return "copy_pages: " + validate(g);
  if (a.num_pairs == 0) return {};
  if (a.src == nullptr || a.dst == nullptr || a.kv.base == nullptr) {
    return "copy_pages: a device pointer is null";
  }
  if (a.kv.page_stride % 16 != 0) return "copy_pages: page_stride must be a multiple of 16";
  const bool quantized = dtype_is_quantized(g.dtype);
  if (quantized && a.kv.scales == nullptr) return "copy_pages: an 8-bit pool needs its scales";
  const uint64_t bytes = page_data_bytes(g);
  const auto scale_floats = static_cast<uint32_t>(page_scale_bytes(g) / sizeof(float));
  copy_pages_kernel<<<a.num_pairs, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      a, bytes / 16, bytes % 16, quantized ? scale_floats : 0);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return std::string("copy_pages: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

// Copy-pages on the GPU: one block per (source, destination) pair, 16-byte vector copies of the
// whole page (all layers, K and V or a latent pool's vector), then the page's scales for 8-bit
// pools. A page is the runs of page_chunks (kernels/paged_kv.h): one in page_major, kv_planes ·
// layers in layer_major (K and V of each layer, one plane apart); runs that are not 16-byte
// aligned are copied byte by byte.

#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::kernels::cuda {

namespace {

__global__ void copy_pages_kernel(CopyPagesArgs a, PageChunks pc, uint64_t vec16,
                                  uint64_t tail_bytes, uint32_t scale_floats) {
  const uint32_t i = blockIdx.x;
  const PageId src = a.src[i];
  const PageId dst = a.dst[i];
  auto* base = static_cast<char*>(a.kv.base);
  for (uint32_t c = 0; c < pc.chunks; ++c) {
    const char* sc = base + pc.at(src) + c * pc.chunk;
    char* dc = base + pc.at(dst) + c * pc.chunk;
    const auto* s = reinterpret_cast<const uint4*>(sc);
    auto* d = reinterpret_cast<uint4*>(dc);
    for (uint64_t k = threadIdx.x; k < vec16; k += blockDim.x)
      d[k] = s[k];
    const char* sb = sc + vec16 * 16;
    char* db = dc + vec16 * 16;
    for (uint64_t k = threadIdx.x; k < tail_bytes; k += blockDim.x)
      db[k] = sb[k];
  }
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
  const bool page_major = a.kv.layout == KvLayout::page_major;
  if (page_major && a.kv.page_stride % 16 != 0) {
    return "copy_pages: page_stride must be a multiple of 16";
  }
  if (!page_major && (a.kv.layout != KvLayout::layer_major || a.kv.num_pages == 0)) {
    return "copy_pages: kv.layout is not page_major, or layer_major with kv.num_pages";
  }
  if (!segments_fit(a.kv)) {
    return "copy_pages: kv.segment_pages and kv.segment_stride do not fit the layout";
  }
  const bool quantized = dtype_is_quantized(g.dtype);
  if (quantized && a.kv.scales == nullptr) return "copy_pages: an 8-bit pool needs its scales";
  const PageChunks pc = page_chunks(a.kv);
  // 16-byte copies when every run starts 16-byte aligned; bytes otherwise.
  const bool aligned = reinterpret_cast<uintptr_t>(a.kv.base) % 16 == 0 &&
                       pc.strides.page % 16 == 0 && pc.strides.segment % 16 == 0 &&
                       pc.chunk % 16 == 0;
  const uint64_t vec16 = aligned ? pc.chunk_bytes / 16 : 0;
  const auto scale_floats = static_cast<uint32_t>(page_scale_bytes(g) / sizeof(float));
  copy_pages_kernel<<<a.num_pairs, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      a, pc, vec16, pc.chunk_bytes - vec16 * 16, quantized ? scale_floats : 0);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return std::string("copy_pages: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

// Convert-pages on the GPU (kernels/paged_kv.h, ConvertPagesArgs): the CPU kernel's arithmetic
// (kernels/cpu/convert_pages.cpp), one block per (pair, layer, KV head, K|V) tile. The block
// dequantises the tile's tokens_per_page · head_dim elements once to find its amax (a block-wide
// max over shared memory, NaN ignored as fmaxf does), thread 0 writes the 8-bit scale
// max(amax, kMinAmax) / R, and every thread encodes its elements with the same quantisers as the
// CPU (kernels/kv_dtype.h), so both kernels agree bit for bit. Ids are the caller's contract: they
// live in device memory here; PoolKernels::convert_to checks them on the host first
// (cpu::check_convert_pages).

#include <cuda_runtime.h>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/kv_dtype.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kThreads = 256;

__device__ float load_elem(KvDtype dtype, const char* row, uint32_t e, float scale) {
  switch (dtype) {
    case KvDtype::fp16:
      return fp16_to_f32(reinterpret_cast<const uint16_t*>(row)[e]);
    case KvDtype::bf16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[e]);
    case KvDtype::fp8_e4m3:
      return fp8_e4m3_to_f32(reinterpret_cast<const uint8_t*>(row)[e]) * scale;
    case KvDtype::int8:
      return int8_to_f32(reinterpret_cast<const int8_t*>(row)[e]) * scale;
  }
  return 0.0f;
}

__device__ void store_elem(KvDtype dtype, char* row, uint32_t e, float x, float inv_scale) {
  switch (dtype) {
    case KvDtype::fp16:
      reinterpret_cast<uint16_t*>(row)[e] = f32_to_fp16(x);
      break;
    case KvDtype::bf16:
      reinterpret_cast<uint16_t*>(row)[e] = f32_to_bf16(x);
      break;
    case KvDtype::fp8_e4m3:
      reinterpret_cast<uint8_t*>(row)[e] = f32_to_fp8_e4m3(x * inv_scale);
      break;
    case KvDtype::int8:
      reinterpret_cast<int8_t*>(row)[e] = f32_to_int8(x, inv_scale);
      break;
  }
}

// blockIdx.x: pair; blockIdx.y: (layer · kv_heads + head) · planes + plane.
__global__ void convert_pages_kernel(ConvertPagesArgs a, KvStrides ss, KvStrides ds) {
  __shared__ float partial[kThreads];
  const Geometry& g = a.src.geometry;
  const uint32_t planes = kv_planes(g);
  const uint32_t plane = blockIdx.y % planes;
  const uint32_t head = blockIdx.y / planes % g.kv_heads;
  const uint32_t layer = blockIdx.y / planes / g.kv_heads;
  const PageId from = a.src_pages[blockIdx.x];
  const PageId to = a.dst_pages[blockIdx.x];
  const KvDtype sd = g.dtype;
  const KvDtype dd = a.dst.geometry.dtype;
  const char* src = static_cast<const char*>(a.src.base) + ss.row(from, layer, head, 0, plane);
  char* dst = static_cast<char*>(a.dst.base) + ds.row(to, layer, head, 0, plane);
  const float src_scale =
      dtype_is_quantized(sd) ? a.src.scales[scale_index(g, from, layer, head, plane != 0)] : 1.0f;
  const uint32_t d = g.head_dim;
  const uint32_t n = g.tokens_per_page * d;
  float inv = 1.0f;
  if (dtype_is_quantized(dd)) {
    float amax = 0.0f;
    for (uint32_t i = threadIdx.x; i < n; i += blockDim.x)
      amax = fmaxf(amax, fabsf(load_elem(sd, src + (i / d) * ss.token, i % d, src_scale)));
    partial[threadIdx.x] = amax;
    __syncthreads();
    for (uint32_t w = blockDim.x / 2; w > 0; w /= 2) {
      if (threadIdx.x < w)
        partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + w]);
      __syncthreads();
    }
    const float range = dd == KvDtype::int8 ? kInt8Max : kFp8Max;
    const float scale = fmaxf(partial[0], kMinAmax) / range;
    if (threadIdx.x == 0) a.dst.scales[scale_index(g, to, layer, head, plane != 0)] = scale;
    inv = 1.0f / scale;
  }
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float x = load_elem(sd, src + (i / d) * ss.token, i % d, src_scale);
    store_elem(dd, dst + (i / d) * ds.token, i % d, x, inv);
  }
}

}  // namespace

std::string convert_pages(const ConvertPagesArgs& a, void* stream) {
  const Geometry& g = a.src.geometry;
  if (!validate(g).empty()) return "convert_pages: src: " + validate(g);
  if (!validate(a.dst.geometry).empty()) return "convert_pages: dst: " + validate(a.dst.geometry);
  if (!same_shape(g, a.dst.geometry)) {
    return "convert_pages: src and dst geometries differ in shape (only dtype and layout may "
           "differ)";
  }
  if (a.num_pairs == 0) return {};
  if (a.src.base == nullptr || a.dst.base == nullptr || a.src_pages == nullptr ||
      a.dst_pages == nullptr) {
    return "convert_pages: a device pointer is null";
  }
  if (a.src.base == a.dst.base) return "convert_pages: src and dst are one pool";
  if ((dtype_is_quantized(g.dtype) && a.src.scales == nullptr) ||
      (dtype_is_quantized(a.dst.geometry.dtype) && a.dst.scales == nullptr)) {
    return "convert_pages: an 8-bit pool needs its scales";
  }
  for (const PagedKv* kv : {&a.src, &a.dst}) {
    if (kv->layout == KvLayout::page_major) {
      if (kv->page_stride < page_data_bytes(kv->geometry)) {
        return "convert_pages: a page_major pool's page_stride is below its page size";
      }
    } else if (kv->layout != KvLayout::layer_major || kv->num_pages == 0) {
      return "convert_pages: a pool's layout is not page_major, or layer_major with num_pages";
    }
    if (!segments_fit(*kv)) {
      return "convert_pages: segment_pages and segment_stride do not fit a pool's layout";
    }
  }
  const uint64_t tiles = uint64_t{g.layers} * g.kv_heads * kv_planes(g);
  if (tiles > 65535) {
    return "convert_pages: " + std::to_string(tiles) +
           " tiles a page (layers · kv_heads · planes) pass the grid's 65535";
  }
  const dim3 grid(a.num_pairs, static_cast<unsigned>(tiles));
  convert_pages_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      a, kv_strides(a.src), kv_strides(a.dst));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return std::string("convert_pages: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

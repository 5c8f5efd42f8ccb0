// Append-KV on the GPU: writes new tokens' K and V rows into their page slots, in either layout
// (rows addressed through kv_strides, computed once per block).
//
// 16-bit pools: one block per token; each thread converts 8 elements and stores them with one
// 16-byte store. 8-bit pools: quantisation is fused, with the scale rules of kernels/paged_kv.h
// (offset 0 sets a page's scale; a larger later token raises it and re-quantises the page's
// earlier tokens). Those rules order the tokens of a page, so one block per (KV head, K|V) walks
// all tokens of the call in order, its threads splitting head_dim. That serialises long
// prefills over tokens; decode appends one token per sequence, where it does not matter.
// A latent pool has one plane (kv_planes = 1): k only, v null, and no V blocks.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/dtype_load.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kThreads = 128;

template <KvDtype DT>
__device__ __forceinline__ uint16_t encode16(float x) {
  if constexpr (DT == KvDtype::fp16) {
    return f32_to_fp16(x);
  } else {
    return f32_to_bf16(x);
  }
}

template <KvDtype DT>
__global__ void append16_kernel(AppendArgs a) {
  const int64_t slot = a.slots[blockIdx.x];
  if (slot < 0) return;
  const Geometry g = a.kv.geometry;
  const auto page = static_cast<uint64_t>(slot) / g.tokens_per_page;
  const auto off = static_cast<uint32_t>(static_cast<uint64_t>(slot) % g.tokens_per_page);
  const KvStrides st = kv_strides(a.kv);
  auto* base = static_cast<char*>(a.kv.base);
  const uint32_t per_token = g.kv_heads * g.head_dim;
  const float* k = a.k + uint64_t(blockIdx.x) * per_token;
  const float* v = a.v != nullptr ? a.v + uint64_t(blockIdx.x) * per_token : nullptr;
  for (uint32_t e = threadIdx.x * 8; e < kv_planes(g) * per_token; e += blockDim.x * 8) {
    const bool is_v = e >= per_token;
    const uint32_t i = is_v ? e - per_token : e;
    const uint32_t h = i / g.head_dim;
    const uint32_t d = i % g.head_dim;
    const float* src = (is_v ? v : k) + i;
    union {
      uint4 vec;
      uint16_t h16[8];
    } out;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      out.h16[j] = encode16<DT>(src[j]);
    const uint64_t at = st.row(page, a.layer, h, off, is_v ? 1 : 0) + uint64_t{d} * 2;
    *reinterpret_cast<uint4*>(base + at) = out.vec;
  }
}

template <KvDtype DT>
__device__ __forceinline__ uint8_t encode8(float x, float inv_scale) {
  if constexpr (DT == KvDtype::fp8_e4m3) {
    return f32_to_fp8_e4m3(x * inv_scale);
  } else {
    return static_cast<uint8_t>(f32_to_int8(x, inv_scale));
  }
}

template <KvDtype DT>
__global__ void append8_kernel(AppendArgs a) {
  const Geometry g = a.kv.geometry;
  const uint32_t h = blockIdx.x;
  const bool is_v = blockIdx.y == 1;
  const float range = DT == KvDtype::fp8_e4m3 ? kFp8Max : kInt8Max;
  __shared__ float s_amax[kThreads / 32];
  __shared__ float s_scale;
  __shared__ float s_old;
  const KvStrides st = kv_strides(a.kv);
  for (uint32_t tok = 0; tok < a.num_tokens; ++tok) {
    const int64_t slot = a.slots[tok];
    if (slot < 0) continue;
    const auto page = static_cast<uint64_t>(slot) / g.tokens_per_page;
    const auto off = static_cast<uint32_t>(static_cast<uint64_t>(slot) % g.tokens_per_page);
    const float* x = (is_v ? a.v : a.k) + (uint64_t(tok) * g.kv_heads + h) * g.head_dim;
    float amax = 0.0f;
    for (uint32_t d = threadIdx.x; d < g.head_dim; d += kThreads)
      amax = fmaxf(amax, fabsf(x[d]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x % 32 == 0) s_amax[threadIdx.x / 32] = amax;
    float* scale = a.kv.scales + scale_index(g, page, a.layer, h, is_v);
    auto* row0 = reinterpret_cast<uint8_t*>(static_cast<char*>(a.kv.base) +
                                            st.row(page, a.layer, h, 0, is_v ? 1 : 0));
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w)
        m = fmaxf(m, s_amax[w]);
      const float old = *scale;
      s_old = old;
      if (off == 0 || !(old > 0.0f)) {
        s_scale = fmaxf(m, kMinAmax) / range;  // a stale scale of a previous owner is ignored
      } else if (m > old * range) {
        s_scale = m / range;
      } else {
        s_scale = old;
      }
    }
    __syncthreads();
    const float sc = s_scale;
    if (off != 0 && sc != s_old) {
      // Re-quantise the page's earlier tokens of this (layer, head, K|V) to the raised scale.
      const float inv = 1.0f / sc;
      // Token r's row is r · st.token bytes in (st.token = head_dim in page_major).
      for (uint32_t e = threadIdx.x; e < off * g.head_dim; e += kThreads) {
        uint8_t* at = row0 + (e / g.head_dim) * st.token + e % g.head_dim;
        const float val = Elem<DT>::load(*at) * s_old;
        *at = encode8<DT>(val, inv);
      }
    }
    const float inv = 1.0f / sc;
    for (uint32_t d = threadIdx.x; d < g.head_dim; d += kThreads) {
      row0[uint64_t(off) * st.token + d] = encode8<DT>(x[d], inv);
    }
    if (threadIdx.x == 0) *scale = sc;
    __syncthreads();
  }
}

}  // namespace

std::string append_kv(const AppendArgs& a, void* stream) {
  const Geometry& g = a.kv.geometry;
  if (!validate(g).empty()) return "append_kv: " + validate(g);
  if (a.layer >= g.layers) return "append_kv: layer out of range";
  if (a.num_tokens == 0) return {};
  const bool latent = g.kind == AttentionKind::latent;
  if (a.k == nullptr || (a.v == nullptr) != latent || a.slots == nullptr || a.kv.base == nullptr) {
    return latent ? "append_kv: a device pointer is null, or v is given for a latent pool (its "
                    "one vector per token is k)"
                  : "append_kv: a device pointer is null";
  }
  if (g.head_dim % 8 != 0) return "append_kv: head_dim must be a multiple of 8";
  if (a.kv.layout == KvLayout::layer_major && a.kv.num_pages == 0) {
    return "append_kv: a layer_major pool needs kv.num_pages";
  }
  if (!segments_fit(a.kv)) {
    return "append_kv: kv.segment_pages and kv.segment_stride do not fit the layout";
  }
  // 16-bit pools are written with 16-byte stores of 8 elements: every row must start on a
  // 16-byte boundary, which holds when the base and (page_major) the page stride do, as rows are
  // head_dim · 2 bytes apart, a multiple of 16. 8-bit pools are written byte by byte.
  const bool page_major = a.kv.layout == KvLayout::page_major;
  if (!dtype_is_quantized(g.dtype) && (reinterpret_cast<uintptr_t>(a.kv.base) % 16 != 0 ||
                                       (page_major && a.kv.page_stride % 16 != 0))) {
    return "append_kv: kv.base and kv.page_stride must be multiples of 16 bytes for a 16-bit pool";
  }
  auto s = static_cast<cudaStream_t>(stream);
  switch (g.dtype) {
    case KvDtype::fp16:
      append16_kernel<KvDtype::fp16><<<a.num_tokens, kThreads, 0, s>>>(a);
      break;
    case KvDtype::bf16:
      append16_kernel<KvDtype::bf16><<<a.num_tokens, kThreads, 0, s>>>(a);
      break;
    case KvDtype::fp8_e4m3:
      if (a.kv.scales == nullptr) return "append_kv: an 8-bit pool needs its scales";
      append8_kernel<KvDtype::fp8_e4m3><<<dim3(g.kv_heads, kv_planes(g)), kThreads, 0, s>>>(a);
      break;
    case KvDtype::int8:
      if (a.kv.scales == nullptr) return "append_kv: an 8-bit pool needs its scales";
      append8_kernel<KvDtype::int8><<<dim3(g.kv_heads, kv_planes(g)), kThreads, 0, s>>>(a);
      break;
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return std::string("append_kv: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

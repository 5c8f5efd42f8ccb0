// Paged-attention extend on the GPU: the new tokens of each sequence attend causally to the
// cached prefix and to themselves (kernels/paged_kv.h, ExtendArgs). One warp per (new token,
// query head): the warp walks positions 0..pos, lanes split head_dim, one online-softmax state.
// Simple and exact; a tiled kernel that shares K/V loads across the new tokens is the next step.

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/dtype_load.cuh"
#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kWarps = 4;

template <KvDtype DT, int D>
__global__ void extend_kernel(ExtendArgs a, uint32_t total_new) {
  using T = typename Elem<DT>::T;
  constexpr int kN = D / 32;
  const uint32_t row = blockIdx.x;  // new token, across sequences
  const uint32_t qh = blockIdx.y * kWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (row >= total_new || qh >= a.num_q_heads) return;
  // The sequence of this row: the last s with q_offsets[s] <= row.
  uint32_t lo = 0;
  uint32_t hi = a.num_seqs;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (a.q_offsets[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const uint32_t seq = lo;
  const uint32_t n_new = a.q_offsets[seq + 1] - a.q_offsets[seq];
  const uint32_t pos = a.context_lens[seq] - n_new + (row - a.q_offsets[seq]);
  const Geometry g = a.kv.geometry;
  const uint32_t kvh = qh / (a.num_q_heads / g.kv_heads);

  float q[kN];
  float acc[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    q[i] = a.q[(uint64_t(row) * a.num_q_heads + qh) * D + lane * kN + i] * a.scale;
    acc[i] = 0.0f;
  }
  float m = -INFINITY;
  float l = 0.0f;
  const PageId* table = a.block_tables + uint64_t(seq) * a.block_table_stride;
  for (uint32_t t = 0; t <= pos; ++t) {
    const TokenRows<DT> rows = token_rows<DT>(a.kv, table, a.layer, kvh, t);
    const T* kr = rows.k + lane * kN;
    const T* vr = rows.v + lane * kN;
    const float ks = rows.k_scale;
    const float vs = rows.v_scale;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kN; ++i)
      s += q[i] * Elem<DT>::load(kr[i]) * ks;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      s += __shfl_xor_sync(0xffffffffu, s, o);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new);
    const float pr = __expf(s - m_new);
    l = l * corr + pr;
#pragma unroll
    for (int i = 0; i < kN; ++i)
      acc[i] = acc[i] * corr + pr * Elem<DT>::load(vr[i]) * vs;
    m = m_new;
  }
#pragma unroll
  for (int i = 0; i < kN; ++i)
    a.out[(uint64_t(row) * a.num_q_heads + qh) * D + lane * kN + i] = acc[i] / l;
}

}  // namespace

std::string extend(const ExtendArgs& a, uint32_t total_new_tokens, void* stream) {
  const Geometry& g = a.kv.geometry;
  if (!validate(g).empty()) return "extend: " + validate(g);
  if (a.layer >= g.layers) return "extend: layer out of range";
  if (a.num_q_heads == 0 || a.num_q_heads % g.kv_heads != 0) {
    return "extend: num_q_heads must be a positive multiple of kv_heads";
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    return "extend: head_dim must be 64, 128 or 256";
  }
  if (dtype_is_quantized(g.dtype) && a.kv.scales == nullptr) {
    return "extend: an 8-bit pool needs its scales";
  }
  if (a.num_seqs == 0 || total_new_tokens == 0) return {};
  const dim3 grid(total_new_tokens, (a.num_q_heads + kWarps - 1) / kWarps);
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_dtype(g.dtype, [&](auto dt) {
    dispatch_head_dim(g.head_dim, [&](auto d) {
      extend_kernel<decltype(dt)::value, decltype(d)::value>
          <<<grid, kWarps * 32, 0, s>>>(a, total_new_tokens);
    });
  });
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return std::string("extend: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

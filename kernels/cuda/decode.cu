// Paged-attention decode on the GPU (see kernels_cuda.h for the design).
//
// Block (chunk, kv_head, seq) covers tokens [chunk·split, min(ctx, (chunk+1)·split)) of one
// sequence for every query head of one KV head's group. Warp w takes tokens begin+w, begin+w+4,
// …; each lane holds D/32 contiguous elements of the K/V rows (one vector load per row) and of
// the query rows, so a score is a lane-local dot product plus a 5-step shuffle reduction. Each
// warp keeps one online-softmax state (m, l, acc) per query head; at the end the warps' states
// merge in shared memory. One chunk: the result goes straight to out. Several: each chunk writes
// (m, l) and acc to the workspace and merge_chunks combines them in chunk order.
// Invariant: a state with l = 0 is empty and weighs nothing in a merge (its m may be −inf).

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/dtype_load.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/split_plan.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <KvDtype DT, int D>
__device__ __forceinline__ void load_row(const typename Elem<DT>::T* p, float scale, float* out) {
  using T = typename Elem<DT>::T;
  constexpr int kN = D / 32;
  const Vec<T, kN> raw = *reinterpret_cast<const Vec<T, kN>*>(p);
#pragma unroll
  for (int i = 0; i < kN; ++i)
    out[i] = Elem<DT>::load(raw.v[i]) * scale;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <KvDtype DT, int D>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(DecodeArgs a, uint32_t split, uint32_t num_chunks, float* ws_acc,
                  float2* ws_stats) {
  using T = typename Elem<DT>::T;
  constexpr int kN = D / 32;
  const uint32_t chunk = blockIdx.x;
  const uint32_t kvh = blockIdx.y;
  const uint32_t seq = blockIdx.z;
  const Geometry g = a.kv.geometry;
  const int group = static_cast<int>(a.num_q_heads / g.kv_heads);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const uint32_t ctx = a.context_lens[seq];
  const uint32_t begin = chunk * split;
  const uint32_t end = min(ctx, begin + split);

  float q[kMaxGroup][kN];
  float m[kMaxGroup];
  float l[kMaxGroup];
  float acc[kMaxGroup][kN];
#pragma unroll
  for (int gi = 0; gi < kMaxGroup; ++gi) {
    m[gi] = -INFINITY;
    l[gi] = 0.0f;
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      acc[gi][i] = 0.0f;
      q[gi][i] = gi < group
                     ? a.q[(uint64_t(seq) * a.num_q_heads + kvh * group + gi) * D + lane * kN + i] *
                           a.scale
                     : 0.0f;
    }
  }

  const PageId* table = a.block_tables + uint64_t(seq) * a.block_table_stride;
  for (uint32_t t = begin + warp; t < end; t += kWarps) {
    const TokenRows<DT> rows = token_rows<DT>(a.kv, table, a.layer, kvh, t);
    float k[kN];
    float v[kN];
    load_row<DT, D>(rows.k + lane * kN, rows.k_scale, k);
    load_row<DT, D>(rows.v + lane * kN, rows.v_scale, v);
#pragma unroll
    for (int gi = 0; gi < kMaxGroup; ++gi) {
      if (gi >= group) break;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kN; ++i)
        s += q[gi][i] * k[i];
      s = warp_sum(s);
      const float m_new = fmaxf(m[gi], s);
      const float corr = __expf(m[gi] - m_new);
      const float pr = __expf(s - m_new);
      l[gi] = l[gi] * corr + pr;
#pragma unroll
      for (int i = 0; i < kN; ++i)
        acc[gi][i] = acc[gi][i] * corr + pr * v[i];
      m[gi] = m_new;
    }
  }

  // Merge the warps' states.
  __shared__ float s_m[kWarps][kMaxGroup];
  __shared__ float s_l[kWarps][kMaxGroup];
  __shared__ float s_acc[kWarps][kMaxGroup][D];
#pragma unroll
  for (int gi = 0; gi < kMaxGroup; ++gi) {
    if (gi >= group) break;
    if (lane == 0) {
      s_m[warp][gi] = m[gi];
      s_l[warp][gi] = l[gi];
    }
#pragma unroll
    for (int i = 0; i < kN; ++i)
      s_acc[warp][gi][lane * kN + i] = acc[gi][i];
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < group * D; idx += kThreads) {
    const int gi = idx / D;
    const int d = idx % D;
    float mm = -INFINITY;
    for (int w = 0; w < kWarps; ++w) {
      if (s_l[w][gi] > 0.0f) mm = fmaxf(mm, s_m[w][gi]);
    }
    float ll = 0.0f;
    float aa = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (s_l[w][gi] > 0.0f) {
        const float c = __expf(s_m[w][gi] - mm);
        ll += s_l[w][gi] * c;
        aa += s_acc[w][gi][d] * c;
      }
    }
    const uint64_t row = uint64_t(seq) * a.num_q_heads + kvh * group + gi;
    if (num_chunks == 1) {
      a.out[row * D + d] = aa / ll;
    } else {
      ws_acc[(row * num_chunks + chunk) * D + d] = aa;
      if (d == 0) ws_stats[row * num_chunks + chunk] = make_float2(mm, ll);
    }
  }
}

// Combines the chunk states of one (sequence, query head) row; block = head_dim threads.
__global__ void merge_chunks(uint32_t num_chunks, uint32_t head_dim, const float* ws_acc,
                             const float2* ws_stats, float* out) {
  const uint64_t row = blockIdx.x;
  const uint32_t d = threadIdx.x;
  float mm = -INFINITY;
  for (uint32_t c = 0; c < num_chunks; ++c) {
    const float2 st = ws_stats[row * num_chunks + c];
    if (st.y > 0.0f) mm = fmaxf(mm, st.x);
  }
  float ll = 0.0f;
  float aa = 0.0f;
  for (uint32_t c = 0; c < num_chunks; ++c) {
    const float2 st = ws_stats[row * num_chunks + c];
    if (st.y > 0.0f) {
      const float w = __expf(st.x - mm);
      ll += st.y * w;
      aa += ws_acc[(row * num_chunks + c) * head_dim + d] * w;
    }
  }
  out[row * head_dim + d] = aa / ll;
}

std::string check_args(const DecodeArgs& a) {
  const Geometry& g = a.kv.geometry;
  if (!validate(g).empty()) return "decode: " + validate(g);
  if (a.layer >= g.layers) return "decode: layer out of range";
  if (a.num_q_heads == 0 || a.num_q_heads % g.kv_heads != 0) {
    return "decode: num_q_heads must be a positive multiple of kv_heads";
  }
  if (a.num_q_heads / g.kv_heads > kMaxGroup) return "decode: more than 8 query heads per KV head";
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    return "decode: head_dim must be 64, 128 or 256";
  }
  if (dtype_is_quantized(g.dtype) && a.kv.scales == nullptr) {
    return "decode: an 8-bit pool needs its scales";
  }
  if (a.num_seqs == 0) return {};
  if (a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.kv.base == nullptr) {
    return "decode: a device pointer is null";
  }
  return {};
}

}  // namespace

uint32_t decode_split_tokens(const DecodeArgs& a, uint32_t max_context, int sm_count) {
  const uint32_t t = a.kv.geometry.tokens_per_page;
  if (a.split_tokens != 0) return (a.split_tokens + t - 1) / t * t;
  // Aim for two blocks per SM; chunks of at least 256 tokens keep the merge cheap.
  return plan_split_tokens(max_context, t, a.num_seqs, a.kv.geometry.kv_heads,
                           static_cast<uint32_t>(2 * (sm_count > 0 ? sm_count : 1)), 256);
}

size_t decode_workspace_bytes(const DecodeArgs& a, uint32_t max_context, int sm_count) {
  const uint32_t split = decode_split_tokens(a, max_context, sm_count);
  const uint32_t chunks = (max_context + split - 1) / split;
  if (chunks <= 1) return 0;
  const uint64_t rows = uint64_t(a.num_seqs) * a.num_q_heads;
  return rows * chunks * (a.kv.geometry.head_dim * sizeof(float) + sizeof(float2));
}

std::string decode(const DecodeArgs& a, uint32_t max_context, int sm_count, void* workspace,
                   size_t workspace_bytes, void* stream) {
  if (std::string e = check_args(a); !e.empty()) return e;
  if (a.num_seqs == 0) return {};
  if (max_context == 0) return "decode: max_context must be at least 1";
  const uint32_t split = decode_split_tokens(a, max_context, sm_count);
  const uint32_t chunks = (max_context + split - 1) / split;
  const size_t need = decode_workspace_bytes(a, max_context, sm_count);
  if (workspace_bytes < need) {
    return "decode: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
           std::to_string(need) + " needed";
  }
  const uint64_t rows = uint64_t(a.num_seqs) * a.num_q_heads;
  auto* ws_acc = static_cast<float*>(workspace);
  auto* ws_stats = chunks > 1
                       ? reinterpret_cast<float2*>(ws_acc + rows * chunks * a.kv.geometry.head_dim)
                       : nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(chunks, a.kv.geometry.kv_heads, a.num_seqs);
  dispatch_dtype(a.kv.geometry.dtype, [&](auto dt) {
    dispatch_head_dim(a.kv.geometry.head_dim, [&](auto d) {
      decode_kernel<decltype(dt)::value, decltype(d)::value>
          <<<grid, kThreads, 0, s>>>(a, split, chunks, ws_acc, ws_stats);
    });
  });
  if (chunks > 1) {
    merge_chunks<<<static_cast<unsigned>(rows), a.kv.geometry.head_dim, 0, s>>>(
        chunks, a.kv.geometry.head_dim, ws_acc, ws_stats, a.out);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return std::string("decode: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

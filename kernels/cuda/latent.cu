// Decode and extend over a latent (MLA) pool on the GPU (kernels/paged_kv.h: one vector of
// head_dim elements per token and layer, no V; the whole vector is the key and its first
// value_dim elements the value, FlashMLA's absorbed form). decode() and extend() of this folder
// hand latent pools here (kernels_cuda.h).
//
// Algorithm. One CTA (256 threads) per (query token, slice of up to kHeads query heads): a
// decode query is its sequence's last position, an extend query is new token r of q_offsets'
// numbering. The CTA's query rows sit in shared memory (pre-scaled); its keys, from the first
// the mask lets it see to its own position, stream through shared memory kKeys rows at a time,
// converted to fp32 once (8-bit pools: times the page's scale). Per tile: thread (head, key)
// pairs compute the scores (a D-long dot product each), one thread per head takes them into its
// online-softmax state (m, l) and leaves the probabilities and the rescale factor in shared
// memory, then 16 threads per head accumulate p · value into registers, each owning every 16th
// element of its head's value row. At the end acc / (l + e^{sink − m}) is written.
//
// Mixed precision (DecodeArgs::mixed, ExtendArgs::mixed): block-table entry i of sequence s names
// a page of mixed.older when i < older_pages[s]. The tile load of step 1 picks each key's pool,
// and so its dtype, strides and scales, from its entry; everything after the conversion is the
// plain kernel, so any pair of dtypes is read (the CPU kernels' rule, kernels/paged_kv.h).
//
// This is the plain form: every CTA reads its keys once per query token and head slice (no split
// across SMs, no tensor cores), right for the GPU check and for short contexts; a FlashMLA-class
// kernel (wgmma tiles over 64-token pages, split-KV) is the next step. Not run on a GPU yet.
//
// Invariants: only keys [first visible, position] of the query's own sequence are read; each
// output row is written by one CTA; every argument the host can see is checked before launch.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/smem_attribute.cuh"
#include "kernels/kv_dtype.h"
#include "kernels/paged_kv.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kLatentThreads = 256;
constexpr int kHeads = 16;                              // query heads per CTA
constexpr int kKeys = 16;                               // keys per shared-memory tile
constexpr int kLanesPerHead = kLatentThreads / kHeads;  // 16 threads accumulate one head
constexpr uint32_t kMaxLatentDim = 576;                 // DeepSeek-V3: 512 latent + 64 rotary
constexpr int kMaxAccPerThread = (kMaxLatentDim + kLanesPerHead - 1) / kLanesPerHead;  // 36

// Dynamic shared memory for head_dim d: the query rows, a key tile (rows d + 1 floats apart, so
// the 16 keys a warp's score threads read at one element fall in different banks), the
// probabilities and the softmax states.
constexpr size_t latent_smem_bytes(uint32_t d) {
  return (size_t{kHeads} * d + size_t{kKeys} * (d + 1) + size_t{kHeads} * kKeys + 3 * kHeads) *
         sizeof(float);
}
constexpr int kMaxLatentSmem = static_cast<int>(latent_smem_bytes(kMaxLatentDim));

__device__ __forceinline__ float load_elem(KvDtype dtype, const unsigned char* p, float scale) {
  switch (dtype) {
    case KvDtype::fp16:
      return fp16_to_f32(*reinterpret_cast<const uint16_t*>(p));
    case KvDtype::bf16:
      return bf16_to_f32(*reinterpret_cast<const uint16_t*>(p));
    case KvDtype::fp8_e4m3:
      return fp8_e4m3_to_f32(*p) * scale;
    case KvDtype::int8:
      return int8_to_f32(static_cast<int8_t>(*p)) * scale;
  }
  return 0.0f;
}

struct LatentCall {
  PagedKv kv;
  uint32_t layer;
  uint32_t num_seqs;
  uint32_t num_q_heads;
  const float* q;
  float* out;
  const uint32_t* q_offsets;  // null: decode (query r is sequence r's last position)
  const PageId* block_tables;
  uint32_t block_table_stride;
  const uint32_t* context_lens;
  float scale;
  AttentionMask mask;
  uint32_t value_dim;
  PagedKv older;                // older.base null: no mixed call
  const uint32_t* older_pages;  // [num_seqs]: each sequence's leading entries in `older`
};

__global__ void __launch_bounds__(kLatentThreads) latent_kernel(LatentCall a) {
  extern __shared__ float smem[];
  const Geometry& g = a.kv.geometry;
  const uint32_t d = g.head_dim;
  const uint32_t dv = a.value_dim;
  float* q_s = smem;                  // [kHeads][d]
  const uint32_t ks = d + 1;          // k_s's row stride (latent_smem_bytes)
  float* k_s = q_s + kHeads * d;      // [kKeys][ks]
  float* p_s = k_s + kKeys * ks;      // [kHeads][kKeys]
  float* m_s = p_s + kHeads * kKeys;  // [kHeads]
  float* l_s = m_s + kHeads;          // [kHeads]
  float* corr_s = l_s + kHeads;       // [kHeads]

  // The query token: its sequence and position.
  const uint32_t r = blockIdx.x;
  uint32_t seq = r;
  uint32_t pos = 0;
  if (a.q_offsets == nullptr) {
    if (a.context_lens[seq] == 0) return;  // no query (the CPU kernels refuse it); whole CTA
    pos = a.context_lens[seq] - 1;
  } else {
    uint32_t lo = 0;
    uint32_t hi = a.num_seqs;
    while (hi - lo > 1) {  // the last s with q_offsets[s] ≤ r
      const uint32_t mid = (lo + hi) / 2;
      if (a.q_offsets[mid] <= r) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    seq = lo;
    const uint32_t n_new = a.q_offsets[seq + 1] - a.q_offsets[seq];
    if (a.context_lens[seq] < n_new) return;  // a broken sequence (the CPU kernels refuse it)
    pos = a.context_lens[seq] - n_new + (r - a.q_offsets[seq]);
  }
  const uint32_t head0 = blockIdx.y * kHeads;
  const int heads = static_cast<int>(min(uint32_t(kHeads), a.num_q_heads - head0));
  const uint64_t row0 = uint64_t(r) * a.num_q_heads + head0;  // the first q / out row

  for (uint32_t i = threadIdx.x; i < uint32_t(kHeads) * d; i += kLatentThreads) {
    const uint32_t h = i / d;
    q_s[i] = int(h) < heads ? a.q[(row0 + h) * d + i % d] * a.scale : 0.0f;
  }
  if (threadIdx.x < kHeads) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  const int my_head = static_cast<int>(threadIdx.x) / kLanesPerHead;
  const uint32_t my_lane = threadIdx.x % kLanesPerHead;
  float acc[kMaxAccPerThread];
#pragma unroll
  for (int i = 0; i < kMaxAccPerThread; ++i)
    acc[i] = 0.0f;

  const PageId* table = a.block_tables + uint64_t(seq) * a.block_table_stride;
  // The key's pool: this one, or the older one for the sequence's first `older` entries (the two
  // share every geometry field but dtype, so scale_index is the same for both). Chosen field by
  // field with selects: no array or pointer into the kernel's parameters, which would put them in
  // local memory.
  const bool mixed = a.older.base != nullptr;
  const uint32_t older = mixed ? a.older_pages[seq] : 0;
  const KvStrides recent_st = kv_strides(a.kv);
  const KvStrides older_st = mixed ? kv_strides(a.older) : recent_st;
  const auto* recent_base = static_cast<const unsigned char*>(a.kv.base);
  const auto* older_base = static_cast<const unsigned char*>(a.older.base);
  const KvDtype older_dtype = a.older.geometry.dtype;
  const uint32_t first = first_visible_key(a.mask, pos);
  __syncthreads();

  for (uint64_t t0 = first; t0 <= pos; t0 += kKeys) {
    const int n = static_cast<int>(min(uint64_t(kKeys), pos + 1 - t0));
    // 1. The tile's keys, converted.
    for (uint32_t i = threadIdx.x; i < uint32_t(n) * d; i += kLatentThreads) {
      const auto t = static_cast<uint32_t>(t0 + i / d);
      const uint32_t entry = t / g.tokens_per_page;
      const bool in_older = entry < older;
      const KvDtype dt = in_older ? older_dtype : g.dtype;
      const float* scales = in_older ? a.older.scales : a.kv.scales;
      const PageId page = table[entry];
      const float scale =
          dtype_is_quantized(dt) ? scales[scale_index(g, page, a.layer, 0, false)] : 1.0f;
      const KvStrides st = in_older ? older_st : recent_st;
      const uint64_t at =
          st.row(page, a.layer, 0, t % g.tokens_per_page, 0) + (i % d) * dtype_bytes(dt);
      k_s[(i / d) * ks + i % d] = load_elem(dt, (in_older ? older_base : recent_base) + at, scale);
    }
    __syncthreads();
    // 2. Scores of every (head, key) pair.
    for (int i = static_cast<int>(threadIdx.x); i < kHeads * kKeys; i += kLatentThreads) {
      const int h = i / kKeys;
      const int j = i % kKeys;
      float s = -INFINITY;
      if (h < heads && j < n) {
        s = 0.0f;
        for (uint32_t e = 0; e < d; ++e)
          s = fmaf(q_s[h * d + e], k_s[j * ks + e], s);
      }
      p_s[i] = s;
    }
    __syncthreads();
    // 3. Each head's online softmax over the tile.
    if (static_cast<int>(threadIdx.x) < heads) {
      const int h = static_cast<int>(threadIdx.x);
      float m_new = m_s[h];
      for (int j = 0; j < n; ++j)
        m_new = fmaxf(m_new, p_s[h * kKeys + j]);
      const float corr = expf(m_s[h] - m_new);  // 0 on the first tile (m = −inf)
      float sum = 0.0f;
      for (int j = 0; j < kKeys; ++j) {
        const float p = j < n ? expf(p_s[h * kKeys + j] - m_new) : 0.0f;
        p_s[h * kKeys + j] = p;
        sum += p;
      }
      l_s[h] = l_s[h] * corr + sum;
      m_s[h] = m_new;
      corr_s[h] = corr;
    }
    __syncthreads();
    // 4. acc = acc · corr + Σ p · value, every 16th value element of the thread's head.
    if (my_head < heads) {
      const float corr = corr_s[my_head];
#pragma unroll
      for (int i = 0; i < kMaxAccPerThread; ++i) {
        const uint32_t x = my_lane + uint32_t(i) * kLanesPerHead;
        if (x >= dv) break;
        float v = acc[i] * corr;
        for (int j = 0; j < n; ++j)
          v = fmaf(p_s[my_head * kKeys + j], k_s[j * ks + x], v);
        acc[i] = v;
      }
    }
    __syncthreads();  // the next tile overwrites k_s and p_s
  }

  if (my_head < heads) {
    const uint64_t row = row0 + my_head;
    const float sink =
        a.mask.sinks != nullptr ? expf(a.mask.sinks[row % a.num_q_heads] - m_s[my_head]) : 0.0f;
    const float den = l_s[my_head] + sink;
#pragma unroll
    for (int i = 0; i < kMaxAccPerThread; ++i) {
      const uint32_t x = my_lane + uint32_t(i) * kLanesPerHead;
      if (x >= dv) break;
      a.out[row * dv + x] = acc[i] / den;
    }
  }
}

// What the key loads assume of one pool (the call's, or a mixed call's older one): its scales,
// aligned elements, pages that do not overlap, a layout it names. k: the message's prefix.
std::string check_latent_pool(const PagedKv& kv, const std::string& k) {
  const Geometry& g = kv.geometry;
  if (dtype_is_quantized(g.dtype) && kv.scales == nullptr) {
    return k + ": an 8-bit pool needs its scales";
  }
  if (kv.layout == KvLayout::layer_major && kv.num_pages == 0) {
    return k + ": a layer_major pool needs kv.num_pages";
  }
  if (!segments_fit(kv))
    return k + ": kv.segment_pages and kv.segment_stride do not fit the layout";
  const uint32_t b = dtype_bytes(g.dtype);
  if (reinterpret_cast<uintptr_t>(kv.base) % b != 0 ||
      reinterpret_cast<uintptr_t>(kv.scales) % sizeof(float) != 0) {
    return k + ": kv.base must be aligned to the dtype's " + std::to_string(b) +
           " bytes and kv.scales to 4";
  }
  if (kv.layout == KvLayout::page_major &&
      (kv.page_stride < page_data_bytes(g) || kv.page_stride % b != 0)) {
    return k + ": kv.page_stride " + std::to_string(kv.page_stride) +
           " is below the page's data bytes or not a multiple of the dtype's size";
  }
  if (kv.layout != KvLayout::page_major && kv.layout != KvLayout::layer_major) {
    return k + ": kv.layout is not a KvLayout";
  }
  return {};
}

template <typename Args>
std::string check_latent(const Args& a, const char* kernel) {
  const Geometry& g = a.kv.geometry;
  const std::string k = kernel;
  if (std::string e = validate(g); !e.empty()) return k + ": " + e;
  if (a.layer >= g.layers) return k + ": layer out of range";
  if (a.num_q_heads == 0) return k + ": num_q_heads must be at least 1";
  if (g.head_dim > kMaxLatentDim) {
    return k + ": a latent vector of head_dim " + std::to_string(g.head_dim) + " exceeds the " +
           std::to_string(kMaxLatentDim) + " the CUDA kernel holds";
  }
  if (a.value_dim > g.head_dim) {
    return k + ": value_dim " + std::to_string(a.value_dim) +
           " exceeds the latent vector's head_dim " + std::to_string(g.head_dim);
  }
  if (a.mask.window_left < -1) return k + ": mask.window_left is below -1";
  if ((uint64_t{a.num_q_heads} + kHeads - 1) / kHeads > 65535) {
    return k + ": too many query heads";
  }
  if (std::string e = check_latent_pool(a.kv, k); !e.empty()) return e;
  if (mixed_in_use(a.mixed)) {
    if (std::string e = validate(a.mixed.older.geometry); !e.empty()) {
      return k + ": mixed.older: " + e;
    }
    if (!same_shape(a.mixed.older.geometry, g)) {
      return k +
             ": mixed.older is not of the pool's shape (layers, kv_heads, head_dim, "
             "tokens_per_page, kind, window)";
    }
    if (a.num_seqs != 0 && a.mixed.older_pages == nullptr) {
      return k + ": mixed.older_pages is null";
    }
    if (std::string e = check_latent_pool(a.mixed.older, k + " (mixed.older)"); !e.empty()) {
      return e;
    }
  }
  return {};
}

// The kernel's arguments from a decode's or an extend's (q_offsets null for a decode).
template <typename Args>
LatentCall call_of(const Args& a, const uint32_t* q_offsets) {
  return LatentCall{a.kv,
                    a.layer,
                    a.num_seqs,
                    a.num_q_heads,
                    a.q,
                    a.out,
                    q_offsets,
                    a.block_tables,
                    a.block_table_stride,
                    a.context_lens,
                    a.scale,
                    a.mask,
                    value_width(a.kv.geometry, a.value_dim),
                    a.mixed.older,
                    a.mixed.older_pages};
}

std::string launch(const LatentCall& c, uint32_t query_tokens, void* stream, const char* kernel) {
  if (query_tokens > 0x7fffffffu) {
    return std::string(kernel) + ": more than 2^31 - 1 query tokens in one call";
  }
  const size_t smem = latent_smem_bytes(c.kv.geometry.head_dim);
  cudaError_t err = allow_dynamic_smem<latent_kernel, kMaxLatentSmem>();
  if (err == cudaSuccess) {
    const dim3 grid(query_tokens,
                    static_cast<uint32_t>((uint64_t{c.num_q_heads} + kHeads - 1) / kHeads));
    latent_kernel<<<grid, kLatentThreads, smem, static_cast<cudaStream_t>(stream)>>>(c);
    err = cudaGetLastError();
  }
  if (err != cudaSuccess)
    return std::string(kernel) + ": launch failed: " + cudaGetErrorString(err);
  return {};
}

}  // namespace

std::string latent_decode(const DecodeArgs& a, void* stream) {
  if (std::string e = check_latent(a, "decode"); !e.empty()) return e;
  if (a.num_seqs == 0) return {};
  if (a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.kv.base == nullptr) {
    return "decode: a device pointer is null";
  }
  return launch(call_of(a, nullptr), a.num_seqs, stream, "decode");
}

std::string latent_extend(const ExtendArgs& a, uint32_t total_new_tokens, void* stream) {
  if (std::string e = check_latent(a, "extend"); !e.empty()) return e;
  if (a.num_seqs == 0 || total_new_tokens == 0) return {};
  if (a.q == nullptr || a.out == nullptr || a.q_offsets == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.kv.base == nullptr) {
    return "extend: a device pointer is null";
  }
  return launch(call_of(a, a.q_offsets), total_new_tokens, stream, "extend");
}

}  // namespace kvpool::kernels::cuda

// Paged-attention decode on the GPU (design summary in kernels_cuda.h).
//
// One CTA (4 warps) per (split chunk, KV head, group slice, sequence) serves up to kG (≤ 8) query
// heads of that KV head's group (a group wider than 8 takes ceil(group / 8) slices, each reading
// the chunk's K/V) over tokens [chunk · split, min(ctx, (chunk + 1) · split)), from the first key
// the mask lets the query see (AttentionMask: a sliding window or an attention chunk; a split
// chunk wholly before it streams nothing and weighs nothing in the merge). Sinks join the
// denominator once, where acc / l is written (here or in merge_chunks). The chunk streams through
// shared memory in tiles with a 3-stage cp.async pipeline (kv_tile.cuh: stream_tiles), so the loads
// of the next two tiles are in flight while the CTA computes on the current one.
//
// Compute on a tile. Each warp is kRowsPerWarp lane groups of kLanesPerRow = D / 8 lanes; a lane
// holds 8 elements of every query row of the group (pre-scaled by args.scale; heads past the
// group in the kG-bucket are zero and never written). Rows of the tile are dealt to
// (sub-block, warp, lane group) in this order, kSub = 4 rows per lane group per sub-block:
//   row r = ((sub_block · kSub + b) · kWarps + warp) · kRowsPerWarp + lane_group,  b < kSub,
// so at every step a warp reads kRowsPerWarp consecutive rows. Per sub-block a lane group
//   1. converts its kSub K rows (8 elements per lane) and dots them with each head's query slice,
//      group_sum giving every lane of the group the kSub × kG scores; rows ≥ the tile's valid
//      count get −inf (their shared-memory rows are zero-filled, never read from global);
//   2. takes each head's kSub scores into its online-softmax state with softmax_block_scores
//      (online_softmax.h: one rescale per sub-block) and rescales its accumulator slice;
//   3. converts the same kSub V rows and accumulates p · v for every head.
// Every lane group thus keeps kG states (replicated over its lanes) and a D/8-slice of kG
// accumulators. At the end the lane groups of a warp merge with softmax_merge over butterfly
// shuffles, the warps through shared memory (reusing the pipeline buffers), in warp order.
// One chunk: acc / l goes to out. Several: (m, l) and acc go to the workspace and merge_chunks
// combines them in chunk order with softmax_merge, as the CPU decode does.
//
// Mixed precision (DecodeArgs::mixed): the dtype is a template parameter of the tile pipeline, so
// a mixed call is two launches, one per pool, over the same grid: the older pool's reads only the
// tokens of each sequence's first older_pages[s] block-table entries, the recent pool's the rest;
// each writes its chunk states into its own half of the workspace (2 · chunks entries per row,
// always: even a one-chunk call merges), and merge_chunks combines all of them. A chunk that
// straddles the boundary is read in part by each launch; a part with no token weighs nothing.
//
// Invariants: a state with l = 0 is empty and weighs nothing in softmax_merge; only positions
// below the chunk end are read; every CTA writes its workspace entry, empty or not.

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/dtype_load.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/kv_tile.cuh"
#include "kernels/cuda/smem_attribute.cuh"
#include "kernels/online_softmax.h"
#include "kernels/split_plan.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kSub = 4;  // rows per lane group per softmax block

template <KvDtype DT, int D, int kG>
struct DecodeShape : TileShape<DT, D> {
  using S = TileShape<DT, D>;
  static constexpr int kSubBlocks = S::kTile / (kWarps * S::kRowsPerWarp * kSub);  // 1 or 2
  static_assert(kSubBlocks >= 1 && S::kTile == kSubBlocks * kWarps * S::kRowsPerWarp * kSub);
  // The warps' states for the final merge: acc [kWarps][kG][D] floats, then [kWarps][kG] stats.
  static constexpr int kMergeBytes =
      kWarps * kG * D * 4 + kWarps * kG * static_cast<int>(sizeof(SoftmaxStats));
  static constexpr int kSmemBytes =
      S::kPipelineBytes > kMergeBytes ? S::kPipelineBytes : kMergeBytes;
};

// Which tokens of each sequence a launch reads: all of them, or a mixed call's older or recent
// part.
enum class Part : uint32_t { all = 0, older = 1, recent = 2 };

// kv: the pool this launch reads (a.kv, or a.mixed.older for Part::older). ws_chunks: workspace
// entries per row (1: write out directly); this launch's start at ws_offset of them.
template <KvDtype DT, int D, int kG>
__global__ void __launch_bounds__(kThreads, 2)
    decode_kernel(DecodeArgs a, PagedKv kv, Part part, uint32_t split, uint32_t ws_chunks,
                  uint32_t ws_offset, float* ws_acc, float2* ws_stats) {
  using S = DecodeShape<DT, D, kG>;
  extern __shared__ uint4 smem_u4[];
  auto* smem = reinterpret_cast<unsigned char*>(smem_u4);

  const uint32_t chunk = blockIdx.x;
  const int full_group = static_cast<int>(a.num_q_heads / a.kv.geometry.kv_heads);
  const int slices = (full_group + kG - 1) / kG;
  const uint32_t kvh = blockIdx.y / static_cast<uint32_t>(slices);
  const int slice = static_cast<int>(blockIdx.y % static_cast<uint32_t>(slices));
  const int group = min(kG, full_group - slice * kG);  // this CTA's query heads
  const uint32_t seq = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int lane_group = lane / S::kLanesPerRow;
  const int col = lane % S::kLanesPerRow;  // this lane's 8 elements: [col · 8, col · 8 + 8)
  const uint32_t ctx = a.context_lens[seq];
  uint32_t lo = first_visible_key(a.mask, ctx - 1);
  uint32_t hi = ctx;
  if (part != Part::all) {
    const uint32_t edge = min(ctx, a.mixed.older_pages[seq] * kv.geometry.tokens_per_page);
    if (part == Part::older) hi = edge;
    if (part == Part::recent) lo = max(lo, edge);
  }
  const uint32_t begin = max(chunk * split, lo);
  const uint32_t end = min(hi, chunk * split + split);

  float q[kG][8];
  float acc[kG][8];
  SoftmaxStats st[kG];
  const uint64_t row0 =
      uint64_t(seq) * a.num_q_heads + uint64_t(kvh) * full_group + uint64_t(slice) * kG;
#pragma unroll
  for (int h = 0; h < kG; ++h) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      q[h][e] = h < group ? a.q[(row0 + h) * D + col * 8 + e] * a.scale : 0.0f;
      acc[h][e] = 0.0f;
    }
  }

  const PageId* table = a.block_tables + uint64_t(seq) * a.block_table_stride;
  stream_tiles<DT, D>(
      smem, kv, table, a.layer, kvh, begin, end,
      [&](const unsigned char* tile, uint32_t tile_start) {
        const int valid = static_cast<int>(min(uint32_t(S::kTile), end - tile_start));
#pragma unroll 1
        for (int sb = 0; sb < S::kSubBlocks; ++sb) {
          float s[kG][kSub];
#pragma unroll
          for (int b = 0; b < kSub; ++b) {
            const int r = ((sb * kSub + b) * kWarps + warp) * S::kRowsPerWarp + lane_group;
            float k[8];
            tile_row8<DT, D>(tile, 0, r, col, k);
#pragma unroll
            for (int h = 0; h < kG; ++h) {
              const float score = group_sum<S::kLanesPerRow>(dot8(q[h], k));
              s[h][b] = r < valid ? score : -INFINITY;
            }
          }
#pragma unroll
          for (int h = 0; h < kG; ++h) {
            const float corr = softmax_block_scores(st[h], s[h], kSub);
#pragma unroll
            for (int e = 0; e < 8; ++e)
              acc[h][e] *= corr;
          }
#pragma unroll
          for (int b = 0; b < kSub; ++b) {
            const int r = ((sb * kSub + b) * kWarps + warp) * S::kRowsPerWarp + lane_group;
            float v[8];
            tile_row8<DT, D>(tile, 1, r, col, v);
#pragma unroll
            for (int h = 0; h < kG; ++h) {
#pragma unroll
              for (int e = 0; e < 8; ++e)
                acc[h][e] = fmaf(s[h][b], v[e], acc[h][e]);
            }
          }
        }
      });

  // Lane groups of the warp: lanes o apart (o a multiple of kLanesPerRow) hold the same columns.
#pragma unroll
  for (int o = S::kLanesPerRow; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      SoftmaxStats other;
      other.m = __shfl_xor_sync(0xffffffffu, st[h].m, o);
      other.l = __shfl_xor_sync(0xffffffffu, st[h].l, o);
      float other_acc[8];
#pragma unroll
      for (int e = 0; e < 8; ++e)
        other_acc[e] = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
      softmax_merge(st[h], acc[h], other, other_acc, 8);
    }
  }

  // Warps, through shared memory (stream_tiles ended with every copy landed and a barrier).
  auto* s_acc = reinterpret_cast<float*>(smem);
  auto* s_st = reinterpret_cast<SoftmaxStats*>(s_acc + kWarps * kG * D);
  if (lane < S::kLanesPerRow) {
#pragma unroll
    for (int h = 0; h < kG; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        s_acc[(warp * kG + h) * D + col * 8 + e] = acc[h][e];
      if (lane == 0) s_st[warp * kG + h] = st[h];
    }
  }
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < group * D; idx += kThreads) {
    const int h = idx / D;
    const int d = idx % D;
    SoftmaxStats total;
    float total_acc = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      softmax_merge(total, &total_acc, s_st[w * kG + h], &s_acc[(w * kG + h) * D + d], 1);
    const uint64_t row = row0 + h;
    if (ws_chunks == 1) {
      const float sink =
          a.mask.sinks != nullptr ? expf(a.mask.sinks[row % a.num_q_heads] - total.m) : 0.0f;
      a.out[row * D + d] = total_acc / (total.l + sink);
    } else {
      const uint64_t entry = row * ws_chunks + ws_offset + chunk;
      ws_acc[entry * D + d] = total_acc;
      if (d == 0) ws_stats[entry] = make_float2(total.m, total.l);
    }
  }
}

// Combines the chunk states of one (sequence, query head) row in chunk order; head_dim threads.
// sinks (or null): the row's query head's sink joins the denominator.
__global__ void merge_chunks(uint32_t num_chunks, uint32_t head_dim, const float* ws_acc,
                             const float2* ws_stats, const float* sinks, uint32_t num_q_heads,
                             float* out) {
  const uint64_t row = blockIdx.x;
  const uint32_t d = threadIdx.x;
  SoftmaxStats total;
  float total_acc = 0.0f;
  for (uint32_t c = 0; c < num_chunks; ++c) {
    const float2 m_l = ws_stats[row * num_chunks + c];
    SoftmaxStats part;
    part.m = m_l.x;
    part.l = m_l.y;
    softmax_merge(total, &total_acc, part, &ws_acc[(row * num_chunks + c) * head_dim + d], 1);
  }
  const float sink = sinks != nullptr ? expf(sinks[row % num_q_heads] - total.m) : 0.0f;
  out[row * head_dim + d] = total_acc / (total.l + sink);
}

std::string check_args(const DecodeArgs& a) {
  const Geometry& g = a.kv.geometry;
  if (!validate(g).empty()) return "decode: " + validate(g);
  if (a.layer >= g.layers) return "decode: layer out of range";
  if (a.num_q_heads == 0 || a.num_q_heads % g.kv_heads != 0) {
    return "decode: num_q_heads must be a positive multiple of kv_heads";
  }
  // Groups wider than kMaxGroup run in slices of it, one CTA row each (grid.y ≤ 65535).
  const uint64_t slices = (a.num_q_heads / g.kv_heads + kMaxGroup - 1) / kMaxGroup;
  if (uint64_t{g.kv_heads} * slices > 65535) {
    return "decode: kv_heads × ceil(group / 8) exceeds the grid's 65535";
  }
  if (a.mask.window_left < -1) return "decode: mask.window_left is below -1";
  if (a.value_dim != 0 && a.value_dim != g.head_dim) {
    return "decode: value_dim " + std::to_string(a.value_dim) + " on a pool whose value rows are " +
           "head_dim " + std::to_string(g.head_dim) + " wide";
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    return "decode: head_dim must be 64, 128 or 256";
  }
  if (dtype_is_quantized(g.dtype) && a.kv.scales == nullptr) {
    return "decode: an 8-bit pool needs its scales";
  }
  if (mixed_in_use(a.mixed)) {
    const PagedKv& o = a.mixed.older;
    if (std::string e = validate(o.geometry); !e.empty()) return "decode: mixed.older: " + e;
    if (!same_shape(o.geometry, g)) {
      return "decode: mixed.older is not of the pool's shape (layers, kv_heads, head_dim, "
             "tokens_per_page, kind, window)";
    }
    if (dtype_is_quantized(o.geometry.dtype) && o.scales == nullptr) {
      return "decode: mixed.older is an 8-bit pool without its scales";
    }
    if (a.num_seqs != 0 && a.mixed.older_pages == nullptr) {
      return "decode: mixed.older_pages is null";
    }
    if (std::string e = check_tile_alignment(o, "decode (mixed.older)"); !e.empty()) return e;
  }
  if (a.num_seqs == 0) return {};
  if (a.q == nullptr || a.out == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.kv.base == nullptr) {
    return "decode: a device pointer is null";
  }
  return check_tile_alignment(a.kv, "decode");
}

// Calls fn(kG tag) with the smallest instantiated query-group bucket (1, 4, 8) holding `group`.
template <typename Fn>
void dispatch_group(uint32_t group, Fn&& fn) {
  if (group <= 1) {
    fn(std::integral_constant<int, 1>{});
  } else if (group <= 4) {
    fn(std::integral_constant<int, 4>{});
  } else {
    fn(std::integral_constant<int, 8>{});
  }
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
  if (a.kv.geometry.kind == AttentionKind::latent) return 0;  // latent.cu splits nothing
  const uint32_t split = decode_split_tokens(a, max_context, sm_count);
  uint32_t chunks = (max_context + split - 1) / split;
  if (mixed_in_use(a.mixed)) chunks *= 2;  // a state per chunk and pool, merged even for one
  if (chunks <= 1) return 0;
  const uint64_t rows = uint64_t(a.num_seqs) * a.num_q_heads;
  return rows * chunks * (a.kv.geometry.head_dim * sizeof(float) + sizeof(float2));
}

std::string decode(const DecodeArgs& a, uint32_t max_context, int sm_count, void* workspace,
                   size_t workspace_bytes, void* stream) {
  if (a.kv.geometry.kind == AttentionKind::latent) return latent_decode(a, stream);
  if (std::string e = check_args(a); !e.empty()) return e;
  if (a.num_seqs == 0) return {};
  if (max_context == 0) return "decode: max_context must be at least 1";
  const uint32_t split = decode_split_tokens(a, max_context, sm_count);
  const uint32_t chunks = (max_context + split - 1) / split;
  const bool mixed = mixed_in_use(a.mixed);
  const uint32_t ws_chunks = mixed ? 2 * chunks : chunks;
  const size_t need = decode_workspace_bytes(a, max_context, sm_count);
  if (workspace_bytes < need) {
    return "decode: workspace of " + std::to_string(workspace_bytes) + " bytes, " +
           std::to_string(need) + " needed";
  }
  const uint64_t rows = uint64_t(a.num_seqs) * a.num_q_heads;
  auto* ws_acc = static_cast<float*>(workspace);
  auto* ws_stats =
      ws_chunks > 1 ? reinterpret_cast<float2*>(ws_acc + rows * ws_chunks * a.kv.geometry.head_dim)
                    : nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  const uint32_t group = a.num_q_heads / a.kv.geometry.kv_heads;
  const uint32_t slices = group <= kMaxGroup ? 1 : (group + kMaxGroup - 1) / kMaxGroup;
  const dim3 grid(chunks, a.kv.geometry.kv_heads * slices, a.num_seqs);
  cudaError_t err = cudaSuccess;
  // One launch per pool read: the recent (or only) pool's states after the older pool's.
  const auto launch = [&](const PagedKv& kv, Part part, uint32_t ws_offset) {
    dispatch_dtype(kv.geometry.dtype, [&](auto dt) {
      dispatch_head_dim(kv.geometry.head_dim, [&](auto d) {
        dispatch_group(a.num_q_heads / kv.geometry.kv_heads, [&](auto g) {
          constexpr KvDtype kDt = decltype(dt)::value;
          constexpr int kD = decltype(d)::value;
          constexpr int kG = decltype(g)::value;
          constexpr int kSmem = DecodeShape<kDt, kD, kG>::kSmemBytes;
          err = allow_dynamic_smem<decode_kernel<kDt, kD, kG>, kSmem>();
          if (err == cudaSuccess) {
            decode_kernel<kDt, kD, kG><<<grid, kThreads, kSmem, s>>>(a, kv, part, split, ws_chunks,
                                                                     ws_offset, ws_acc, ws_stats);
          }
        });
      });
    });
  };
  if (mixed) {
    launch(a.mixed.older, Part::older, 0);
    if (err == cudaSuccess) launch(a.kv, Part::recent, chunks);
  } else {
    launch(a.kv, Part::all, 0);
  }
  if (err != cudaSuccess) return std::string("decode: ") + cudaGetErrorString(err);
  if (ws_chunks > 1) {
    merge_chunks<<<static_cast<unsigned>(rows), a.kv.geometry.head_dim, 0, s>>>(
        ws_chunks, a.kv.geometry.head_dim, ws_acc, ws_stats, a.mask.sinks, a.num_q_heads, a.out);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return std::string("decode: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

// Paged-attention extend on the GPU: the new tokens of each sequence attend causally to the
// cached prefix and to themselves (kernels/paged_kv.h, ExtendArgs; design summary in
// kernels_cuda.h).
//
// Tiling. The new tokens of all sequences are numbered 0 .. total_new − 1 (q_offsets order). CTA
// (x, y) takes the query tile of rows [x · rows, (x + 1) · rows) for `heads` query heads of one
// KV head's group: kvh = y / slices, heads [slice · heads, ...) with slice = y % slices; heads =
// ceil(group / slices) with slices = ceil(group / kQueryVectors), so a group wider than a CTA's
// query vectors (Falcon's 71 at head dim 64) takes several even slices, each streaming the K/V.
// rows · heads ≤ kQueryVectors query vectors (row, head), rows = kQueryVectors / heads. A query
// vector lives in one lane group (kLanesPerRow lanes, 8 elements of q and of the accumulator per
// lane), kSlots of them per lane group:
//   query vector qv = (slot · kWarps + warp) · kRowsPerWarp + lane_group,  row qv / heads,
//   head slice · heads + qv % heads (inactive past the group);
// slots past rows · group or outside the current sequence segment are inactive (q = 0, every
// score −inf, nothing written). The tile's rows belong to one or more sequences; each sequence
// segment [seg, seg_end) is processed in turn: its keys [f, last position + 1) stream through
// shared memory once (kv_tile.cuh: stream_tiles, 3-stage cp.async pipeline) and every lane
// group uses every key of every K/V tile for all its slots, so each K/V row is read from global
// memory once per CTA instead of once per (token, head); f is the first key the segment's first
// row sees through the mask (AttentionMask), and a later row's own first key masks the rest.
//
// Per tile, in blocks of kSub keys: scores = group_sum of the lane dots, masked to −inf unless
// the slot is active and the slot's first visible key ≤ key ≤ its position (causal; positions
// past the sequence's keys are zero-filled in shared memory and also past every position);
// softmax_block_scores (online_softmax.h) per slot; then acc · corr + Σ p · v with the same keys'
// V rows. At the end of a segment each active slot writes acc / l (l + e^{sink − m} with sinks).
//
// Mixed precision (ExtendArgs::mixed, a 16-bit pool over an 8-bit older one): the segment's keys
// below edge = older_pages[seq] · T stream first, from the older pool (its dtype DO is a second
// template parameter, so its tiles have their own size), then the rest from this pool, through
// the same pipeline into the same softmax states: one pass, no workspace or merge. Each part
// masks the keys past its own end (its zero-filled rows would otherwise score 0, not −inf).

#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/dtype_load.cuh"
#include "kernels/cuda/kernels_cuda.h"
#include "kernels/cuda/kv_tile.cuh"
#include "kernels/cuda/smem_attribute.cuh"
#include "kernels/online_softmax.h"

namespace kvpool::kernels::cuda {

namespace {

constexpr int kSub = 4;    // keys per softmax block
constexpr int kSlots = 4;  // query vectors per lane group

template <KvDtype DT, int D>
struct ExtendShape : TileShape<DT, D> {
  using S = TileShape<DT, D>;
  static constexpr int kQueryVectors = kWarps * S::kRowsPerWarp * kSlots;  // 16, 32, 64
  static_assert(S::kTile % kSub == 0 && kQueryVectors >= kMaxGroup);
};

// DO: the older pool's dtype in a mixed call (ExtendArgs::mixed), DT otherwise.
template <KvDtype DT, KvDtype DO, int D>
__global__ void __launch_bounds__(kThreads, 2)
    extend_kernel(ExtendArgs a, uint32_t total_new, uint32_t rows_per_cta, uint32_t heads,
                  uint32_t slices) {
  using S = ExtendShape<DT, D>;
  constexpr bool kMixed = DO != DT;
  extern __shared__ uint4 smem_u4[];
  auto* smem = reinterpret_cast<unsigned char*>(smem_u4);

  const uint32_t kvh = blockIdx.y / slices;
  const uint32_t head0 = (blockIdx.y % slices) * heads;  // this CTA's first head of the group
  const uint32_t group = a.num_q_heads / a.kv.geometry.kv_heads;
  const uint32_t r0 = blockIdx.x * rows_per_cta;
  const uint32_t r1 = min(total_new, r0 + rows_per_cta);
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int lane_group = lane / S::kLanesPerRow;
  const int col = lane % S::kLanesPerRow;

  for (uint32_t seg = r0; seg < r1;) {
    // The sequence of row seg: the last s with q_offsets[s] ≤ seg (sequences without new tokens
    // come before it).
    uint32_t lo = 0;
    uint32_t hi = a.num_seqs;
    while (hi - lo > 1) {
      const uint32_t mid = (lo + hi) / 2;
      if (a.q_offsets[mid] <= seg) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const uint32_t seq = lo;
    const uint32_t q_begin = a.q_offsets[seq];
    const uint32_t q_end = a.q_offsets[seq + 1];
    const uint32_t seg_end = min(r1, q_end);
    const uint32_t first_pos = a.context_lens[seq] - (q_end - q_begin);  // of new token 0

    float q[kSlots][8];
    float acc[kSlots][8];
    SoftmaxStats st[kSlots];
    bool active[kSlots];
    uint32_t pos[kSlots];
    uint32_t first_key[kSlots];
    uint64_t out_row[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const auto qv = static_cast<uint32_t>((slot * kWarps + warp) * S::kRowsPerWarp + lane_group);
      const uint32_t row = r0 + qv / heads;
      const uint32_t head = head0 + qv % heads;
      active[slot] = qv < rows_per_cta * heads && head < group && row >= seg && row < seg_end;
      pos[slot] = first_pos + (row - q_begin);
      first_key[slot] = first_visible_key(a.mask, pos[slot]);
      out_row[slot] = uint64_t(row) * a.num_q_heads + uint64_t(kvh) * group + head;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        q[slot][e] = active[slot] ? a.q[out_row[slot] * D + col * 8 + e] * a.scale : 0.0f;
        acc[slot][e] = 0.0f;
      }
    }

    const PageId* table = a.block_tables + uint64_t(seq) * a.block_table_stride;
    const uint32_t keys = first_pos + (seg_end - q_begin);  // the segment's last row sees these
    const uint32_t seg_first = first_visible_key(a.mask, first_pos + (seg - q_begin));
    // One tile of keys [tile_start, tile_start + kTile of its dtype), those at or past part_end
    // masked (zero rows): scores, the online softmax and P · V for every slot.
    const auto consume = [&](auto dtype, const unsigned char* tile, uint32_t tile_start,
                             uint32_t part_end) {
      constexpr KvDtype kT = decltype(dtype)::value;
      constexpr int kTile = TileShape<kT, D>::kTile;
#pragma unroll 1
      for (int k0 = 0; k0 < kTile; k0 += kSub) {
        float s[kSlots][kSub];
#pragma unroll
        for (int b = 0; b < kSub; ++b) {
          float k[8];
          tile_row8<kT, D>(tile, 0, k0 + b, col, k);
          const uint32_t key = tile_start + static_cast<uint32_t>(k0 + b);
#pragma unroll
          for (int slot = 0; slot < kSlots; ++slot) {
            const float score = group_sum<S::kLanesPerRow>(dot8(q[slot], k));
            s[slot][b] =
                active[slot] && key >= first_key[slot] && key <= pos[slot] && key < part_end
                    ? score
                    : -INFINITY;
          }
        }
#pragma unroll
        for (int slot = 0; slot < kSlots; ++slot) {
          const float corr = softmax_block_scores(st[slot], s[slot], kSub);
#pragma unroll
          for (int e = 0; e < 8; ++e)
            acc[slot][e] *= corr;
        }
#pragma unroll
        for (int b = 0; b < kSub; ++b) {
          float v[8];
          tile_row8<kT, D>(tile, 1, k0 + b, col, v);
#pragma unroll
          for (int slot = 0; slot < kSlots; ++slot) {
#pragma unroll
            for (int e = 0; e < 8; ++e)
              acc[slot][e] = fmaf(s[slot][b], v[e], acc[slot][e]);
          }
        }
      }
    };
    // A mixed call: the keys of the sequence's leading older_pages[seq] entries come from the
    // older pool, streamed first into the same states; the rest from this pool.
    uint32_t edge = seg_first;
    if constexpr (kMixed) {
      edge = max(seg_first, min(keys, a.mixed.older_pages[seq] * a.kv.geometry.tokens_per_page));
      stream_tiles<DO, D>(smem, a.mixed.older, table, a.layer, kvh, seg_first, edge,
                          [&](const unsigned char* tile, uint32_t tile_start) {
                            consume(std::integral_constant<KvDtype, DO>{}, tile, tile_start, edge);
                          });
    }
    stream_tiles<DT, D>(smem, a.kv, table, a.layer, kvh, edge, keys,
                        [&](const unsigned char* tile, uint32_t tile_start) {
                          consume(std::integral_constant<KvDtype, DT>{}, tile, tile_start, keys);
                        });

#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      if (!active[slot]) continue;
      const float den =
          st[slot].l + (a.mask.sinks != nullptr
                            ? expf(a.mask.sinks[out_row[slot] % a.num_q_heads] - st[slot].m)
                            : 0.0f);
#pragma unroll
      for (int e = 0; e < 8; ++e)
        a.out[out_row[slot] * D + col * 8 + e] = acc[slot][e] / den;
    }
    seg = seg_end;
  }
}

}  // namespace

std::string extend(const ExtendArgs& a, uint32_t total_new_tokens, void* stream) {
  const Geometry& g = a.kv.geometry;
  const bool mixed = mixed_in_use(a.mixed);
  if (g.kind == AttentionKind::latent) return latent_extend(a, total_new_tokens, stream);
  if (!validate(g).empty()) return "extend: " + validate(g);
  if (a.layer >= g.layers) return "extend: layer out of range";
  if (a.num_q_heads == 0 || a.num_q_heads % g.kv_heads != 0) {
    return "extend: num_q_heads must be a positive multiple of kv_heads";
  }
  if (a.mask.window_left < -1) return "extend: mask.window_left is below -1";
  if (a.value_dim != 0 && a.value_dim != g.head_dim) {
    return "extend: value_dim " + std::to_string(a.value_dim) + " on a pool whose value rows are " +
           "head_dim " + std::to_string(g.head_dim) + " wide";
  }
  if (g.head_dim != 64 && g.head_dim != 128 && g.head_dim != 256) {
    return "extend: head_dim must be 64, 128 or 256";
  }
  if (dtype_is_quantized(g.dtype) && a.kv.scales == nullptr) {
    return "extend: an 8-bit pool needs its scales";
  }
  if (mixed) {
    const PagedKv& o = a.mixed.older;
    if (std::string e = validate(o.geometry); !e.empty()) return "extend: mixed.older: " + e;
    if (!same_shape(o.geometry, g)) {
      return "extend: mixed.older is not of the pool's shape (layers, kv_heads, head_dim, "
             "tokens_per_page, kind, window)";
    }
    if (dtype_is_quantized(g.dtype) || !dtype_is_quantized(o.geometry.dtype)) {
      return "extend: a mixed call on the GPU reads a 16-bit pool (bf16, fp16) and an 8-bit "
             "older pool (fp8_e4m3, int8)";
    }
    if (o.scales == nullptr) return "extend: mixed.older is an 8-bit pool without its scales";
    if (a.num_seqs != 0 && a.mixed.older_pages == nullptr) {
      return "extend: mixed.older_pages is null";
    }
    if (std::string e = check_tile_alignment(o, "extend (mixed.older)"); !e.empty()) return e;
  }
  if (a.num_seqs == 0 || total_new_tokens == 0) return {};
  if (a.q == nullptr || a.out == nullptr || a.q_offsets == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.kv.base == nullptr) {
    return "extend: a device pointer is null";
  }
  if (std::string e = check_tile_alignment(a.kv, "extend"); !e.empty()) return e;
  const uint32_t group = a.num_q_heads / g.kv_heads;
  // Slices of at least 16 query vectors (the smallest CTA's): grid.y stays within 65535.
  if (uint64_t{g.kv_heads} * ((group + 15) / 16) > 65535) {
    return "extend: kv_heads × ceil(group / 16) exceeds the grid's 65535";
  }
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  // One kernel for DT (and DO, the older pool's, in a mixed call: each CTA streams both pools'
  // tiles through the same pipeline, so its shared memory fits the larger stage).
  const auto launch = [&](auto dt, auto dto, auto d) {
    constexpr KvDtype kDt = decltype(dt)::value;
    constexpr KvDtype kDo = decltype(dto)::value;
    constexpr int kD = decltype(d)::value;
    constexpr int kSmem = ExtendShape<kDt, kD>::kPipelineBytes > TileShape<kDo, kD>::kPipelineBytes
                              ? ExtendShape<kDt, kD>::kPipelineBytes
                              : TileShape<kDo, kD>::kPipelineBytes;
    // Query heads per CTA: the group in as few slices of a CTA's query vectors as it takes,
    // evened out (71 at 64 vectors: two slices of 36, not 64 + 7).
    const uint32_t vectors = ExtendShape<kDt, kD>::kQueryVectors;
    const uint32_t slices = (group + vectors - 1) / vectors;
    const uint32_t heads = (group + slices - 1) / slices;
    const uint32_t rows = vectors / heads;
    const dim3 grid((total_new_tokens + rows - 1) / rows, g.kv_heads * slices);
    err = allow_dynamic_smem<extend_kernel<kDt, kDo, kD>, kSmem>();
    if (err == cudaSuccess) {
      extend_kernel<kDt, kDo, kD>
          <<<grid, kThreads, kSmem, s>>>(a, total_new_tokens, rows, heads, slices);
    }
  };
  if (mixed) {
    // 16-bit pools with 8-bit older ones only (checked above): four pairs, not sixteen.
    const auto older = [&](auto dt, auto d) {
      if (a.mixed.older.geometry.dtype == KvDtype::fp8_e4m3) {
        launch(dt, std::integral_constant<KvDtype, KvDtype::fp8_e4m3>{}, d);
      } else {
        launch(dt, std::integral_constant<KvDtype, KvDtype::int8>{}, d);
      }
    };
    dispatch_head_dim(g.head_dim, [&](auto d) {
      if (g.dtype == KvDtype::bf16) {
        older(std::integral_constant<KvDtype, KvDtype::bf16>{}, d);
      } else {
        older(std::integral_constant<KvDtype, KvDtype::fp16>{}, d);
      }
    });
  } else {
    dispatch_dtype(g.dtype, [&](auto dt) {
      dispatch_head_dim(g.head_dim, [&](auto d) { launch(dt, dt, d); });
    });
  }
  if (err != cudaSuccess) return std::string("extend: ") + cudaGetErrorString(err);
  err = cudaGetLastError();
  if (err != cudaSuccess) return std::string("extend: launch failed: ") + cudaGetErrorString(err);
  return {};
}

}  // namespace kvpool::kernels::cuda

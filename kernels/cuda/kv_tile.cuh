// Streaming a sequence's K/V through shared memory in tiles with a cp.async pipeline, shared by
// the decode and extend kernels (decode.cu, extend.cu). Every CTA has kThreads threads.
//
// Tile. A tile is kTile consecutive positions [start, start + kTile) of one sequence for one
// (layer, KV head), laid out in a stage buffer as
//     K rows [kTile][row bytes] | V rows [kTile][row bytes] | 8-bit pools: scales [kTile][K, V]
// Row i is position start + i, read from page block_table[(start + i) / T] at slot (start + i) % T,
// so a tile may straddle pages and a page may hold several tiles (any T). Rows are addressed
// through kv_strides (kernels/paged_kv.h), so both layouts take the same path: in page_major a
// page's rows of one head are contiguous, in layer_major they are kv_heads rows apart; either way
// each row is one 16-byte-aligned run that the cp.async chunks read. kTile is sized so that
// K + V of a stage is kStageBytes (16 KiB): 16 to 128 tokens.
//
// Masking. Only positions below `limit` (the chunk or key range end) are read from global memory.
// The rows and scales of the others are zero-filled by cp.async with src-size 0 (which reads
// nothing), so a masked row holds zeros, never stale data from an earlier tile or a page's unused
// slots (NaN in the tests): the caller gives a masked key the score −inf, hence p = 0, and its
// V row is 0, so P·V gets 0 · 0 = 0 rather than 0 · NaN.
//
// Pipeline (stream_tiles). kStages stage buffers, tile i in buffer i % kStages. Exactly one
// cp.async group is committed per tile slot, empty or not (kStages − 1 in the prologue, then one
// per iteration), so group g is tile g. At the top of iteration i, i + kStages − 1 groups are
// committed and cp.async.wait_group(kStages − 2) leaves at most kStages − 2 pending: groups 0..i,
// tile i included, have landed for this thread. The __syncthreads() that follows (1) makes every
// thread's copies of tile i visible to all and (2) guarantees every thread has finished computing
// on tile i − 1, whose buffer ((i − 1) % kStages = (i + kStages − 1) % kStages) this iteration then
// refills with tile i + kStages − 1 while computing on tile i. One barrier per tile; at the end
// wait_group 0 and a barrier leave the buffers free for the caller (decode merges in them).
//
// Lanes and rows. Compute reads a row as lane groups: kLanesPerRow = D / 8 consecutive lanes, each
// holding 8 consecutive elements (16 bytes of a 16-bit row, 8 of an 8-bit one), so a warp covers
// kRowsPerWarp = 32 / kLanesPerRow rows per load, contiguous in shared memory (no bank conflicts).
// group_sum adds a value over a lane group; every lane of the group gets the same bits (each
// butterfly step adds the same two values, and addition commutes).
#pragma once

#include <cstdint>
#include <string>

#include "common/geometry.h"
#include "kernels/cuda/dtype_load.cuh"
#include "kernels/paged_kv.h"

namespace kvpool::kernels::cuda {

inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kStages = 3;
inline constexpr int kStageBytes = 16384;  // K + V rows of one tile

template <KvDtype DT, int D>
struct TileShape {
  static_assert(D == 64 || D == 128 || D == 256, "head dims 64, 128, 256");
  static constexpr int kElemBytes = static_cast<int>(sizeof(typename Elem<DT>::T));
  static constexpr int kRowBytes = D * kElemBytes;  // 64 .. 512, a multiple of 16
  static constexpr int kLaneElems = 8;
  static constexpr int kLaneBytes = kLaneElems * kElemBytes;
  static constexpr int kLanesPerRow = D / kLaneElems;  // 8, 16, 32
  static constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  static constexpr int kTile = kStageBytes / (2 * kRowBytes);  // 16 .. 128
  static constexpr int kChunksPerRow = kRowBytes / 16;         // 4 .. 32: divides kThreads
  static constexpr bool kScaled = Elem<DT>::kQuantized;
  static constexpr int kVOffset = kTile * kRowBytes;
  static constexpr int kScaleOffset = 2 * kTile * kRowBytes;
  // Every stage starts 16-byte aligned: kTile · 8 is a multiple of 128.
  static constexpr int kBufferBytes = kScaleOffset + (kScaled ? kTile * 8 : 0);
  static constexpr int kPipelineBytes = kStages * kBufferBytes;
  static_assert(kThreads % kChunksPerRow == 0 && kTile % (kWarps * kRowsPerWarp) == 0);
};

// What the 16-byte row copies need (host check): kv.base and, in page_major, kv.page_stride
// multiples of 16 (then every row is, as rows are 64 to 512 bytes, and so are the layer_major
// strides, multiples of a row), and kv.scales, if any, a multiple of 8. A layer_major pool needs
// its plane size (kv.num_pages).
inline std::string check_tile_alignment(const PagedKv& kv, const char* kernel) {
  const bool page_major = kv.layout == KvLayout::page_major;
  if (reinterpret_cast<uintptr_t>(kv.base) % 16 != 0 || (page_major && kv.page_stride % 16 != 0)) {
    return std::string(kernel) + ": kv.base and kv.page_stride must be multiples of 16 bytes";
  }
  if (!page_major && (kv.layout != KvLayout::layer_major || kv.num_pages == 0)) {
    return std::string(kernel) + ": kv.layout is not page_major, or layer_major with kv.num_pages";
  }
  if (!segments_fit(kv)) {
    return std::string(kernel) + ": kv.segment_pages and kv.segment_stride do not fit the layout";
  }
  if (reinterpret_cast<uintptr_t>(kv.scales) % 8 != 0) {
    return std::string(kernel) + ": kv.scales must be 8-byte aligned";
  }
  return {};
}

// cp.async ----------------------------------------------------------------------------------------

// 16 bytes global → shared, bypassing L1; valid = false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// 8 bytes (one token's K and V scales); valid = false writes zeros.
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem, bool valid) {
  const auto dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 8 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Tiles -------------------------------------------------------------------------------------------

// Issues (without committing) the copies of tile [start, start + kTile) into `buffer`; positions
// ≥ limit are zero-filled. Thread t copies 16-byte chunk t % kChunksPerRow of every
// (kThreads / kChunksPerRow)-th row from row t / kChunksPerRow on: consecutive threads read
// consecutive bytes of a row, and each row's page is looked up once for its K and V chunks.
template <KvDtype DT, int D>
__device__ __forceinline__ void issue_tile(unsigned char* buffer, const PagedKv& kv,
                                           const PageId* table, uint32_t layer, uint32_t kvh,
                                           uint32_t start, uint32_t limit) {
  using S = TileShape<DT, D>;
  const Geometry& g = kv.geometry;
  const auto* base = static_cast<const unsigned char*>(kv.base);
  constexpr int kRowsPerPass = kThreads / S::kChunksPerRow;
  const int chunk = static_cast<int>(threadIdx.x) % S::kChunksPerRow;
  const KvStrides st = kv_strides(kv);  // the layout's one branch, per tile
  for (int r = static_cast<int>(threadIdx.x) / S::kChunksPerRow; r < S::kTile; r += kRowsPerPass) {
    const uint32_t t = start + static_cast<uint32_t>(r);
    const bool valid = t < limit;
    const unsigned char* k_src = base;  // read by nothing when !valid
    const unsigned char* v_src = base;
    if (valid) {
      const uint64_t row =
          st.row(table[t / g.tokens_per_page], layer, kvh, t % g.tokens_per_page, 0);
      k_src = base + row + chunk * 16;
      v_src = base + row + st.v + chunk * 16;
    }
    cp_async_16(buffer + r * S::kRowBytes + chunk * 16, k_src, valid);
    cp_async_16(buffer + S::kVOffset + r * S::kRowBytes + chunk * 16, v_src, valid);
  }
  if constexpr (S::kScaled) {
    for (int r = static_cast<int>(threadIdx.x); r < S::kTile; r += kThreads) {
      const uint32_t t = start + static_cast<uint32_t>(r);
      const bool valid = t < limit;
      const float* src = kv.scales;
      if (valid) {
        const uint64_t page = table[t / g.tokens_per_page];
        src = kv.scales + scale_index(g, page, layer, kvh, false);  // then V's (a K/V pool)
      }
      cp_async_8(buffer + S::kScaleOffset + r * 8, src, valid);
    }
  }
}

// Streams tiles [begin, end) of one sequence's (layer, kvh) through `smem` (kPipelineBytes) and
// calls compute(buffer, tile_start) on each, in order, with every thread of the CTA (see the
// file comment for the pipeline). begin, end and everything compute's control flow depends on
// must be the same for the whole CTA.
template <KvDtype DT, int D, typename Compute>
__device__ __forceinline__ void stream_tiles(unsigned char* smem, const PagedKv& kv,
                                             const PageId* table, uint32_t layer, uint32_t kvh,
                                             uint32_t begin, uint32_t end, Compute&& compute) {
  using S = TileShape<DT, D>;
  const int n_tiles = end > begin ? static_cast<int>((end - begin + S::kTile - 1) / S::kTile) : 0;
  auto tile_start = [&](int i) { return begin + static_cast<uint32_t>(i) * S::kTile; };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_tiles) {
      issue_tile<DT, D>(smem + i * S::kBufferBytes, kv, table, layer, kvh, tile_start(i), end);
    }
    cp_async_commit();
  }
  for (int i = 0; i < n_tiles; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = i + kStages - 1;
    if (next < n_tiles) {
      issue_tile<DT, D>(smem + (next % kStages) * S::kBufferBytes, kv, table, layer, kvh,
                        tile_start(next), end);
    }
    cp_async_commit();
    compute(static_cast<const unsigned char*>(smem + (i % kStages) * S::kBufferBytes),
            tile_start(i));
  }
  cp_async_wait<0>();
  __syncthreads();
}

// Row r's 8 elements for lane column `col` of buffer's K (kind 0) or V (kind 1) rows, as fp32 times
// the token's scale (8-bit pools; masked rows have scale 0 and zero elements).
template <KvDtype DT, int D>
__device__ __forceinline__ void tile_row8(const unsigned char* buffer, int kind, int r, int col,
                                          float (&out)[8]) {
  using S = TileShape<DT, D>;
  float scale = 1.0f;
  if constexpr (S::kScaled) {
    scale = reinterpret_cast<const float*>(buffer + S::kScaleOffset)[2 * r + kind];
  }
  load8<DT>(buffer + kind * S::kVOffset + r * S::kRowBytes + col * S::kLaneBytes, scale, out);
}

// The sum of x over the kLanes-lane group of this lane (kLanes a power of two ≤ 32, groups
// aligned); every lane of the warp must call it.
template <int kLanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1)
    x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ __forceinline__ float dot8(const float (&a)[8], const float (&b)[8]) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e)
    s = fmaf(a[e], b[e], s);
  return s;
}

}  // namespace kvpool::kernels::cuda

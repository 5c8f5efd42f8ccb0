// Paged-attention decode on the CPU (DESIGN §8; arguments and page layout in kernels/paged_kv.h).
//
// Algorithm. The context of every sequence is cut into split chunks of `chunk` tokens, a multiple
// of tokens_per_page (DecodeArgs::split_tokens rounded up to pages, or plan_split_tokens when it
// is 0). One work item is (sequence, KV head, chunk) and serves the whole GQA group of that KV
// head: each K row of the chunk is read once, converted to a small fp32 buffer (8-bit pools: times
// the page's K scale) and dotted with the group's query rows; each V row likewise is converted
// once and fed to softmax_add for every query row of the group. A sequence served by one chunk
// writes its unnormalised accumulator straight into `out` and divides by l at the end. A sequence
// with several chunks keeps each chunk's (m, l, acc) in a scratch buffer; whichever thread finishes
// the last chunk of a (sequence, KV head) merges them with softmax_merge in chunk order and writes
// acc / l. Work items are handed to `threads` std::threads through one atomic counter.
//
// Invariants:
//  - only slots of real tokens (t < context_lens[s]) are read: the tail of the last page, other
//    layers and the unused block-table entries are never touched, whatever they hold;
//  - the merge order is fixed (chunk 0, 1, …), so for a given chunk size the output is the same
//    bit for bit whatever the thread count or the scheduling;
//  - every argument is checked before anything is written; an error leaves `out` untouched;
//  - nothing allocates per token: each thread owns two fp32 row buffers and the group's scores.
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"
#include "kernels/online_softmax.h"
#include "kernels/split_plan.h"

namespace kvpool::kernels::cpu {
namespace {

// softmax_add / softmax_merge take the row length as an int; this keeps it far from INT_MAX.
constexpr uint32_t kMaxHeadDim = 1u << 16;
// Smallest planned chunk: shorter chunks cost more in merging than they gain in parallelism.
constexpr uint32_t kMinChunkTokens = 512;

// Row conversion ---------------------------------------------------------------------------------

// fp16 → fp32 without branches, so the row loop vectorises; bit-identical to fp16_to_f32: the
// exponent and mantissa shifted into an fp32 and scaled by 2^112 rebias normals and subnormals
// exactly; inf and NaN (exponent 31) keep their mantissa under an all-ones exponent.
inline float fp16_to_f32_fast(uint16_t h) {
  const uint32_t em = uint32_t{h} & 0x7FFFu;
  uint32_t bits = std::bit_cast<uint32_t>(std::bit_cast<float>(em << 13) * 0x1p112f);
  bits = em >= 0x7C00u ? (0x7F800000u | (em << 13)) : bits;
  return std::bit_cast<float>(bits | ((uint32_t{h} & 0x8000u) << 16));
}

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (uint32_t i = 0; i < 256; ++i)
      t[i] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// Converts d elements of `dtype` at src into fp32 at dst; 8-bit values are multiplied by scale.
void load_row(KvDtype dtype, const std::byte* src, uint32_t d, float scale, float* __restrict dst) {
  switch (dtype) {
    case KvDtype::fp16: {
      const auto* s = reinterpret_cast<const uint16_t*>(src);
      for (uint32_t i = 0; i < d; ++i)
        dst[i] = fp16_to_f32_fast(s[i]);
      break;
    }
    case KvDtype::bf16: {
      const auto* s = reinterpret_cast<const uint16_t*>(src);
      for (uint32_t i = 0; i < d; ++i)
        dst[i] = std::bit_cast<float>(uint32_t{s[i]} << 16);
      break;
    }
    case KvDtype::fp8_e4m3: {
      const auto* s = reinterpret_cast<const uint8_t*>(src);
      const float* table = fp8_table().data();
      for (uint32_t i = 0; i < d; ++i)
        dst[i] = table[s[i]] * scale;
      break;
    }
    case KvDtype::int8: {
      const auto* s = reinterpret_cast<const int8_t*>(src);
      for (uint32_t i = 0; i < d; ++i)
        dst[i] = static_cast<float>(s[i]) * scale;
      break;
    }
  }
}

// Dot product with 8 independent partial sums, so that the compiler vectorises it without
// reassociating (no -ffast-math needed).
inline float dot(const float* __restrict a, const float* __restrict b, uint32_t d) {
  constexpr uint32_t kLanes = 8;
  float part[kLanes] = {};
  uint32_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    for (uint32_t j = 0; j < kLanes; ++j)
      part[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < d; ++i)
    tail += a[i] * b[i];
  for (uint32_t w = kLanes / 2; w > 0; w /= 2) {
    for (uint32_t j = 0; j < w; ++j)
      part[j] += part[j + w];
  }
  return part[0] + tail;
}

// Validation -------------------------------------------------------------------------------------

std::string check_pool(const PagedKv& kv, uint32_t layer, uint32_t num_q_heads) {
  const Geometry& g = kv.geometry;
  if (std::string e = validate(g); !e.empty()) return "kv.geometry: " + e;
  if (g.head_dim > kMaxHeadDim) {
    return "kv.geometry: head_dim " + std::to_string(g.head_dim) + " exceeds the CPU kernels' " +
           std::to_string(kMaxHeadDim);
  }
  if (kv.base == nullptr) return "kv.base is null";
  if (kv.page_stride < page_data_bytes(g)) {
    return "kv.page_stride " + std::to_string(kv.page_stride) + " is below the page's " +
           std::to_string(page_data_bytes(g)) + " data bytes";
  }
  const uint32_t bytes = dtype_bytes(g.dtype);
  if (reinterpret_cast<uintptr_t>(kv.base) % bytes != 0 || kv.page_stride % bytes != 0) {
    return "kv.base and kv.page_stride must be multiples of the dtype's " + std::to_string(bytes) +
           " bytes";
  }
  if (dtype_is_quantized(g.dtype) && kv.scales == nullptr) {
    return "kv.scales is null for an 8-bit pool";
  }
  if (layer >= g.layers) {
    return "layer " + std::to_string(layer) + " is not below the pool's " +
           std::to_string(g.layers) + " layers";
  }
  if (num_q_heads == 0 || num_q_heads % g.kv_heads != 0) {
    return "num_q_heads " + std::to_string(num_q_heads) +
           " is not a positive multiple of kv_heads " + std::to_string(g.kv_heads);
  }
  return {};
}

// Checks sequence s's context length and the block-table entries that its tokens use.
std::string check_sequence(const PageId* block_tables, uint32_t stride, uint32_t s, uint32_t ctx,
                           uint32_t tokens_per_page, uint32_t num_pages) {
  const std::string name = "[" + std::to_string(s) + "]";
  if (ctx == 0) return "context_lens" + name + " is 0";
  const uint64_t pages = (uint64_t{ctx} + tokens_per_page - 1) / tokens_per_page;
  if (pages > stride) {
    return "context_lens" + name + " = " + std::to_string(ctx) + " needs " + std::to_string(pages) +
           " pages, more than block_table_stride " + std::to_string(stride);
  }
  const PageId* row = block_tables + size_t{s} * stride;
  for (uint64_t i = 0; i < pages; ++i) {
    if (row[i] >= num_pages) {
      return "block_tables" + name + "[" + std::to_string(i) + "] = " + std::to_string(row[i]) +
             " is not below num_pages " + std::to_string(num_pages);
    }
  }
  return {};
}

// Work -------------------------------------------------------------------------------------------

constexpr uint64_t kDirect = UINT64_MAX;

struct Item {
  uint32_t seq;
  uint32_t head;
  uint32_t chunk;
  uint32_t num_chunks;
  uint64_t scratch;  // first (item, query head) row in the scratch buffers, or kDirect
};

struct Workspace {
  std::vector<float> k, v, scores;
  Workspace(uint32_t d, uint32_t group) : k(d), v(d), scores(group) {}
};

// Computes item `it` into acc[group][D] and st[group] (unnormalised online-softmax states).
void run_chunk(const DecodeArgs& a, const Item& it, uint32_t chunk, Workspace& ws, float* acc,
               SoftmaxStats* st) {
  const Geometry& g = a.kv.geometry;
  const uint32_t d = g.head_dim;
  const uint32_t t_page = g.tokens_per_page;
  const uint32_t group = a.num_q_heads / g.kv_heads;
  const uint64_t row_bytes = uint64_t{d} * dtype_bytes(g.dtype);
  const bool quantized = dtype_is_quantized(g.dtype);
  const auto* base = static_cast<const std::byte*>(a.kv.base);
  const PageId* table = a.block_tables + size_t{it.seq} * a.block_table_stride;
  const float* q = a.q + (size_t{it.seq} * a.num_q_heads + size_t{it.head} * group) * d;

  for (uint32_t h = 0; h < group; ++h)
    st[h] = SoftmaxStats{};
  std::fill(acc, acc + size_t{group} * d, 0.0f);

  const uint32_t ctx = a.context_lens[it.seq];
  const uint32_t begin = it.chunk * chunk;  // a page boundary: chunk is a multiple of t_page
  const uint64_t end = std::min<uint64_t>(ctx, uint64_t{begin} + chunk);
  for (uint64_t t0 = begin; t0 < end; t0 += t_page) {
    const PageId page = table[t0 / t_page];
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(t_page, end - t0));
    const std::byte* p = base + uint64_t{page} * a.kv.page_stride;
    const std::byte* k_tile = p + page_k_offset(g, a.layer, it.head, 0, 0) * dtype_bytes(g.dtype);
    const std::byte* v_tile = p + page_v_offset(g, a.layer, it.head, 0, 0) * dtype_bytes(g.dtype);
    float k_scale = 1.0f;
    float v_scale = 1.0f;
    if (quantized) {
      const uint64_t idx = ((uint64_t{page} * g.layers + a.layer) * g.kv_heads + it.head) * 2;
      k_scale = a.kv.scales[idx];
      v_scale = a.kv.scales[idx + 1];
    }
    for (uint32_t j = 0; j < n; ++j) {
      load_row(g.dtype, k_tile + j * row_bytes, d, k_scale, ws.k.data());
      for (uint32_t h = 0; h < group; ++h) {
        ws.scores[h] = dot(q + size_t{h} * d, ws.k.data(), d) * a.scale;
      }
      load_row(g.dtype, v_tile + j * row_bytes, d, v_scale, ws.v.data());
      for (uint32_t h = 0; h < group; ++h) {
        softmax_add(st[h], acc + size_t{h} * d, ws.v.data(), static_cast<int>(d), ws.scores[h]);
      }
    }
  }
}

inline void normalise(float* row, uint32_t d, float l) {
  for (uint32_t i = 0; i < d; ++i)
    row[i] /= l;
}

}  // namespace

std::string decode(const DecodeArgs& args, uint32_t num_pages, unsigned threads) {
  if (std::string e = check_pool(args.kv, args.layer, args.num_q_heads); !e.empty()) return e;
  if (args.num_seqs == 0) return {};
  if (args.q == nullptr) return "q is null";
  if (args.out == nullptr) return "out is null";
  if (args.block_tables == nullptr) return "block_tables is null";
  if (args.context_lens == nullptr) return "context_lens is null";
  const Geometry& g = args.kv.geometry;
  uint32_t max_ctx = 0;
  for (uint32_t s = 0; s < args.num_seqs; ++s) {
    const uint32_t ctx = args.context_lens[s];
    if (std::string e = check_sequence(args.block_tables, args.block_table_stride, s, ctx,
                                       g.tokens_per_page, num_pages);
        !e.empty()) {
      return e;
    }
    max_ctx = std::max(max_ctx, ctx);
  }

  unsigned n_threads = threads != 0 ? threads : std::thread::hardware_concurrency();
  if (n_threads == 0) n_threads = 1;
  const uint32_t t_page = g.tokens_per_page;
  uint64_t chunk64 =
      args.split_tokens != 0
          ? (uint64_t{args.split_tokens} + t_page - 1) / t_page * t_page
          : plan_split_tokens(max_ctx, t_page, args.num_seqs, g.kv_heads,
                              static_cast<uint32_t>(std::min(2ull * n_threads, 1ull << 30)),
                              kMinChunkTokens);
  // A chunk longer than every context is one chunk; clamping keeps the arithmetic in 32 bits.
  const uint64_t whole = (uint64_t{max_ctx} + t_page - 1) / t_page * t_page;
  if (chunk64 == 0 || chunk64 > whole) chunk64 = whole;
  const auto chunk = static_cast<uint32_t>(chunk64);

  const uint32_t d = g.head_dim;
  const uint32_t group = args.num_q_heads / g.kv_heads;
  std::vector<Item> items;
  std::vector<float> scratch_acc;
  std::vector<SoftmaxStats> stats;
  std::vector<std::atomic<uint32_t>> pending;  // per (sequence, KV head): chunks not yet done
  try {
    uint64_t num_items = 0;
    uint64_t scratch_rows = 0;
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const uint64_t chunks = (uint64_t{args.context_lens[s]} + chunk - 1) / chunk;
      num_items += chunks * g.kv_heads;
      if (chunks > 1) scratch_rows += chunks * g.kv_heads * group;
    }
    items.reserve(num_items);
    uint64_t row = 0;
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const auto chunks =
          static_cast<uint32_t>((uint64_t{args.context_lens[s]} + chunk - 1) / chunk);
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t c = 0; c < chunks; ++c) {
          items.push_back(Item{s, h, c, chunks, chunks > 1 ? row : kDirect});
          if (chunks > 1) row += group;
        }
      }
    }
    scratch_acc.resize(scratch_rows * d);
    stats.resize(items.size() * group);
    pending = std::vector<std::atomic<uint32_t>>(size_t{args.num_seqs} * g.kv_heads);
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const auto chunks =
          static_cast<uint32_t>((uint64_t{args.context_lens[s]} + chunk - 1) / chunk);
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        pending[size_t{s} * g.kv_heads + h].store(chunks, std::memory_order_relaxed);
      }
    }
  } catch (const std::bad_alloc&) {
    return "out of memory for the decode work list";
  }

  // Items of one (sequence, KV head) are consecutive, so the first chunk's index is i − chunk.
  auto process = [&](size_t i, Workspace& ws) {
    const Item& it = items[i];
    float* out = args.out + (size_t{it.seq} * args.num_q_heads + size_t{it.head} * group) * d;
    SoftmaxStats* st = stats.data() + i * group;
    if (it.scratch == kDirect) {
      run_chunk(args, it, chunk, ws, out, st);
      for (uint32_t h = 0; h < group; ++h)
        normalise(out + size_t{h} * d, d, st[h].l);
      return;
    }
    run_chunk(args, it, chunk, ws, scratch_acc.data() + it.scratch * d, st);
    std::atomic<uint32_t>& left = pending[size_t{it.seq} * g.kv_heads + it.head];
    if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // Last chunk of this (sequence, KV head) to finish: merge all of them in chunk order.
    const size_t first = i - it.chunk;
    for (uint32_t h = 0; h < group; ++h) {
      float* o = out + size_t{h} * d;
      SoftmaxStats acc_st{};
      std::fill(o, o + d, 0.0f);
      for (uint32_t c = 0; c < it.num_chunks; ++c) {
        const Item& ci = items[first + c];
        softmax_merge(acc_st, o, stats[(first + c) * group + h],
                      scratch_acc.data() + (ci.scratch + h) * d, static_cast<int>(d));
      }
      normalise(o, d, acc_st.l);
    }
  };

  const size_t num_items = items.size();
  std::atomic<size_t> next{0};
  auto worker = [&] {
    Workspace ws(d, group);
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < num_items;)
      process(i, ws);
  };
  const auto spawn = static_cast<unsigned>(std::min<size_t>(n_threads, num_items)) - 1;
  std::vector<std::thread> pool;
  pool.reserve(spawn);
  for (unsigned k = 0; k < spawn; ++k) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // fewer threads: the counter hands the remaining items to those that run
    }
  }
  worker();
  for (std::thread& t : pool)
    t.join();
  return {};
}

}  // namespace kvpool::kernels::cpu

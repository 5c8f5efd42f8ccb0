// Paged-attention extend (prefill over a cached prefix) on the CPU (DESIGN §8; arguments and page
// layout in kernels/paged_kv.h).
//
// Algorithm. Sequence s has ctx = context_lens[s] tokens in the pool, the last n = q_offsets[s+1]
// − q_offsets[s] of them new; new token i sits at position ctx − n + i and attends to positions
// 0..ctx − n + i (causal over the cached prefix plus the new tokens). One work item is (sequence,
// KV head, block of up to kQueryBlock new tokens) and serves the whole GQA group of that KV head
// for those tokens: each K row up to the block's last position is read once, converted to a small
// fp32 buffer (8-bit pools: times the page's K scale) and dotted with the query rows of every
// block token that may see it; the V row likewise feeds softmax_add (fp32 online softmax) for
// those rows. The unnormalised accumulators live in the rows of `out` the item owns and are
// divided by l at the end. Work items are handed to `threads` std::threads through one atomic
// counter.
//
// Invariants:
//  - only slots of real tokens (t < context_lens[s]) are read, and a query never sees a position
//    after its own: page tails, other layers and unused block-table entries are never touched;
//  - each output row is written by one item only, so the result does not depend on threads;
//  - every argument is checked before anything is written; an error leaves `out` untouched;
//  - nothing allocates per token: each thread owns two fp32 row buffers and the block's scores
//    and softmax states.
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

namespace kvpool::kernels::cpu {
namespace {

// The helpers below up to "Work" are the same as in decode.cpp.

// softmax_add / softmax_merge take the row length as an int; this keeps it far from INT_MAX.
constexpr uint32_t kMaxHeadDim = 1u << 16;
// New tokens per work item: their queries share every K and V row read for the block.
constexpr uint32_t kQueryBlock = 16;

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

struct Item {
  uint32_t seq;
  uint32_t head;
  uint32_t block;
};

struct Workspace {
  std::vector<float> k, v, scores;
  std::vector<SoftmaxStats> stats;
  Workspace(uint32_t d, uint32_t rows) : k(d), v(d), scores(rows), stats(rows) {}
};

void run_block(const ExtendArgs& a, const Item& it, Workspace& ws) {
  const Geometry& g = a.kv.geometry;
  const uint32_t d = g.head_dim;
  const uint32_t t_page = g.tokens_per_page;
  const uint32_t group = a.num_q_heads / g.kv_heads;
  const uint64_t row_bytes = uint64_t{d} * dtype_bytes(g.dtype);
  const bool quantized = dtype_is_quantized(g.dtype);
  const auto* base = static_cast<const std::byte*>(a.kv.base);
  const PageId* table = a.block_tables + size_t{it.seq} * a.block_table_stride;

  const uint32_t ctx = a.context_lens[it.seq];
  const uint32_t q_begin = a.q_offsets[it.seq];
  const uint32_t n_new = a.q_offsets[it.seq + 1] - q_begin;
  const uint32_t first_pos = ctx - n_new;  // position of new token 0
  const uint32_t i0 = it.block * kQueryBlock;
  const auto i1 = static_cast<uint32_t>(std::min<uint64_t>(n_new, uint64_t{i0} + kQueryBlock));
  // Query row (new token i, head h of the group): q and out share the layout.
  auto row = [&](uint32_t i) {
    return (size_t{q_begin} + i) * a.num_q_heads * d + size_t{it.head} * group * d;
  };
  for (uint32_t i = i0; i < i1; ++i) {
    std::fill(a.out + row(i), a.out + row(i) + size_t{group} * d, 0.0f);
  }
  std::fill(ws.stats.begin(), ws.stats.end(), SoftmaxStats{});

  const uint64_t keys = uint64_t{first_pos} + i1;  // the block's last token sees keys [0, keys)
  for (uint64_t t0 = 0; t0 < keys; t0 += t_page) {
    const PageId page = table[t0 / t_page];
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(t_page, keys - t0));
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
      const uint64_t key = t0 + j;
      // New token i sees this key when first_pos + i ≥ key.
      const auto i_start =
          key > uint64_t{first_pos} + i0 ? static_cast<uint32_t>(key - first_pos) : i0;
      load_row(g.dtype, k_tile + j * row_bytes, d, k_scale, ws.k.data());
      for (uint32_t i = i_start; i < i1; ++i) {
        const float* q = a.q + row(i);
        float* s = ws.scores.data() + size_t{i - i0} * group;
        for (uint32_t h = 0; h < group; ++h)
          s[h] = dot(q + size_t{h} * d, ws.k.data(), d) * a.scale;
      }
      load_row(g.dtype, v_tile + j * row_bytes, d, v_scale, ws.v.data());
      for (uint32_t i = i_start; i < i1; ++i) {
        float* o = a.out + row(i);
        const size_t r = size_t{i - i0} * group;
        for (uint32_t h = 0; h < group; ++h) {
          softmax_add(ws.stats[r + h], o + size_t{h} * d, ws.v.data(), static_cast<int>(d),
                      ws.scores[r + h]);
        }
      }
    }
  }
  for (uint32_t i = i0; i < i1; ++i) {
    float* o = a.out + row(i);
    const size_t r = size_t{i - i0} * group;
    for (uint32_t h = 0; h < group; ++h) {
      const float l = ws.stats[r + h].l;
      for (uint32_t x = 0; x < d; ++x)
        o[size_t{h} * d + x] /= l;
    }
  }
}

}  // namespace

std::string extend(const ExtendArgs& args, uint32_t num_pages, unsigned threads) {
  if (std::string e = check_pool(args.kv, args.layer, args.num_q_heads); !e.empty()) return e;
  if (args.num_seqs == 0) return {};
  if (args.q_offsets == nullptr) return "q_offsets is null";
  if (args.block_tables == nullptr) return "block_tables is null";
  if (args.context_lens == nullptr) return "context_lens is null";
  if (args.q_offsets[0] != 0) return "q_offsets[0] is not 0";
  const Geometry& g = args.kv.geometry;
  for (uint32_t s = 0; s < args.num_seqs; ++s) {
    const uint32_t ctx = args.context_lens[s];
    if (std::string e = check_sequence(args.block_tables, args.block_table_stride, s, ctx,
                                       g.tokens_per_page, num_pages);
        !e.empty()) {
      return e;
    }
    const std::string next = "q_offsets[" + std::to_string(s + 1) + "]";
    if (args.q_offsets[s + 1] < args.q_offsets[s]) {
      return next + " is below q_offsets[" + std::to_string(s) + "]";
    }
    if (args.q_offsets[s + 1] - args.q_offsets[s] > ctx) {
      return next + " − q_offsets[" + std::to_string(s) +
             "] = " + std::to_string(args.q_offsets[s + 1] - args.q_offsets[s]) +
             " new tokens exceed context_lens[" + std::to_string(s) + "] = " + std::to_string(ctx);
    }
  }
  if (args.q_offsets[args.num_seqs] == 0) return {};  // no new tokens at all
  if (args.q == nullptr) return "q is null";
  if (args.out == nullptr) return "out is null";

  const uint32_t d = g.head_dim;
  const uint32_t group = args.num_q_heads / g.kv_heads;
  std::vector<Item> items;
  try {
    uint64_t num_items = 0;
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const uint32_t n_new = args.q_offsets[s + 1] - args.q_offsets[s];
      num_items +=
          uint64_t{n_new / kQueryBlock + (n_new % kQueryBlock != 0 ? 1u : 0u)} * g.kv_heads;
    }
    items.reserve(num_items);
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const uint32_t n_new = args.q_offsets[s + 1] - args.q_offsets[s];
      const uint32_t blocks = n_new / kQueryBlock + (n_new % kQueryBlock != 0 ? 1u : 0u);
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        for (uint32_t b = 0; b < blocks; ++b)
          items.push_back(Item{s, h, b});
      }
    }
  } catch (const std::bad_alloc&) {
    return "out of memory for the extend work list";
  }

  unsigned n_threads = threads != 0 ? threads : std::thread::hardware_concurrency();
  if (n_threads == 0) n_threads = 1;
  const size_t num_items = items.size();
  std::atomic<size_t> next{0};
  auto worker = [&] {
    Workspace ws(d, kQueryBlock * group);
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < num_items;) {
      run_block(args, items[i], ws);
    }
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

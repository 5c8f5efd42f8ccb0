// Paged-attention extend (prefill over a cached prefix) on the CPU (DESIGN §8; arguments and page
// layouts in kernels/paged_kv.h). Rows are read one at a time, tile.row_stride apart, so both
// layouts run the same loop.
//
// Algorithm. Sequence s has ctx = context_lens[s] tokens in the pool, the last n = q_offsets[s+1] −
// q_offsets[s] of them new; new token i sits at position ctx − n + i and attends to positions
// 0..ctx − n + i (causal over the cached prefix plus the new tokens), or from the first key its
// sliding window or attention chunk lets it see (AttentionMask): keys before the block's first
// token's first visible key are never read, and a later key feeds only the block tokens that see
// it. One work item is (sequence, KV head, block of up to kQueryBlock new tokens) and serves the
// whole GQA group of that KV head for those tokens: each K row up to the block's last position is
// read once, converted to a small fp32 buffer (8-bit pools: times the page's K scale) and dotted
// with the query rows of every block token that may see it (dot_heads, attention_common.h); the V
// row likewise feeds softmax_add (fp32 online softmax) for those rows. The unnormalised
// accumulators live in the rows of `out` the item owns and are divided by l at the end (l plus
// e^{sink − m} with attention sinks). Work items are handed to `threads` std::threads through one
// atomic counter. A latent (MLA) pool's value row is the leading value_dim elements of the key
// row already converted (kernels/paged_kv.h), so only K is read; out rows are value_dim wide. In a
// mixed-precision call (MixedPrecision) each page is read from the pool its block-table entry
// names, in that pool's dtype.
//
// Invariants:
//  - only slots of real tokens (t < context_lens[s]) are read, and a query never sees a position
//    after its own: page tails, other layers and unused block-table entries are never touched;
//  - each output row is written by one item only, so the result does not depend on threads;
//  - every argument is checked before anything is written; an error leaves `out` untouched;
//  - nothing allocates per token: each thread owns two fp32 row buffers, the dot products' partial
//    sums, and the block's scores and softmax states.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/online_softmax.h"

namespace kvpool::kernels::cpu {
namespace {

// New tokens per work item: their queries share every K and V row read for the block.
constexpr uint32_t kQueryBlock = 16;

// Work -------------------------------------------------------------------------------------------

struct Item {
  uint32_t seq;
  uint32_t head;
  uint32_t block;
};

struct Workspace {
  std::vector<float> k, v, scores, part;
  std::vector<SoftmaxStats> stats;
  std::vector<uint32_t> first;  // per block token: its first visible key
  Workspace(uint32_t d, uint32_t rows, uint32_t group)
      : k(d),
        v(d),
        scores(rows),
        part(size_t{group} * detail::kDotLanes),
        stats(rows),
        first(kQueryBlock) {}
};

void run_block(const ExtendArgs& a, const Item& it, Workspace& ws) {
  const Geometry& g = a.kv.geometry;
  const uint32_t d = g.head_dim;
  const uint32_t dv = value_width(g, a.value_dim);
  const bool latent = g.kind == AttentionKind::latent;
  const uint32_t t_page = g.tokens_per_page;
  const uint32_t group = a.num_q_heads / g.kv_heads;
  const PageId* table = a.block_tables + size_t{it.seq} * a.block_table_stride;
  const detail::CallPools pools(a.kv, a.mixed);
  const uint32_t older = detail::older_count(a.mixed, it.seq);

  const uint32_t ctx = a.context_lens[it.seq];
  const uint32_t q_begin = a.q_offsets[it.seq];
  const uint32_t n_new = a.q_offsets[it.seq + 1] - q_begin;
  const uint32_t first_pos = ctx - n_new;  // position of new token 0
  const uint32_t i0 = it.block * kQueryBlock;
  const auto i1 = static_cast<uint32_t>(std::min<uint64_t>(n_new, uint64_t{i0} + kQueryBlock));
  // The first query and output rows of new token i for the item's group: rows of d and dv.
  auto q_row = [&](uint32_t i) {
    return (size_t{q_begin} + i) * a.num_q_heads * d + size_t{it.head} * group * d;
  };
  auto out_row = [&](uint32_t i) {
    return (size_t{q_begin} + i) * a.num_q_heads * dv + size_t{it.head} * group * dv;
  };
  for (uint32_t i = i0; i < i1; ++i) {
    std::fill(a.out + out_row(i), a.out + out_row(i) + size_t{group} * dv, 0.0f);
  }
  std::fill(ws.stats.begin(), ws.stats.end(), SoftmaxStats{});

  // The first key each block token sees (non-decreasing in the token): the block's keys run from
  // its first token's first key to its last token.
  for (uint32_t i = i0; i < i1; ++i)
    ws.first[i - i0] = first_visible_key(a.mask, first_pos + i);
  const uint64_t lo = ws.first[0];
  const uint64_t keys = uint64_t{first_pos} + i1;  // the block's last token sees keys [.., keys)
  uint32_t i_end = i0;  // block tokens [.., i_end) see the current key through the mask
  for (uint64_t t0 = lo / t_page * t_page; t0 < keys; t0 += t_page) {
    // The page's pool: the older one for the sequence's leading entries (mixed precision).
    const int w = detail::CallPools::at(t0 / t_page, older);
    const KvDtype dtype = pools.kv[w]->geometry.dtype;
    const detail::HeadTile tile =
        detail::head_tile(*pools.kv[w], pools.strides[w], a.layer, table[t0 / t_page], it.head);
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(t_page, keys - t0));
    for (auto j = static_cast<uint32_t>(t0 < lo ? lo - t0 : 0); j < n; ++j) {
      const uint64_t key = t0 + j;
      // New token i sees this key when first_pos + i ≥ key (causality) and its first visible key
      // is at or before it (the mask); both hold for one run of block tokens [i_start, i_end).
      const auto i_start =
          key > uint64_t{first_pos} + i0 ? static_cast<uint32_t>(key - first_pos) : i0;
      while (i_end < i1 && ws.first[i_end - i0] <= key)
        ++i_end;
      if (i_start >= i_end) continue;
      detail::load_row(dtype, tile.k + j * tile.row_stride, d, tile.k_scale, ws.k.data());
      for (uint32_t i = i_start; i < i_end; ++i) {
        detail::dot_heads(a.q + q_row(i), group, d, ws.k.data(), a.scale, ws.part.data(),
                          ws.scores.data() + size_t{i - i0} * group);
      }
      const float* v = ws.k.data();
      if (!latent) {
        detail::load_row(dtype, tile.v + j * tile.row_stride, d, tile.v_scale, ws.v.data());
        v = ws.v.data();
      }
      for (uint32_t i = i_start; i < i_end; ++i) {
        float* o = a.out + out_row(i);
        const size_t r = size_t{i - i0} * group;
        for (uint32_t h = 0; h < group; ++h) {
          softmax_add(ws.stats[r + h], o + size_t{h} * dv, v, static_cast<int>(dv),
                      ws.scores[r + h]);
        }
      }
    }
  }
  for (uint32_t i = i0; i < i1; ++i) {
    float* o = a.out + out_row(i);
    const size_t r = size_t{i - i0} * group;
    for (uint32_t h = 0; h < group; ++h) {
      const float l = detail::softmax_denominator(a.mask, it.head * group + h, ws.stats[r + h]);
      for (uint32_t x = 0; x < dv; ++x)
        o[size_t{h} * dv + x] /= l;
    }
  }
}

}  // namespace

std::string extend(const ExtendArgs& args, uint32_t num_pages, unsigned threads) {
  if (std::string e = detail::check_pool(args.kv, args.layer, args.num_q_heads); !e.empty()) {
    return e;
  }
  if (std::string e = detail::check_layout(args.kv, num_pages); !e.empty()) return e;
  if (std::string e = detail::check_mask(args.mask); !e.empty()) return e;
  if (std::string e = detail::check_value_dim(args.kv.geometry, args.value_dim); !e.empty()) {
    return e;
  }
  if (std::string e = detail::check_mixed(args.mixed, args.kv, args.layer, args.num_q_heads);
      !e.empty()) {
    return e;
  }
  if (args.num_seqs == 0) return {};
  if (args.q_offsets == nullptr) return "q_offsets is null";
  if (args.block_tables == nullptr) return "block_tables is null";
  if (args.context_lens == nullptr) return "context_lens is null";
  if (args.q_offsets[0] != 0) return "q_offsets[0] is not 0";
  const Geometry& g = args.kv.geometry;
  for (uint32_t s = 0; s < args.num_seqs; ++s) {
    const uint32_t ctx = args.context_lens[s];
    if (ctx == 0) return "context_lens[" + std::to_string(s) + "] is 0";
    const std::string next = "q_offsets[" + std::to_string(s + 1) + "]";
    if (args.q_offsets[s + 1] < args.q_offsets[s]) {
      return next + " is below q_offsets[" + std::to_string(s) + "]";
    }
    if (args.q_offsets[s + 1] - args.q_offsets[s] > ctx) {
      return next + " − q_offsets[" + std::to_string(s) +
             "] = " + std::to_string(args.q_offsets[s + 1] - args.q_offsets[s]) +
             " new tokens exceed context_lens[" + std::to_string(s) + "] = " + std::to_string(ctx);
    }
    // The keys the sequence's first new token sees start the block-table entries read.
    const uint32_t first_pos = ctx - (args.q_offsets[s + 1] - args.q_offsets[s]);
    if (std::string e = detail::check_sequence(
            args.block_tables, args.block_table_stride, s, ctx, g.tokens_per_page, num_pages,
            first_visible_key(args.mask, first_pos), detail::older_count(args.mixed, s),
            args.mixed.older_num_pages);
        !e.empty()) {
      return e;
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

  detail::for_each_item(
      items.size(), threads, [&] { return Workspace(d, kQueryBlock * group, group); },
      [&](size_t i, Workspace& ws) { run_block(args, items[i], ws); });
  return {};
}

}  // namespace kvpool::kernels::cpu

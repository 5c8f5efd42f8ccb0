// Paged-attention decode on the CPU (DESIGN §8; arguments and page layouts in kernels/paged_kv.h).
//
// Algorithm. The keys a sequence's query sees (all its context, or from the first key its
// sliding window or attention chunk lets it see: AttentionMask) are cut into split chunks of
// `chunk` tokens, a multiple of tokens_per_page (DecodeArgs::split_tokens rounded up to pages, or
// plan_split_tokens when it is 0), counted from the page that holds the first visible key; keys
// before it in that page are skipped. Pages wholly before it are never read. One work item is
// (sequence, KV head, chunk) and serves the whole GQA group of that KV head. It walks the chunk in
// blocks of up to kBlock tokens of one page: the block's K rows are converted to fp32 once (8-bit
// pools: times the page's K scale) and dotted with all the group's query rows (dot_partials: each K
// element loaded once per kDotHeads query rows, partial sums in registers, folded per block); every
// query row's online-softmax state then takes the block's scores at once (softmax_block_scores:
// block max, one rescale factor per block and row); last the block's V rows are converted once and
// accumulated for the whole group (accumulate_pv: acc · corr + Σ p_j · v_j, a tile of acc held in
// registers while the V rows stream through). A sequence served by one chunk writes its
// unnormalised accumulator straight into `out` and divides by l at the end (l plus e^{sink − m}
// with attention sinks). A sequence with several chunks keeps each chunk's (m, l, acc) in a scratch
// buffer; whichever thread finishes the last chunk of a (sequence, KV head) merges them with
// softmax_merge in chunk order and writes acc / l. Work items are handed to `threads` std::threads
// through one atomic counter (attention_common.h).
//
// Instruction sets (kernels_cpu.h, Isa). A block's four inner loops (K/V row conversion, the
// group's scores, the softmax block update, the P·V accumulation) come from a BlockOps table
// picked once per call: the baseline one (portable C++; online_softmax.h's softmax_block_scores)
// or the AVX2 + FMA + F16C one (attention_avx2.h, when the CPU has it and head_dim and the value
// width are multiples of 8).
// The rest (chunking, prefetching, the merge) is the same code.
//
// Latent (MLA) pools. A latent pool is MQA over one vector per token (kernels/paged_kv.h): the
// whole vector is the key and its leading value_dim elements the value, so a block's rows are
// converted once and serve both the scores and the P·V accumulation (accumulate_pv reads them at
// the key rows' stride); nothing but K is read or prefetched.
//
// Mixed precision (MixedPrecision). A sequence's leading older_pages[s] block-table entries are
// pages of the older pool: run_chunk picks each page's pool (CallPools) and converts its rows from
// that pool's dtype with its scales; blocks never straddle a page, so nothing else changes and a
// chunk may cross from older pages to recent ones.
//
// Prefetching. Pages are scattered, so the hardware prefetchers cannot see the next one coming;
// run_chunk asks for the K and V tiles and scales of the page two ahead, a quarter of the lines
// before each phase of a block (a 64-line burst would stall on the line-fill buffers).
//
// Layouts. A (page, layer, KV head) tile is addressed through kv_strides; its rows are contiguous
// in page_major (one load_row per block, as always) and kv_heads · head_dim elements apart in
// layer_major (one load_row per row). Everything past the conversion works on the fp32 block and
// is the same code for both. What differs is the work item: in page_major it is one KV head (its
// tile is one run of memory); in layer_major it is every KV head of the layer, taken head after
// head within each page, because there the page's rows of all heads form one run (T · H · D
// elements) and one head's rows are scattered through it: an item per head read each run H
// times, a stride-H·D walk the hardware prefetchers follow badly, and could prefetch only its
// own rows. The split plan then counts sequences, not (sequence, KV head) pairs.
//
// Invariants:
//  - only slots of real tokens (t < context_lens[s]) are read: the tail of the last page, other
//    layers and the unused block-table entries are never touched, whatever they hold;
//  - the merge order is fixed (chunk 0, 1, …), so for a given chunk size the output is the same
//    bit for bit whatever the thread count or the scheduling;
//  - every argument is checked before anything is written; an error leaves `out` untouched;
//  - blocks never straddle a page and the block split depends only on the chunk size and the
//    first visible key, so the rounding (block maxima included) is fixed for a given chunk size;
//  - nothing allocates per token: each thread owns a block of fp32 K and V rows, the block's
//    partial sums and scores, and the group's rescale factors.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/attention_avx2.h"
#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/online_softmax.h"
#include "kernels/split_plan.h"

namespace kvpool::kernels::cpu {
namespace {

using detail::HeadTile;

// Smallest planned chunk: shorter chunks cost more in merging than they gain in parallelism.
constexpr uint32_t kMinChunkTokens = 512;
// Keys per softmax block: the group's running states are rescaled once per block.
constexpr uint32_t kBlock = 16;
// Accumulator floats that accumulate_pv keeps in registers while it streams a block's V rows.
constexpr uint32_t kTile = 16;
// Prefetch stride over the next page's tiles.
constexpr uint64_t kCacheLine = 64;

// Work -------------------------------------------------------------------------------------------

constexpr uint64_t kDirect = UINT64_MAX;

struct Item {
  uint32_t seq;
  uint32_t head;  // the first of the item's KV heads
  uint32_t chunk;
  uint32_t num_chunks;
  uint64_t scratch;  // first (item, query head) row in the scratch buffers, or kDirect
};

// Per-thread buffers, sized once: a block's K and V rows in fp32, the group's scores (then
// probabilities) for the block, and the group's rescale factors.
struct Workspace {
  std::vector<float> k, v, part, p, corr;
  Workspace(uint32_t d, uint32_t group)
      : k(size_t{kBlock} * d),
        v(size_t{kBlock} * d),
        part(size_t{kBlock} * group * detail::kDotLanes),
        p(size_t{kBlock} * group),
        corr(group) {}
};

// acc[h][0..d) = acc[h] · corr[h] + Σ_j p[h · p_stride + j] · v[j] for every query head h of the
// group and the n ≤ kBlock value rows v[j] = v + j · v_stride (v_stride > d when a latent pool's
// value rows are the leading d elements of its key rows). Walks acc in tiles of kTile floats that
// stay in registers while the block's V rows stream through (from L1: the block is kBlock ·
// v_stride floats). Per element the order is fixed: the rescale, then the keys in order, whatever
// the tiling.
void accumulate_pv(float* __restrict acc, const float* __restrict corr, const float* __restrict p,
                   uint32_t p_stride, const float* __restrict v, uint32_t v_stride, uint32_t group,
                   uint32_t n, uint32_t d) {
  for (uint32_t h = 0; h < group; ++h) {
    float* a = acc + size_t{h} * d;
    const float* ph = p + size_t{h} * p_stride;
    const float c = corr[h];
    uint32_t i = 0;
    for (; i + kTile <= d; i += kTile) {
      float t[kTile];
      for (uint32_t x = 0; x < kTile; ++x)
        t[x] = a[i + x] * c;
      for (uint32_t j = 0; j < n; ++j) {
        const float pj = ph[j];
        const float* vj = v + size_t{j} * v_stride + i;
        for (uint32_t x = 0; x < kTile; ++x)
          t[x] += pj * vj[x];
      }
      for (uint32_t x = 0; x < kTile; ++x)
        a[i + x] = t[x];
    }
    for (; i < d; ++i) {
      float t = a[i] * c;
      for (uint32_t j = 0; j < n; ++j)
        t += ph[j] * v[size_t{j} * v_stride + i];
      a[i] = t;
    }
  }
}

// s[h · s_stride + j] = scale · (q_h · k_j) for the group's query rows q_h = q + h · d and the
// n ≤ kBlock fp32 key rows k_j = k + j · d; part is scratch for kBlock · group · kDotLanes floats.
// Each K row is dotted with every query row at once (dot_partials), its lanes folded per row.
void score_block(const float* q, uint32_t group, uint32_t d, const float* k, uint32_t n,
                 float scale, float* s, uint32_t s_stride, float* part) {
  const size_t part_row = size_t{group} * detail::kDotLanes;  // a K row's partial sums
  for (uint32_t j = 0; j < n; ++j)
    detail::dot_partials(q, group, d, k + size_t{j} * d, part + size_t{j} * part_row);
  for (uint32_t h = 0; h < group; ++h) {
    for (uint32_t j = 0; j < n; ++j) {
      s[size_t{h} * s_stride + j] =
          detail::sum_lanes(part + size_t{j} * part_row + size_t{h} * detail::kDotLanes) * scale;
    }
  }
}

// A block's inner loops, in one instruction set (file comment).
struct BlockOps {
  void (*load_row)(KvDtype dtype, const std::byte* src, uint32_t n, float scale, float* dst);
  void (*score_block)(const float* q, uint32_t group, uint32_t d, const float* k, uint32_t n,
                      float scale, float* s, uint32_t s_stride, float* part);
  void (*accumulate_pv)(float* acc, const float* corr, const float* p, uint32_t p_stride,
                        const float* v, uint32_t v_stride, uint32_t group, uint32_t n, uint32_t d);
  float (*softmax_block_scores)(SoftmaxStats& st, float* s, uint32_t n);
};

constexpr BlockOps kBaselineOps{detail::load_row, score_block, accumulate_pv,
                                [](SoftmaxStats& st, float* s, uint32_t n) {
                                  return softmax_block_scores(st, s, static_cast<int>(n));
                                }};

#if KVPOOL_CPU_HAVE_AVX2
constexpr BlockOps kAvx2Ops{detail::avx2::load_row,
                            [](const float* q, uint32_t group, uint32_t d, const float* k,
                               uint32_t n, float scale, float* s, uint32_t s_stride, float*) {
                              detail::avx2::score_block(q, group, d, k, n, scale, s, s_stride);
                            },
                            detail::avx2::accumulate_pv, detail::avx2::softmax_block_scores};
#endif

// Prefetch distance of run_chunk, in pages, and its prefetch calls per block: before each of the
// block's four phases.
constexpr uint64_t kPrefetchPages = 2;
constexpr uint32_t kPrefetchPhases = 4;

// The next page's K and V runs (bytes each; a latent pool's one run, with runs = 1), prefetched
// `per_call` cache lines at a time, K first; an empty NextPage prefetches nothing. An item's rows
// of a page are one run in both layouts (one head's tile in page_major, every head's rows in
// layer_major: file comment).
struct NextPage {
  const std::byte* k = nullptr;
  const std::byte* v = nullptr;
  uint64_t bytes = 0;
  uint64_t runs = 2;
  uint64_t done = 0;  // bytes of K, then of V, asked for so far
  uint64_t per_call = 0;
  void prefetch() {
    for (uint64_t i = 0; i < per_call && done < runs * bytes; ++i, done += kCacheLine)
      __builtin_prefetch(done < bytes ? k + done : v + (done - bytes));
  }
};

// The K and V runs of the item's `heads` heads in the page holding token t (a page boundary) as
// a NextPage, their scales prefetched at once; empty when t is past the chunk's end. The page is
// of the pool its block-table entry names (CallPools; `older`: the sequence's older pages).
NextPage upcoming_page(const DecodeArgs& a, const detail::CallPools& pools, uint32_t older,
                       const PageId* table, uint32_t head, uint32_t heads, uint64_t t,
                       uint64_t end) {
  if (t >= end) return {};
  const uint64_t entry = t / a.kv.geometry.tokens_per_page;
  const int w = detail::CallPools::at(entry, older);
  const PagedKv& kv = *pools.kv[w];
  const Geometry& g = kv.geometry;
  const PageId page = table[entry];
  if (dtype_is_quantized(g.dtype)) {
    // The heads' scales (K and V, or a latent pool's one) are consecutive floats.
    const auto* scales =
        reinterpret_cast<const std::byte*>(detail::head_scales(kv, a.layer, page, head));
    for (uint64_t o = 0; o < uint64_t{heads} * kv_planes(g) * sizeof(float); o += kCacheLine)
      __builtin_prefetch(scales + o);
  }
  const HeadTile tiles = detail::head_tile_addresses(kv, pools.strides[w], a.layer, page, head);
  const uint64_t rows = std::min<uint64_t>(g.tokens_per_page, end - t);
  // A token's bytes of the item's heads: one run when the page's pool has the layout the items
  // were planned for (file comment). In a mixed call whose pools differ in layout, a page of the
  // other layout gets part of its rows prefetched: a speed matter only, prefetches never fault.
  const uint64_t row_bytes = uint64_t{heads} * g.head_dim * dtype_bytes(g.dtype);
  return NextPage{.k = tiles.k, .v = tiles.v, .bytes = rows * row_bytes, .runs = kv_planes(g)};
}

// Computes item `it`, KV heads [it.head, it.head + heads), into acc[heads · group][DV] and
// st[heads · group] (unnormalised online-softmax states, the heads' query rows in order; DV the
// value width). Page by page, head by head, keys go in blocks of up to kBlock tokens of one page:
// the block's K rows are converted once and dotted with every query row of the head's group, each
// state takes the block's scores at once (softmax_block_scores: one rescale per block), then the
// block's V rows are converted once and accumulated for the whole group. A latent pool's V rows
// are the leading DV elements of the K rows already converted, so nothing more is read.
void run_chunk(const DecodeArgs& a, const BlockOps& ops, const Item& it, uint32_t chunk,
               uint32_t heads, Workspace& ws, float* acc, SoftmaxStats* st) {
  const Geometry& g = a.kv.geometry;
  const uint32_t d = g.head_dim;
  const uint32_t dv = value_width(g, a.value_dim);
  const bool latent = g.kind == AttentionKind::latent;
  const uint32_t t_page = g.tokens_per_page;
  const uint32_t group = a.num_q_heads / g.kv_heads;
  const uint32_t rows = heads * group;
  const PageId* table = a.block_tables + size_t{it.seq} * a.block_table_stride;
  const float* q0 = a.q + (size_t{it.seq} * a.num_q_heads + size_t{it.head} * group) * d;
  const detail::CallPools pools(a.kv, a.mixed);
  const uint32_t older = detail::older_count(a.mixed, it.seq);
  float* kb = ws.k.data();
  float* vb = ws.v.data();
  float* part = ws.part.data();
  float* p = ws.p.data();

  for (uint32_t h = 0; h < rows; ++h)
    st[h] = SoftmaxStats{};
  std::fill(acc, acc + size_t{rows} * dv, 0.0f);

  const uint32_t ctx = a.context_lens[it.seq];
  // The keys the query sees start at `first`; chunks count from the page that holds it, so each
  // chunk starts on a page boundary (chunk is a multiple of t_page) and sees at least one key.
  const uint32_t first = first_visible_key(a.mask, ctx - 1);
  const uint64_t begin = uint64_t{first} / t_page * t_page + uint64_t{it.chunk} * chunk;
  const uint64_t end = std::min<uint64_t>(ctx, begin + chunk);
  for (uint64_t t0 = begin; t0 < end; t0 += t_page) {
    const auto in_page = static_cast<uint32_t>(std::min<uint64_t>(t_page, end - t0));
    const auto skip = static_cast<uint32_t>(t0 < first ? first - t0 : 0);  // keys before the mask
    // The pages of a sequence are scattered, so the hardware prefetcher cannot see the next ones
    // coming: ask for the K and V tiles (and scales) of the page kPrefetchPages ahead while this
    // one is being computed, spread over the page's phases rather than in one burst, which would
    // stall the core once the line-fill buffers are full. The chunk's first page asks for the
    // pages in between at once.
    if (t0 == begin) {
      for (uint64_t ahead = 1; ahead < kPrefetchPages; ++ahead) {
        NextPage page =
            upcoming_page(a, pools, older, table, it.head, heads, t0 + ahead * t_page, end);
        page.per_call = UINT64_MAX;
        page.prefetch();
      }
    }
    NextPage next =
        upcoming_page(a, pools, older, table, it.head, heads, t0 + kPrefetchPages * t_page, end);
    // A latent block has no V rows to convert: one prefetch call fewer.
    const uint64_t phases = uint64_t{latent ? kPrefetchPhases - 1 : kPrefetchPhases} * heads *
                            ((in_page - skip + kBlock - 1) / kBlock);
    next.per_call = (next.runs * next.bytes / kCacheLine + phases - 1) / phases;
    // The page's pool: the older one for the sequence's leading `older` entries (mixed
    // precision), whose dtype the rows are converted from; the rest is the same code.
    const int w = detail::CallPools::at(t0 / t_page, older);
    const KvDtype dtype = pools.kv[w]->geometry.dtype;
    for (uint32_t hh = 0; hh < heads; ++hh) {
      const HeadTile tile = detail::head_tile(*pools.kv[w], pools.strides[w], a.layer,
                                              table[t0 / t_page], it.head + hh);
      const float* q = q0 + size_t{hh} * group * d;
      float* acc_h = acc + size_t{hh} * group * dv;
      SoftmaxStats* st_h = st + size_t{hh} * group;
      for (uint32_t j0 = skip; j0 < in_page; j0 += kBlock) {
        const uint32_t n = std::min(kBlock, in_page - j0);
        next.prefetch();
        detail::load_rows(ops.load_row, dtype, tile.k + j0 * tile.row_stride, tile.row_stride, n, d,
                          tile.k_scale, kb);
        next.prefetch();
        ops.score_block(q, group, d, kb, n, a.scale, p, kBlock, part);
        for (uint32_t h = 0; h < group; ++h)
          ws.corr[h] = ops.softmax_block_scores(st_h[h], p + size_t{h} * kBlock, n);
        next.prefetch();
        if (latent) {
          ops.accumulate_pv(acc_h, ws.corr.data(), p, kBlock, kb, d, group, n, dv);
          continue;
        }
        detail::load_rows(ops.load_row, dtype, tile.v + j0 * tile.row_stride, tile.row_stride, n, d,
                          tile.v_scale, vb);
        next.prefetch();
        ops.accumulate_pv(acc_h, ws.corr.data(), p, kBlock, vb, d, group, n, d);
      }
    }
  }
}

inline void normalise(float* row, uint32_t d, float l) {
  for (uint32_t i = 0; i < d; ++i)
    row[i] /= l;
}

// The inner loops for `isa` on this pool, or an error when it was forced and cannot run.
std::string pick_ops(Isa isa, uint32_t head_dim, uint32_t value_dim, const BlockOps*& ops) {
  const bool dim_ok = head_dim % detail::avx2::kAvx2HeadDimMultiple == 0 &&
                      value_dim % detail::avx2::kAvx2HeadDimMultiple == 0;
  switch (isa) {
    case Isa::automatic:
      ops = &kBaselineOps;
#if KVPOOL_CPU_HAVE_AVX2
      if (dim_ok && detail::avx2::supported()) ops = &kAvx2Ops;
#endif
      return {};
    case Isa::baseline:
      ops = &kBaselineOps;
      return {};
    case Isa::avx2:
      if (!isa_supported(Isa::avx2)) return "isa avx2 is not supported by this CPU or build";
      if (!dim_ok) {
        return "isa avx2 needs a head_dim and value_dim that are multiples of " +
               std::to_string(detail::avx2::kAvx2HeadDimMultiple) + ", not " +
               std::to_string(head_dim) + " and " + std::to_string(value_dim);
      }
#if KVPOOL_CPU_HAVE_AVX2
      ops = &kAvx2Ops;
#endif
      return {};
  }
  return "unknown isa";
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::automatic:
      return "automatic";
    case Isa::baseline:
      return "baseline";
    case Isa::avx2:
      return "avx2";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  return isa != Isa::avx2 || detail::avx2::supported();
}

std::string decode(const DecodeArgs& args, uint32_t num_pages, unsigned threads, Isa isa) {
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
  const uint32_t dv = value_width(args.kv.geometry, args.value_dim);
  const BlockOps* ops = nullptr;
  if (std::string e = pick_ops(isa, args.kv.geometry.head_dim, dv, ops); !e.empty()) return e;
  if (args.num_seqs == 0) return {};
  if (args.q == nullptr) return "q is null";
  if (args.out == nullptr) return "out is null";
  if (args.block_tables == nullptr) return "block_tables is null";
  if (args.context_lens == nullptr) return "context_lens is null";
  const Geometry& g = args.kv.geometry;
  const uint32_t t_page = g.tokens_per_page;
  // The tokens a sequence's chunks cover: from the page holding its first visible key to its end.
  const auto span = [&](uint32_t s) {
    const uint32_t ctx = args.context_lens[s];
    return ctx - first_visible_key(args.mask, ctx - 1) / t_page * t_page;
  };
  uint32_t max_span = 0;
  for (uint32_t s = 0; s < args.num_seqs; ++s) {
    const uint32_t ctx = args.context_lens[s];
    if (std::string e = detail::check_sequence(
            args.block_tables, args.block_table_stride, s, ctx, g.tokens_per_page, num_pages,
            ctx == 0 ? 0 : first_visible_key(args.mask, ctx - 1),
            detail::older_count(args.mixed, s), args.mixed.older_num_pages);
        !e.empty()) {
      return e;
    }
    max_span = std::max(max_span, span(s));
  }

  const unsigned n_threads = detail::resolve_threads(threads);
  uint64_t chunk64 =
      args.split_tokens != 0
          ? (uint64_t{args.split_tokens} + t_page - 1) / t_page * t_page
          : plan_split_tokens(max_span, t_page, args.num_seqs,
                              args.kv.layout == KvLayout::layer_major ? 1 : g.kv_heads,
                              static_cast<uint32_t>(std::min(2ull * n_threads, 1ull << 30)),
                              kMinChunkTokens);
  // A chunk longer than every span is one chunk; the last clamp keeps it in 32 bits (a span
  // within a page of 2^32 tokens rounds up past them).
  const uint64_t whole = (uint64_t{max_span} + t_page - 1) / t_page * t_page;
  if (chunk64 == 0 || chunk64 > whole) chunk64 = whole;
  chunk64 = std::min<uint64_t>(chunk64, uint64_t{UINT32_MAX} / t_page * t_page);
  const auto chunk = static_cast<uint32_t>(chunk64);

  const uint32_t d = g.head_dim;
  const uint32_t group = args.num_q_heads / g.kv_heads;
  // Heads per work item: every head of the layer in layer_major, where a page's rows of all
  // heads are one contiguous run (file comment); one in page_major, where each head's tile is.
  const uint32_t heads = args.kv.layout == KvLayout::layer_major ? g.kv_heads : 1;
  const uint32_t units = g.kv_heads / heads;  // work items per (sequence, chunk)
  const uint32_t rows = heads * group;        // query rows per item
  std::vector<Item> items;
  std::vector<float> scratch_acc;
  std::vector<SoftmaxStats> stats;
  std::vector<std::atomic<uint32_t>> pending;  // per (sequence, KV head): chunks not yet done
  try {
    uint64_t num_items = 0;
    uint64_t scratch_rows = 0;
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const uint64_t chunks = (uint64_t{span(s)} + chunk - 1) / chunk;
      num_items += chunks * units;
      if (chunks > 1) scratch_rows += chunks * units * rows;
    }
    items.reserve(num_items);
    uint64_t row = 0;
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const auto chunks = static_cast<uint32_t>((uint64_t{span(s)} + chunk - 1) / chunk);
      for (uint32_t h = 0; h < g.kv_heads; h += heads) {
        for (uint32_t c = 0; c < chunks; ++c) {
          items.push_back(Item{s, h, c, chunks, chunks > 1 ? row : kDirect});
          if (chunks > 1) row += rows;
        }
      }
    }
    scratch_acc.resize(scratch_rows * dv);
    stats.resize(items.size() * rows);
    pending = std::vector<std::atomic<uint32_t>>(size_t{args.num_seqs} * g.kv_heads);
    for (uint32_t s = 0; s < args.num_seqs; ++s) {
      const auto chunks = static_cast<uint32_t>((uint64_t{span(s)} + chunk - 1) / chunk);
      for (uint32_t h = 0; h < g.kv_heads; ++h) {
        pending[size_t{s} * g.kv_heads + h].store(chunks, std::memory_order_relaxed);
      }
    }
  } catch (const std::bad_alloc&) {
    return "out of memory for the decode work list";
  }

  // Items of one (sequence, KV heads) are consecutive, so the first chunk's index is i − chunk.
  auto process = [&](size_t i, Workspace& ws) {
    const Item& it = items[i];
    float* out = args.out + (size_t{it.seq} * args.num_q_heads + size_t{it.head} * group) * dv;
    SoftmaxStats* st = stats.data() + i * rows;
    if (it.scratch == kDirect) {
      run_chunk(args, *ops, it, chunk, heads, ws, out, st);
      for (uint32_t h = 0; h < rows; ++h) {
        normalise(out + size_t{h} * dv, dv,
                  detail::softmax_denominator(args.mask, it.head * group + h, st[h]));
      }
      return;
    }
    run_chunk(args, *ops, it, chunk, heads, ws, scratch_acc.data() + it.scratch * dv, st);
    std::atomic<uint32_t>& left = pending[size_t{it.seq} * g.kv_heads + it.head];
    if (left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    // Last chunk of this (sequence, KV heads) to finish: merge all of them in chunk order.
    const size_t first = i - it.chunk;
    for (uint32_t h = 0; h < rows; ++h) {
      float* o = out + size_t{h} * dv;
      SoftmaxStats acc_st{};
      std::fill(o, o + dv, 0.0f);
      for (uint32_t c = 0; c < it.num_chunks; ++c) {
        const Item& ci = items[first + c];
        softmax_merge(acc_st, o, stats[(first + c) * rows + h],
                      scratch_acc.data() + (ci.scratch + h) * dv, static_cast<int>(dv));
      }
      normalise(o, dv, detail::softmax_denominator(args.mask, it.head * group + h, acc_st));
    }
  };
  detail::for_each_item(
      items.size(), n_threads, [&] { return Workspace(d, group); }, process);
  return {};
}

}  // namespace kvpool::kernels::cpu

// Convert-pages on the CPU (kernels/paged_kv.h, ConvertPagesArgs): re-encodes whole pages of one
// pool into pages of another of the same shape, in another dtype or layout.
//
// Per pair and per (layer, KV head, K|V) tile (a latent pool: its one vector per token), the tile's
// tokens_per_page rows are dequantised into fp32 (load_row: 8-bit sources times their scale),
// then encoded into the destination's tile: into 8 bits with the scale max(amax, kMinAmax) / R
// (R = kFp8Max or kInt8Max; amax over the tile, NaN ignored) and x̂ = q(x · (1 / scale)), the
// append kernel's quantiser (f32_to_fp8_e4m3, f32_to_int8); into 16 bits by rounding each element
// once (f32_to_bf16, f32_to_fp16). One scale per tile, from the whole tile at once, is the best a
// per-tile scale can do for the tile; the append path's running scale can only match it.
//
// Everything is validated before a byte is written, so an error leaves both pools as they were:
// both pools usable and of one shape, every id below its pool's page count, destinations
// distinct. Source and destination are two pools (a page moving within one pool is copy_pages).
// Pairs are independent (they read one pool and write the other), so their order does not matter.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"

namespace kvpool::kernels::cpu {

namespace {

// The checks a pool of a conversion must pass, its role ("src" or "dst") naming it.
std::string check_convert_pool(const PagedKv& kv, uint32_t num_pages, const char* role) {
  const std::string name = std::string("convert_pages: ") + role;
  if (std::string e = validate(kv.geometry); !e.empty()) return name + ".geometry: " + e;
  if (kv.base == nullptr) return name + ".base is null";
  if (kv.layout == KvLayout::page_major && kv.page_stride < page_data_bytes(kv.geometry)) {
    return name + ".page_stride " + std::to_string(kv.page_stride) + " is below the page size " +
           std::to_string(page_data_bytes(kv.geometry));
  }
  if (dtype_is_quantized(kv.geometry.dtype) && kv.scales == nullptr) {
    return name + ".scales is null for an 8-bit pool";
  }
  if (std::string e = detail::check_layout(kv, num_pages); !e.empty()) return name + ": " + e;
  return {};
}

// Encodes n fp32 values into `dtype` at dst: 8-bit with 1 / scale, 16-bit rounded. One loop per
// dtype, so each is a plain loop over the row.
void store_row(KvDtype dtype, const float* __restrict x, uint32_t n, float inv_scale,
               std::byte* __restrict dst) {
  switch (dtype) {
    case KvDtype::fp16:
      for (uint32_t i = 0; i < n; ++i) {
        const uint16_t e = f32_to_fp16(x[i]);
        std::memcpy(dst + size_t{i} * 2, &e, 2);
      }
      break;
    case KvDtype::bf16:
      for (uint32_t i = 0; i < n; ++i) {
        const uint16_t e = f32_to_bf16(x[i]);
        std::memcpy(dst + size_t{i} * 2, &e, 2);
      }
      break;
    case KvDtype::fp8_e4m3:
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = static_cast<std::byte>(f32_to_fp8_e4m3(x[i] * inv_scale));
      break;
    case KvDtype::int8:
      for (uint32_t i = 0; i < n; ++i)
        dst[i] = static_cast<std::byte>(f32_to_int8(x[i], inv_scale));
      break;
  }
}

// Converts one (layer, head, K|V) tile of page `from` into page `to`; tile is scratch for T · D
// floats.
void convert_tile(const ConvertPagesArgs& a, const KvStrides& ss, const KvStrides& ds, PageId from,
                  PageId to, uint32_t layer, uint32_t head, uint32_t is_v,
                  std::vector<float>& tile) {
  const Geometry& sg = a.src.geometry;
  const Geometry& dg = a.dst.geometry;
  const uint32_t t_page = sg.tokens_per_page;
  const uint32_t d = sg.head_dim;
  const auto* src = static_cast<const std::byte*>(a.src.base) + ss.row(from, layer, head, 0, is_v);
  auto* dst = static_cast<std::byte*>(a.dst.base) + ds.row(to, layer, head, 0, is_v);
  const float src_scale = dtype_is_quantized(sg.dtype)
                              ? a.src.scales[scale_index(sg, from, layer, head, is_v != 0)]
                              : 1.0f;
  detail::load_rows(detail::load_row, sg.dtype, src, ss.token, t_page, d, src_scale, tile.data());
  float inv = 1.0f;
  if (dtype_is_quantized(dg.dtype)) {
    // A NaN compares false and is skipped, as std::fmax would; this form vectorises.
    float amax = 0.0f;
    for (const float x : tile) {
      const float m = std::fabs(x);
      amax = m > amax ? m : amax;
    }
    const float range = dg.dtype == KvDtype::int8 ? kInt8Max : kFp8Max;
    const float scale = std::fmax(amax, kMinAmax) / range;
    a.dst.scales[scale_index(dg, to, layer, head, is_v != 0)] = scale;
    inv = 1.0f / scale;
  }
  for (uint32_t r = 0; r < t_page; ++r)
    store_row(dg.dtype, tile.data() + size_t{r} * d, d, inv, dst + r * ds.token);
}

}  // namespace

std::string check_convert_pages(const ConvertPagesArgs& args, uint32_t src_num_pages,
                                uint32_t dst_num_pages) {
  if (std::string e = check_convert_pool(args.src, src_num_pages, "src"); !e.empty()) return e;
  if (std::string e = check_convert_pool(args.dst, dst_num_pages, "dst"); !e.empty()) return e;
  if (!same_shape(args.src.geometry, args.dst.geometry)) {
    return "convert_pages: src and dst geometries differ in shape (layers, kv_heads, head_dim, "
           "tokens_per_page, kind and window must match; only dtype and layout may differ)";
  }
  if (args.src.base == args.dst.base) {
    return "convert_pages: src and dst are one pool (copy_pages moves pages within a pool)";
  }
  if (args.num_pairs == 0) return {};
  if (args.src_pages == nullptr) return "convert_pages: src_pages is null";
  if (args.dst_pages == nullptr) return "convert_pages: dst_pages is null";
  std::vector<std::pair<PageId, uint32_t>> dsts(args.num_pairs);
  for (uint32_t i = 0; i < args.num_pairs; ++i) {
    if (args.src_pages[i] >= src_num_pages) {
      return "convert_pages: pair " + std::to_string(i) + ": source page " +
             std::to_string(args.src_pages[i]) + " is not below the source's " +
             std::to_string(src_num_pages) + " pages";
    }
    if (args.dst_pages[i] >= dst_num_pages) {
      return "convert_pages: pair " + std::to_string(i) + ": destination page " +
             std::to_string(args.dst_pages[i]) + " is not below the destination's " +
             std::to_string(dst_num_pages) + " pages";
    }
    dsts[i] = {args.dst_pages[i], i};
  }
  std::sort(dsts.begin(), dsts.end());
  for (size_t i = 1; i < dsts.size(); ++i) {
    if (dsts[i].first == dsts[i - 1].first) {
      return "convert_pages: pairs " + std::to_string(dsts[i - 1].second) + " and " +
             std::to_string(dsts[i].second) + " both write page " + std::to_string(dsts[i].first);
    }
  }
  return {};
}

std::string convert_pages(const ConvertPagesArgs& args, uint32_t src_num_pages,
                          uint32_t dst_num_pages, unsigned threads) {
  if (std::string e = check_convert_pages(args, src_num_pages, dst_num_pages); !e.empty()) {
    return e;
  }
  if (args.num_pairs == 0) return {};
  const Geometry& g = args.src.geometry;
  const KvStrides ss = kv_strides(args.src);
  const KvStrides ds = kv_strides(args.dst);
  detail::for_each_item(
      args.num_pairs, threads,
      [&] { return std::vector<float>(size_t{g.tokens_per_page} * g.head_dim); },
      [&](size_t i, std::vector<float>& tile) {
        for (uint32_t layer = 0; layer < g.layers; ++layer) {
          for (uint32_t head = 0; head < g.kv_heads; ++head) {
            for (uint32_t is_v = 0; is_v < kv_planes(g); ++is_v) {
              convert_tile(args, ss, ds, args.src_pages[i], args.dst_pages[i], layer, head, is_v,
                           tile);
            }
          }
        }
      });
  return {};
}

}  // namespace kvpool::kernels::cpu

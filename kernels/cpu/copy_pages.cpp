// Copy-pages on the CPU: src[i] → dst[i] for every pair, the whole page (all layers, K and V or a
// latent pool's vectors) and, for 8-bit pools, its kv_planes · layers · kv_heads scales
// (kernels/paged_kv.h). A page is the runs of page_chunks: in page_major one run of
// page_data_bytes from base + page · page_stride (the padding up to page_stride is not part of a
// page), in layer_major kv_planes · layers runs of tokens_per_page · kv_heads · head_dim
// elements, one in each plane.
//
// The whole list is validated before anything is copied, so an error changes nothing: every id
// below num_pages, destinations distinct, and no page both a source and a destination. A source
// may feed several destinations (copy-on-write of a shared page). With those rules no copy reads
// what another writes, so the pairs are independent and their order does not matter.

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"

namespace kvpool::kernels::cpu {

std::string copy_pages(const CopyPagesArgs& args, uint32_t num_pages) {
  const Geometry& g = args.kv.geometry;
  if (std::string e = validate(g); !e.empty()) return "copy_pages: geometry: " + e;
  if (args.num_pairs == 0) return {};
  if (args.src == nullptr) return "copy_pages: src is null";
  if (args.dst == nullptr) return "copy_pages: dst is null";
  if (args.kv.base == nullptr) return "copy_pages: kv.base is null";
  const uint64_t data_bytes = page_data_bytes(g);
  if (args.kv.layout == KvLayout::page_major && args.kv.page_stride < data_bytes) {
    return "copy_pages: kv.page_stride " + std::to_string(args.kv.page_stride) +
           " is below the page size " + std::to_string(data_bytes);
  }
  const bool quantized = dtype_is_quantized(g.dtype);
  if (quantized && args.kv.scales == nullptr) {
    return "copy_pages: kv.scales is null for an 8-bit pool";
  }
  if (std::string e = detail::check_layout(args.kv, num_pages); !e.empty()) {
    return "copy_pages: " + e;
  }

  for (uint32_t i = 0; i < args.num_pairs; ++i) {
    if (args.src[i] >= num_pages) {
      return "copy_pages: pair " + std::to_string(i) + ": source page " +
             std::to_string(args.src[i]) +
             " out of range (num_pages = " + std::to_string(num_pages) + ")";
    }
    if (args.dst[i] >= num_pages) {
      return "copy_pages: pair " + std::to_string(i) + ": destination page " +
             std::to_string(args.dst[i]) +
             " out of range (num_pages = " + std::to_string(num_pages) + ")";
    }
  }
  // Destinations sorted with their pair index, for the duplicate and overlap checks.
  std::vector<std::pair<PageId, uint32_t>> dsts(args.num_pairs);
  for (uint32_t i = 0; i < args.num_pairs; ++i)
    dsts[i] = {args.dst[i], i};
  std::sort(dsts.begin(), dsts.end());
  for (size_t i = 1; i < dsts.size(); ++i) {
    if (dsts[i].first == dsts[i - 1].first) {
      return "copy_pages: pairs " + std::to_string(dsts[i - 1].second) + " and " +
             std::to_string(dsts[i].second) + " both write page " + std::to_string(dsts[i].first);
    }
  }
  for (uint32_t i = 0; i < args.num_pairs; ++i) {
    const auto it = std::lower_bound(dsts.begin(), dsts.end(), std::pair{args.src[i], 0u});
    if (it != dsts.end() && it->first == args.src[i]) {
      return "copy_pages: page " + std::to_string(args.src[i]) + " is the source of pair " +
             std::to_string(i) + " and the destination of pair " + std::to_string(it->second);
    }
  }

  auto* base = static_cast<uint8_t*>(args.kv.base);
  const uint64_t scale_floats = page_scale_bytes(g) / sizeof(float);
  const PageChunks pc = page_chunks(args.kv);
  for (uint32_t i = 0; i < args.num_pairs; ++i) {
    uint8_t* dst = base + pc.at(args.dst[i]);
    const uint8_t* src = base + pc.at(args.src[i]);
    for (uint32_t c = 0; c < pc.chunks; ++c)
      std::memcpy(dst + c * pc.chunk, src + c * pc.chunk, pc.chunk_bytes);
    if (quantized) {
      std::memcpy(args.kv.scales + uint64_t{args.dst[i]} * scale_floats,
                  args.kv.scales + uint64_t{args.src[i]} * scale_floats,
                  scale_floats * sizeof(float));
    }
  }
  return {};
}

}  // namespace kvpool::kernels::cpu

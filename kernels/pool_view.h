// paged_kv_of: a pool's memory as the kernels see it, from the PoolInfo the daemon publishes and
// the address the memory is mapped at. One builder for the daemon (its own copies and tier moves)
// and the client (its kernels), so the two never disagree on where a page or its scales lie.
#pragma once

#include <cstddef>

#include "common/geometry.h"
#include "common/wire/protocol.h"
#include "kernels/paged_kv.h"

namespace kvpool::kernels {

// Page p's scales are at scales_offset + p · page_scale_bytes: after the last page of a fixed
// pool, at the start of its scales region for an elastic one. Null where there are none (or
// nothing is mapped).
inline PagedKv paged_kv_of(const wire::PoolInfo& pool, std::byte* base) {
  PagedKv kv;
  kv.base = base;
  kv.page_stride = pool.page_stride;
  kv.geometry = pool.geometry;
  kv.layout = pool.layout;
  kv.num_pages = pool.num_pages;
  kv.segment_pages = pool.segment_pages;
  kv.segment_stride = pool.segment_stride;
  kv.scales = page_scale_bytes(pool.geometry) == 0 || base == nullptr
                  ? nullptr
                  : reinterpret_cast<float*>(base + pool.scales_offset);
  return kv;
}

// Bytes from layer l's planes to layer l + 1's in a layer_major pool (inside a segment when the
// pool is segmented); 0 in page_major.
inline uint64_t layer_stride_of(const wire::PoolInfo& pool) {
  return pool.layout == KvLayout::layer_major ? kv_strides(paged_kv_of(pool, nullptr)).layer : 0;
}

// The bytes from the base that the pool's num_pages pages span: whole pages of page_stride, or
// in a segmented pool whole segments.
inline uint64_t pages_extent(const wire::PoolInfo& pool) {
  if (pool.segment_pages == 0) return uint64_t{pool.num_pages} * pool.page_stride;
  return (uint64_t{pool.num_pages} + pool.segment_pages - 1) / pool.segment_pages *
         pool.segment_stride;
}

}  // namespace kvpool::kernels

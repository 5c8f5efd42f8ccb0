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
  kv.scales = page_scale_bytes(pool.geometry) == 0 || base == nullptr
                  ? nullptr
                  : reinterpret_cast<float*>(base + pool.scales_offset);
  return kv;
}

}  // namespace kvpool::kernels

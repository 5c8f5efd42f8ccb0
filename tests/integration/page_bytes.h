// A page's bytes as a worker sees them in its mapping, in either layout: the data runs of page p
// (kernels::page_chunks), filled with one byte value and checked against it. For tests that
// follow a block's bytes through the daemon's tiers.
#pragma once

#include <cstdint>
#include <cstring>

#include "client/connection/connection.h"
#include "kernels/pool_view.h"

namespace kvpool::testing {

// Calls fn(run, bytes) for each data run of page p of c's pool.
template <typename Fn>
void for_each_run(const client::Connection& c, PageId p, Fn&& fn) {
  const kernels::PageChunks ch = kernels::page_chunks(kernels::paged_kv_of(c.pool(), c.base()));
  for (uint32_t k = 0; k < ch.chunks; ++k)
    fn(c.base() + ch.at(p) + uint64_t{k} * ch.chunk, ch.chunk_bytes);
}

inline void set_page(const client::Connection& c, PageId p, uint8_t v) {
  for_each_run(c, p, [&](std::byte* run, uint64_t n) { std::memset(run, v, n); });
}

// How many of page p's bytes are not v.
inline uint64_t wrong_bytes(const client::Connection& c, PageId p, uint8_t v) {
  uint64_t wrong = 0;
  for_each_run(c, p, [&](const std::byte* run, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i)
      wrong += run[i] != std::byte{v};
  });
  return wrong;
}

}  // namespace kvpool::testing

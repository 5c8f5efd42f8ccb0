#include "bench/demo/kv_pattern.h"

#include <cstring>

namespace kvpool::demo {

namespace {

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Calls fn(byte offset in page, bytes, stream seed) for each K and V row of the token.
template <typename Fn>
void for_each_row(const Geometry& g, uint32_t slot, uint64_t seed, Fn&& fn) {
  const uint64_t row_bytes = uint64_t{g.head_dim} * dtype_bytes(g.dtype);
  for (uint32_t layer = 0; layer < g.layers; ++layer) {
    for (uint32_t head = 0; head < g.kv_heads; ++head) {
      const uint64_t k = page_k_offset(g, layer, head, slot, 0) * dtype_bytes(g.dtype);
      const uint64_t v = page_v_offset(g, layer, head, slot, 0) * dtype_bytes(g.dtype);
      const uint64_t row = (uint64_t{layer} * g.kv_heads + head) * 2;
      fn(k, row_bytes, mix(seed + row));
      fn(v, row_bytes, mix(seed + row + 1));
    }
  }
}

}  // namespace

uint64_t token_seed(const BlockHash& parent, std::span<const uint32_t> block_tokens,
                    uint32_t pos_in_block) {
  uint64_t s = mix(parent.lo ^ mix(parent.hi));
  for (uint32_t i = 0; i <= pos_in_block; ++i)
    s = mix(s ^ block_tokens[i]);
  return s;
}

void write_token(const Geometry& g, std::byte* page, uint32_t slot, uint64_t seed) {
  for_each_row(g, slot, seed, [&](uint64_t off, uint64_t bytes, uint64_t stream) {
    for (uint64_t b = 0; b < bytes; b += 8) {
      stream = mix(stream);
      std::memcpy(page + off + b, &stream, bytes - b < 8 ? bytes - b : 8);
    }
  });
}

bool check_token(const Geometry& g, const std::byte* page, uint32_t slot, uint64_t seed) {
  bool same = true;
  for_each_row(g, slot, seed, [&](uint64_t off, uint64_t bytes, uint64_t stream) {
    for (uint64_t b = 0; b < bytes && same; b += 8) {
      stream = mix(stream);
      same = std::memcmp(page + off + b, &stream, bytes - b < 8 ? bytes - b : 8) == 0;
    }
  });
  return same;
}

}  // namespace kvpool::demo

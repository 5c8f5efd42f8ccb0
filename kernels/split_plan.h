// Split-KV planning for decode: how many tokens each chunk of a long context takes, so that
// (sequences × KV heads × chunks) fills the machine while every chunk stays long enough to
// amortise its merge.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace kvpool::kernels {

// Tokens per split chunk: a multiple of tokens_per_page, at least min_chunk_tokens (rounded up
// to pages), chosen so that work_items = num_seqs · kv_heads · ceil(max_context / chunk) reaches
// about target_parallelism. Returns max_context (rounded up to pages) when no split is needed.
KVPOOL_HD uint32_t plan_split_tokens(uint32_t max_context, uint32_t tokens_per_page,
                                     uint32_t num_seqs, uint32_t kv_heads,
                                     uint32_t target_parallelism, uint32_t min_chunk_tokens) {
  const uint32_t t = tokens_per_page == 0 ? 1 : tokens_per_page;
  const uint32_t whole = (max_context + t - 1) / t * t;
  const uint64_t units = uint64_t{num_seqs} * kv_heads;
  if (units == 0 || whole == 0 || units >= target_parallelism) return whole == 0 ? t : whole;
  const uint64_t want_chunks = (target_parallelism + units - 1) / units;
  uint64_t chunk = (uint64_t{whole} + want_chunks - 1) / want_chunks;
  const uint64_t min_chunk = (uint64_t{min_chunk_tokens} + t - 1) / t * t;
  if (chunk < min_chunk) chunk = min_chunk;
  chunk = (chunk + t - 1) / t * t;
  return chunk > whole ? whole : static_cast<uint32_t>(chunk);
}

}  // namespace kvpool::kernels

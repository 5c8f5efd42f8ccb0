// Deterministic stand-in K/V for the demo: what a model would write for a token, as a function
// of the token and everything before it in its block chain, so a worker that reuses a page can
// check it holds exactly the bytes the publishing worker wrote.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/block_hash.h"
#include "common/geometry.h"

namespace kvpool::demo {

// Seed of token `pos_in_block` of a block: folds the parent's hash and the block's tokens up to
// and including that one.
uint64_t token_seed(const BlockHash& parent, std::span<const uint32_t> block_tokens,
                    uint32_t pos_in_block);

// Writes the K and V of one token (all layers, KV heads) into its slot of a page.
void write_token(const Geometry& g, std::byte* page, uint32_t slot, uint64_t seed);

// True when the slot holds exactly what write_token(g, page, slot, seed) writes.
bool check_token(const Geometry& g, const std::byte* page, uint32_t slot, uint64_t seed);

}  // namespace kvpool::demo

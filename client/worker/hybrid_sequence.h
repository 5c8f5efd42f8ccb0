// HybridSequence: one sequence of a hybrid model (ModelConnection, kvpoold's pools[].groups): a
// SequenceCache per KV group over the same tokens and one block chain, begun from one
// lookup_groups, so every group starts from the prefix all of them can serve.
//
// Each group's cache keeps that group's block table: a full group every block, a sliding or
// chunked group the blocks its window still covers (publish_full() releases the others, which
// stay cached for other sequences). Tokens go to every group: append() allocates in each as a
// block fills; the caller writes each group's K/V into group(g).slot(pos).
//
// Thread-safety: as SequenceCache (one thread at a time). Errors: the first group's that failed;
// a failed begin() leaves the sequence empty and holds nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "client/connection/model_connection.h"
#include "client/worker/sequence_cache.h"
#include "common/block_hash.h"

namespace kvpool::client {

class HybridSequence {
 public:
  // `root`: BlockHasher::root() of the model's first group (docs/BLOCK_HASH.md). model and
  // hasher must outlive the sequence.
  HybridSequence(ModelConnection& model, BlockHasher& hasher, const BlockHash& root);

  // Starts the sequence with `prompt`: the tokens every group already has cached (a multiple of
  // tokens_per_page), the rest of the prompt's pages allocated in every group.
  Result<uint32_t> begin(std::span<const uint32_t> prompt);
  // Appends one token to every group.
  Result<Ok> append(uint32_t token);
  // Publishes every group's full blocks; returns the blocks adopted from another worker, all
  // groups together.
  Result<uint32_t> publish_full();
  // Gives every group's pages back, tail first.
  Result<Ok> release();

  size_t num_groups() const { return groups_.size(); }
  SequenceCache& group(size_t g) { return *groups_[g]; }
  uint32_t tokens() const { return groups_.empty() ? 0 : groups_[0]->tokens(); }

 private:
  ModelConnection& model_;
  BlockHasher& hasher_;
  BlockHash root_;
  std::vector<std::unique_ptr<SequenceCache>> groups_;
};

}  // namespace kvpool::client

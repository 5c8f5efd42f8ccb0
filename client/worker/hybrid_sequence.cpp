#include "client/worker/hybrid_sequence.h"

namespace kvpool::client {

HybridSequence::HybridSequence(ModelConnection& model, BlockHasher& hasher, const BlockHash& root)
    : model_(model), hasher_(hasher), root_(root) {
  for (size_t g = 0; g < model.num_groups(); ++g)
    groups_.push_back(std::make_unique<SequenceCache>(model.group(g), hasher, root));
}

Result<uint32_t> HybridSequence::begin(std::span<const uint32_t> prompt) {
  if (tokens() != 0) {
    return Error{Status(Errc::invalid_argument), "begin() on a sequence that has tokens"};
  }
  // Every group's pages hold the same tokens (a group sets no tokens_per_page of its own).
  const uint32_t tpp = groups_[0]->tokens_per_page();
  std::vector<BlockHash> chain(prompt.size() / tpp);
  chain.resize(hasher_.chain(root_, prompt, tpp, chain));
  auto hit = model_.lookup(chain);
  if (!hit.ok()) return hit.error();
  for (size_t g = 0; g < groups_.size(); ++g) {
    auto started = groups_[g]->begin_from(prompt, hit.value().groups[g].pages);
    if (started.ok()) continue;
    // The groups begun give their pages back; those not begun yet, the hit's references.
    (void)release();
    for (size_t k = g + 1; k < groups_.size(); ++k) {
      std::vector<PageId> held;
      for (const PageId p : hit.value().groups[k].pages) {
        if (p != kNoPage) held.push_back(p);
      }
      (void)model_.group(k).release(held);
    }
    return started.error();
  }
  return hit.value().hits() * tpp;
}

Result<Ok> HybridSequence::append(uint32_t token) {
  for (auto& g : groups_) {
    auto slot = g->append(token);
    if (!slot.ok()) return slot.error();
  }
  return Ok{};
}

Result<uint32_t> HybridSequence::publish_full() {
  uint32_t adopted = 0;
  for (auto& g : groups_) {
    auto n = g->publish_full();
    if (!n.ok()) return n.error();
    adopted += n.value();
  }
  return adopted;
}

Result<Ok> HybridSequence::release() {
  Result<Ok> first = Ok{};
  for (auto& g : groups_) {
    auto r = g->release();
    if (!r.ok() && first.ok()) first = r.error();
  }
  return first;
}

}  // namespace kvpool::client

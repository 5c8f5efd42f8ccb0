// SequenceCache: one sequence's KV pages, on the worker side.
//
// It keeps the sequence's block table (page per block of tokens_per_page tokens), computes the
// block-hash chain of its full blocks (common/block_hash.h), and drives the daemon:
//   begin(prompt)        lookup of the prompt's full blocks → the cached prefix needs no compute;
//                        pages for the rest are allocated in one call;
//   slot(pos)/append()   where token pos's K/V go (page, offset), allocating as blocks fill;
//   publish_full()       publishes the full blocks written since the last call; a block another
//                        worker published first is adopted: its page replaces ours, ours goes back;
//   fork()               a second sequence sharing every full block (retained, zero copy); the
//                        partial last block is copied into a page of its own by the daemon
//                        (copy on write; works for GPU pools too);
//   apply_window(n)      drops the pages whose tokens all left a sliding window of n tokens;
//                        on a pool whose geometry is sliding or chunked this follows from the
//                        geometry: publish_full() releases every published block the next
//                        query can no longer see (release_out_of_window()); the pool keeps them
//                        cached for prefix reuse;
//   release()            gives every page back, tail first, so tails are evicted before heads.
// Invariants: block b holds tokens [b·T, (b+1)·T); blocks [0, published_) are published (or
// adopted); a dropped block's entry is kNoPage; the cache holds exactly one reference to every
// page in its table.
//
// The caller writes K/V into the slots between begin()/append() and publish_full(), and must not
// publish before those bytes are complete and visible (on a GPU: after the stream finished).
// Thread-safety: one thread at a time, like the Connection it uses.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "common/block_hash.h"

namespace kvpool::client {

class SequenceCache {
 public:
  struct Slot {
    PageId page = kNoPage;
    uint32_t offset = 0;  // token index inside the page
  };

  // `root` comes from BlockHasher::root() for the model; conn and hasher must outlive the cache.
  // The hasher must be of the scheme the connection attached with (the pool's): begin() and
  // begin_from() refuse otherwise, naming both, since every block would be named wrongly.
  SequenceCache(Connection& conn, BlockHasher& hasher, const BlockHash& root);
  ~SequenceCache();  // release()
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  // Starts the sequence with `prompt`. Returns how many leading tokens are already cached (their
  // K/V are in the pool, written by whoever published them); a multiple of tokens_per_page.
  // Precondition: the sequence is empty.
  Result<uint32_t> begin(std::span<const uint32_t> prompt);
  // begin() from a prefix hit this session already holds (a group's part of lookup_groups:
  // HybridSequence; kNoPage for blocks a window skipped): the cache takes those references over,
  // whether it succeeds or not (a failed begin_from gives them back). Returns held.size() ·
  // tokens_per_page. Precondition: the sequence is empty and `held` names at most the prompt's
  // full blocks.
  Result<uint32_t> begin_from(std::span<const uint32_t> prompt, std::span<const PageId> held);
  // Appends one token; returns its slot.
  Result<Slot> append(uint32_t token);
  // The slot of token `pos` (< tokens()); page is kNoPage once the window dropped it.
  Slot slot(uint32_t pos) const;

  // Publishes every full block not yet published; returns how many blocks were adopted from
  // another worker instead of stored.
  Result<uint32_t> publish_full();

  Result<std::unique_ptr<SequenceCache>> fork();

  // Releases the pages of blocks whose tokens are all older than the last `window` tokens.
  Result<Ok> apply_window(uint32_t window);

  // The first token the next query (at position tokens()) sees, by the pool's attention kind
  // (common/geometry.h): 0 for full attention, tokens() − window + 1 for a sliding window of
  // `window` tokens, the start of the current chunk for chunked attention.
  uint32_t first_visible() const;
  // Releases every published block wholly before first_visible(). Blocks not yet published are
  // kept (the caller's K/V in them are not in the prefix index yet). publish_full() calls it
  // last: by its contract every query up to tokens() has been computed then, so nothing still
  // to be computed reads a released block (append() does not: tokens appended for one forward
  // pass, a chunked prefill or draft tokens, still need the keys before them). A no-op on a
  // full-attention pool.
  Result<Ok> release_out_of_window();

  // Releases every page, tail first. The sequence is empty afterwards.
  Result<Ok> release();

  // Hints for every later call (lookup in begin(), allocs, publish_full(), fork()): e.g. a
  // conversation's class and a pin lasting the expected time to its next turn, so its pages
  // outlive the pause. The daemon bounds pins per tenant; a refused pin fails the call.
  void set_hints(const PageHints& hints) { hints_ = hints; }
  const PageHints& hints() const { return hints_; }
  // The adapter (LoRA) the sequence's K/V are computed with, named in the KV events of the blocks
  // publish_full() publishes from now on ("" = none; at most 256 bytes, else publish_full()
  // fails naming lora_name). The root names it for the hash chain (ModelIdentity::adapter_id);
  // this names it for routers.
  void set_lora_name(std::string name) { lora_name_ = std::move(name); }
  const std::string& lora_name() const { return lora_name_; }

  uint32_t tokens() const { return static_cast<uint32_t>(tokens_.size()); }
  uint32_t tokens_per_page() const { return tpp_; }
  const std::vector<PageId>& block_table() const { return pages_; }
  // The block table as an engine's own kernels index the per-layer tensors (kv_cache_view,
  // kernels::block_index): the same pages, except in a segmented (elastic) layer_major pool,
  // where each page is its place in the tensor of blocks. kNoPage entries stay kNoPage.
  std::vector<uint64_t> kv_block_table() const;
  const std::vector<BlockHash>& block_hashes() const { return hashes_; }
  uint32_t published_blocks() const { return published_; }

 private:
  uint32_t full_blocks() const { return tokens() / tpp_; }
  // Refuses a hasher of another scheme than the connection's (the constructor's comment).
  Result<Ok> check_scheme() const;
  // The prompt's cached prefix is `hit` (held): the rest of its pages are allocated.
  Result<uint32_t> start(std::vector<PageId> hit);
  // Hashes of blocks [hashes_.size(), full_blocks()).
  void hash_new_full_blocks();

  Connection& conn_;
  BlockHasher& hasher_;
  BlockHash root_;
  uint32_t tpp_;
  bool scheme_matches_;  // the hasher names blocks as the connection said it would (check_scheme)
  std::vector<uint32_t> tokens_;
  std::vector<PageId> pages_;
  std::vector<BlockHash> hashes_;  // one per full block
  uint32_t published_ = 0;
  PageHints hints_;
  std::string lora_name_;
};

}  // namespace kvpool::client

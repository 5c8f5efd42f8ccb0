// MixedSequence: one sequence whose recent tokens are kept in full precision and whose older
// ones in 8 bits (docs/ARCHITECTURE.md, "Mixed precision"), over two pools of one shape: a
// recent pool (bf16 or fp16) and an older pool (fp8_e4m3 or int8), each attached by its own
// Connection. Both pools name blocks by the same chain (the recent pool's root), so a block has
// one hash whatever its precision, and other workers find it in either pool.
//
// Block table: older pages first, then recent ones (the mixed kernels' contract,
// kernels/paged_kv.h, MixedPrecision): entries [0, older_pages()) are pages of the older pool.
//   begin(prompt)   looks the prompt's full blocks up in the older pool, then the rest of the chain
//                   in the recent pool (a block converted by another worker is found in 8 bits,
//                   the newer ones in 16), keeps the longest part of that hit whose first query
//                   finds every block it reads (trim_hit), allocates recent pages for the rest,
//                   and ages (blocks the older pool has no room for stay in 16 bits; no failure);
//   append()        allocates in the recent pool as blocks fill;
//   publish_full()  publishes the full blocks in the recent pool (adopting duplicates), then ages;
//   age             on a sliding or chunked pool, every published block before the window (or
//                   the attention chunk) of the first query still to run (begin: the token at
//                   the hit's end; then the last token) is let go first (its entry becomes
//                   kNoPage: no later query reads it; it stays cached for other sequences); then
//                   every published block whose last token is recent_tokens or more behind the
//                   head (blocks [0, (tokens − recent_tokens) / T)) moves to the older pool: it
//                   is converted (PoolKernels::convert_to: a fresh older page only this worker
//                   holds, written whole before it is published, so no reader ever sees it half
//                   written) and published there with its chain (KV events); a block another
//                   worker published there first is adopted from the publish's answer (its page
//                   replaces ours). The recent pages are released: they stay cached in the
//                   recent pool until it evicts them.
//                   Blocks the older pool cannot take now (no room, a quota) stay in 16 bits:
//                   a batch it refuses is halved down to one block within the call, and the
//                   next call starts again from the whole backlog;
// Why the worker converts and not the daemon: the worker holds the page and its stream, and the
// moment a block ages is a step of its own decode loop; the conversion is one kernel launch on
// its stream (set_stream) between steps, with no copy job in the daemon (the round trips are the
// older pool's alloc and publish, batched per call), and a
// worker killed mid-conversion leaks nothing (its unpublished older pages go back with its
// session). The daemon's part is the pools' budget and, under pressure, the cached blocks.
//
// Invariants: the cache holds one reference to every page in its table; entries
// [0, older_pages()) are pages published in the older pool, or kNoPage (before a window or
// chunk: a begin() hit's holes, or let go by age), [older_pages(), published) pages published
// in the recent one; older_pages() only grows after begin(); after begin() the first query
// reads no kNoPage entry.
// Windowed pools: each lookup judges its own pool's blocks, so a sliding or chunked sequence's
// begin() finds the older pool's blocks when that pool holds its hit's whole window there. The
// recent pool's lookup counts positions from the first block the older pool lacks, which is a
// chunk boundary of the sequence only by chance: on a chunked pool its answer may leave holes
// where the sequence's own chunk needs pages (or stop short). trim_hit() keeps the longest hit
// whose first query's keys are all in the table, so a hit may come out shorter than what the two
// pools hold together, never wrong.
// Thread-safety: one thread at a time, like its Connections. Errors: the daemon's or the kernel's;
// a failed step leaves the table consistent (a conversion that failed leaves its blocks in the
// recent pool and returns the older pages it took).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "common/block_hash.h"

namespace kvpool::client {

class MixedSequence {
 public:
  struct Slot {
    PageId page = kNoPage;  // a page of the recent pool
    uint32_t offset = 0;
  };

  // The two pools must be of one shape (layers, KV heads, head_dim, tokens per page, kind and
  // window), the recent one 16-bit and the older one 8-bit, both mapped in the same memory (host
  // or one GPU), of any kind (full, latent, sliding, chunked); recent_tokens ≥ 1; recent_k and
  // older_k the kernels of those two connections. The connections, kernels and hasher must outlive
  // the sequence. `root`: the recent pool's BlockHasher::root().
  static Result<std::unique_ptr<MixedSequence>> create(Connection& recent, PoolKernels& recent_k,
                                                       Connection& older, PoolKernels& older_k,
                                                       BlockHasher& hasher, const BlockHash& root,
                                                       uint32_t recent_tokens);
  ~MixedSequence();  // release()
  MixedSequence(const MixedSequence&) = delete;
  MixedSequence& operator=(const MixedSequence&) = delete;

  // Starts the sequence with `prompt`; returns the tokens already cached (in either pool). As a
  // lookup's hit, it serves the query at that position: a caller that wants to run the prompt's
  // last token when the whole prompt is cached (for its logits) begins with the prompt less that
  // token, since on a sliding or chunked pool that query may read blocks the hit skipped.
  Result<uint32_t> begin(std::span<const uint32_t> prompt);
  // Appends one token; returns its slot in the recent pool.
  Result<Slot> append(uint32_t token);
  // Publishes the full blocks not yet published, then ages. Returns the blocks converted.
  Result<uint32_t> publish_full();
  // Gives every page back (recent pages tail first, then older ones).
  Result<Ok> release();

  uint32_t tokens() const { return static_cast<uint32_t>(tokens_.size()); }
  uint32_t older_pages() const { return older_; }
  const std::vector<PageId>& block_table() const { return pages_; }
  const std::vector<BlockHash>& block_hashes() const { return hashes_; }
  // Blocks converted to 8 bits by this sequence, and adopted from another worker's conversion.
  uint64_t converted() const { return converted_; }
  uint64_t adopted() const { return adopted_; }
  // The stream conversions run on (a cudaStream_t as void*; nullptr = the default stream; host
  // pools ignore it): the worker's own, so a conversion queues behind the K/V it converts.
  void set_stream(void* stream) { stream_ = stream; }
  // Tests: runs between a conversion's kernel and its publish (a worker killed there).
  void set_after_convert(std::function<void()> hook) { after_convert_ = std::move(hook); }

 private:
  MixedSequence(Connection& recent, PoolKernels& recent_k, Connection& older, PoolKernels& older_k,
                BlockHasher& hasher, const BlockHash& root, uint32_t recent_tokens);
  uint32_t full_blocks() const { return tokens() / tpp_; }
  void hash_new_full_blocks();
  // begin()'s hit cut to the longest n ≤ published blocks whose next query (at n · T) finds a
  // page at every block it reads; the cut pages are released.
  Result<Ok> trim_hit();
  // On a sliding or chunked pool, lets go of the blocks before the window (chunk) of the query at
  // `first_query` (the first still to run); then moves the published blocks older than
  // recent_tokens into the older pool; returns how many were converted.
  Result<uint32_t> age(uint32_t first_query);
  // Publishes `pages` as blocks [first, first + pages.size()) in `conn` with their chain (parent,
  // tokens); a block already published there is answered with that page (retained for us): it
  // replaces ours in `pages`, and ours goes to own_copies for the caller to release.
  Result<Ok> publish_blocks(Connection& conn, uint32_t first, std::vector<PageId>& pages,
                            std::vector<PageId>& own_copies);
  // Converts blocks [first, first + n) (published, in the recent pool) into fresh older pages
  // and publishes them there; the table then names the older pages.
  Result<uint32_t> convert_blocks(uint32_t first, uint32_t n);

  Connection& recent_;
  PoolKernels& recent_k_;
  Connection& older_conn_;
  PoolKernels& older_k_;
  BlockHasher& hasher_;
  BlockHash root_;
  uint32_t recent_tokens_;
  uint32_t tpp_;
  std::vector<uint32_t> tokens_;
  std::vector<PageId> pages_;
  std::vector<BlockHash> hashes_;
  uint32_t older_ = 0;      // blocks [0, older_) are older-pool pages
  uint32_t published_ = 0;  // blocks [0, published_) are published (in one pool or the other)
  uint32_t let_go_ = 0;     // entries [0, let_go_) are kNoPage: before a window or chunk
  uint64_t converted_ = 0;
  uint64_t adopted_ = 0;
  std::function<void()> after_convert_;
  void* stream_ = nullptr;
};

}  // namespace kvpool::client

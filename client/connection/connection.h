// libkvpool: a worker's connection to kvpoold.
//
// Connection::attach() connects to the daemon's Unix socket, says hello, receives the pool's
// memory (segment descriptors passed with the reply, or CUDA IPC handles) and maps it
// (client/connection/pool_mapping.h), so the pool's bytes are at the same offsets from base() in
// this process as in every other worker of the pool. Where a page's KV lies depends on the pool's
// layout() (common/geometry.h): page_major, page p is page(p) = base() + p · page_stride,
// contiguous; layer_major, its K and V of layer l are T · H · D elements in layer l's planes, which
// are layer_stride() bytes apart (PoolKernels::paged_kv describes either for the kernels). Every
// call is one request and one reply, batched: alloc(n), retain(ids), release(ids), lookup(chain),
// publish(pairs), stats(). Expected failures (out of pages, not held, quota, the daemon gone) come
// back as an Error value carrying the daemon's code and message; nothing throws.
//
// The pages a session holds are released by the daemon when the connection closes, however it
// closes (destructor, exit, kill -9). A worker publishes a page only after writing all its
// bytes, and reads a page only while holding a reference to it.
//
// Elastic pools grow and shrink by whole segments inside a virtual range reserved for their
// largest size. The daemon pushes a pool_changed notice (with the pool's new epoch) to every
// session of the pool, always before a reply that hands out a page of a new segment; call()
// reads such notices while it waits for its reply and, before returning that reply, asks for the
// current segments (a segments request) and maps what is new and unmaps what is gone
// (PoolMapping::update). A reply naming a page at or beyond num_pages() triggers the same sync.
// poll_notices() does it without a request, for engines that are idle (a shrink's memory is
// released only once every worker has unmapped it). base() never changes: pointers into the pool
// stay valid across a grow, and across a shrink for every page outside the removed segments. The
// pages of a removed segment must not be touched after the sync; the daemon shrinks only
// segments none of whose pages any session holds, so a worker that reads and writes only the
// pages it holds is never affected. num_pages(), bytes() and pool() describe the pool as last
// synced.
//
// Thread-safety: a Connection serves one call at a time; use one per thread or lock around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/connection/pool_mapping.h"
#include "common/wire/protocol.h"
#include "kernels/pool_view.h"

namespace kvpool::client {

using wire::Error;
template <typename T>
using Result = wire::Result<T>;
struct Ok {};

// $KVPOOL_SOCKET if set, else the daemon's default (common/paths.h).
std::string default_socket_path();

// What a publish may say of its blocks for the KV events (Connection::publish).
struct PublishChain {
  std::optional<BlockHash> parent{};      // item 0's parent; absent: the sequence's first block
  std::span<const uint32_t> token_ids{};  // tokens_per_page per item, or none
  std::string_view lora_name{};           // the adapter the blocks were computed with, or ""
  bool empty() const { return !parent && token_ids.empty() && lora_name.empty(); }
};

class Connection {
 public:
  // Memory::none is for tools that only talk to the daemon (kvpoolctl, observers): the pool's
  // memory is not mapped (no GPU context is made for a GPU pool), base() is null.
  enum class Memory { map, none };
  // `link_session`: for a group of a hybrid model, a session of this process attached to
  // another group of the model, which this one joins (ModelConnection does this); 0: none.
  // `hash_scheme`: how this worker hashes blocks (BlockHasher::scheme() of the hasher it uses;
  // the library's default unless it says otherwise): the daemon refuses a scheme other than its
  // own, naming both, instead of letting the worker miss every block. An empty one says nothing.
  static Result<std::unique_ptr<Connection>> attach(
      const std::string& socket_path, const std::string& worker_name,
      const std::string& pool_name = "", Memory memory = Memory::map, uint64_t link_session = 0,
      const HashScheme& hash_scheme = default_hash_scheme());
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The pool as last synced (num_pages, segments, epoch change when it grows or shrinks).
  const wire::PoolInfo& pool() const { return pool_; }
  uint32_t num_pages() const { return pool_.num_pages; }
  // Bytes of pool memory mapped now (the segments' sum).
  uint64_t bytes() const { return pool_.segment_bytes; }
  uint64_t session_id() const { return session_id_; }
  // The scheme this session's hello named (empty: none), which the pool accepted.
  const HashScheme& hash_scheme() const { return hash_scheme_; }
  // Where page 0 is in this process: host memory, or device memory of CUDA ordinal device().
  std::byte* base() const { return base_; }
  int device() const { return mapping_ ? mapping_->device() : -1; }
  // page_major: page p's bytes. layer_major: base() + p · page_stride, which is not where a
  // page's KV lies (use the layer_major offsets of common/geometry.h).
  std::byte* page(PageId p) const { return base_ + uint64_t{p} * pool_.page_stride; }
  KvLayout layout() const { return pool_.layout; }
  // Bytes from layer l's K plane to layer l + 1's in layer_major; 0 in page_major.
  uint64_t layer_stride() const { return kernels::layer_stride_of(pool_); }
  // The scales of page p in 8-bit pools (layers · kv_heads · 2 floats, kernels/paged_kv.h), in the
  // side region at pool().scales_offset; nullptr for 16-bit pools.
  float* page_scales(PageId p) const;

  // hints (priority class, pin TTL) apply to the pages the call leaves this session holding;
  // the default says nothing and sends nothing.
  Result<std::vector<PageId>> alloc(uint32_t count, const PageHints& hints = {});
  Result<Ok> retain(std::span<const PageId> pages, const PageHints& hints = {});
  // Pages whose last reference goes become cached in the order given, and cached pages are
  // evicted in that order (under every policy, among pages of one priority): release a
  // sequence's pages tail first, as SequenceCache does, so that eviction shortens its prefix
  // from the end. Head first, the first eviction takes block 0 and leaves every block behind it
  // unreachable by lookup until they are evicted too.
  Result<Ok> release(std::span<const PageId> pages);
  // The pages of the longest cached prefix of `chain`, each now held by this session. On a
  // sliding or chunked pool the prefix may skip blocks that no query resuming after it reads
  // (core::PagePool::lookup_window): their entries are kNoPage. Such a hit of n blocks serves a
  // sequence resuming at token n · tokens_per_page exactly: one that resumes earlier (to recompute
  // the last token, say) needs blocks before the window and must look up the shorter chain.
  Result<std::vector<PageId>> lookup(std::span<const BlockHash> chain, const PageHints& hints = {});
  // The same, with the tier that served each hit (wire::kTierDevice, wire::kTierHost for a
  // block the daemon promoted from the pool's host tier into the page before answering, or
  // wire::kTierNone for a kNoPage entry).
  Result<wire::LookupReply> lookup_with_tiers(std::span<const BlockHash> chain,
                                              const PageHints& hints = {});
  // A hybrid model's lookup (on a session linked to every group's, see ModelConnection): per
  // group, the pages of the longest hit every group can serve, each held by that group's
  // session; kNoPage where a group's window does not need the block.
  Result<wire::GroupLookupReply> lookup_groups(std::span<const BlockHash> chain,
                                               const PageHints& hints = {});
  // A static reservation: the pages of a sequence of up to max_tokens, held at once, its block
  // table fixed until unreserve (or the session's end); `seeds` (pages this session holds, a
  // lookup's hit) come first. Quota, capacity and release rules: docs/ARCHITECTURE.md, "Static
  // reservations".
  Result<wire::ReserveReply> reserve(uint32_t max_tokens, std::span<const PageId> seeds = {},
                                     const PageHints& hints = {});
  Result<Ok> unreserve(uint64_t reservation);
  // Publishes (page, hash) pairs. `chain`, optional, tells KV-aware routers what the blocks are
  // (the daemon's KV events carry it; docs/ARCHITECTURE.md, "KV events for routers"): when set,
  // the items must be one chain (item i the child of item i − 1, item 0 of chain.parent, or its
  // sequence's first block when that is absent) and chain.token_ids hold tokens_per_page ids per
  // item. A call larger than one frame carries goes as several, each continuing the chain; when
  // a later part fails, the parts before stay published (the pages their duplicates retained
  // are given back) and the error is returned.
  Result<std::vector<PublishResult>> publish(std::span<const PublishItem> items,
                                             const PageHints& hints = {},
                                             const PublishChain& chain = {});
  Result<wire::StatsReply> stats();
  // Admin (root or the daemon's admin_group): drop up to n cached pages in eviction order / all.
  Result<uint32_t> evict(uint32_t n);
  Result<uint32_t> flush();
  // The state of every page of the pool (wire::PagesReply::State values), in page order.
  Result<std::vector<uint8_t>> pages();
  // The sessions attached to this session's pool (read-only).
  Result<std::vector<wire::SessionInfo>> sessions();
  // The daemon copies pages (all layers and scales) src → dst on its own stream: pages this
  // session holds, destinations not published. Returns when the bytes are in place.
  Result<uint32_t> copy(std::span<const wire::PageCopy> pairs);

  // Operations, metrics and events.
  // The most-hit indexed blocks this session may see (its tenant's; every tenant's for admins).
  Result<wire::PrefixesReply> prefixes(uint32_t limit);
  // Asks the daemon to reload its config file (root or the admin group); the outcome says
  // whether it was applied, refused (and why) and which keys wait for a restart.
  Result<wire::ReloadReply> reload();
  // The daemon's stats snapshot (common/stats_layout.h), decoded.
  Result<wire::SnapshotReply> snapshot();

  // Elastic pools.
  // Admin: resizes an elastic pool by whole segments within its min and max (below `pages` it
  // grows to the first size at or above it, above it shrinks while it stays at or above it);
  // returns its size now (this session's mapping follows before the call returns).
  Result<uint32_t> resize(uint32_t pages);
  // The pool as the daemon has it now (the descriptors that come with it are closed; the mapping
  // is not changed: use poll_notices() or any call to follow a change).
  Result<wire::PoolInfo> segments();
  // Without blocking: reads the pool_changed notices already waiting on the socket and, when the
  // pool changed, syncs the mapping (a segments request). Returns whether the mapping changed.
  // For engines to call when idle, so a shrink's memory is released without waiting for their
  // next request.
  Result<bool> poll_notices();
  // Asks for the segments now and maps what is new (a page another session's reply named, say:
  // ModelConnection). Returns whether the mapping changed.
  Result<bool> sync_segments() { return sync(); }

  // One request, one reply (the typed calls above use it). Notices read on the way are acted on
  // (the mapping synced) before it returns.
  Result<wire::Reply> call(const wire::Request& request);

  // The socket, for tests that need to send raw bytes.
  int socket_fd() const { return fd_; }

  // Whether the daemon's end is gone: a call found the connection lost, or the socket reports
  // the peer closed (checked now, without reading). A connection whose daemon stopped says so
  // before the next call fails.
  bool peer_closed() const;

 private:
  explicit Connection(int fd) : fd_(fd) {}
  // Sends out_, reads one reply frame into a Reply (or Error), reading past any pool_changed
  // notice (which sets notified_epoch_). Captures passed fds, if any.
  Result<wire::Reply> round_trip(uint32_t request_id, std::vector<int>* passed_fds);
  // Reads until in_ starts with one whole frame (in_[0, kHeaderBytes + header.length)); bytes
  // already buffered count. send_error: the errno of a failed send, reported when nothing comes.
  Result<wire::FrameHeader> read_frame(std::vector<int>* passed_fds, int send_error);
  // Drops the frame at the front of in_ (n bytes), keeping whatever followed it.
  void consume(size_t n);
  // Records a pool_changed notice held in in_ (an error breaks the connection).
  Result<Ok> take_notice(const wire::FrameHeader& header);
  // Segments request + PoolMapping::update until the mapping is at the newest epoch notified.
  Result<bool> sync();
  // Whether a reply names a page beyond the mapped pool (then sync() before returning it).
  bool names_unmapped_page(const wire::Reply& reply) const;

  // The pool as of the segments reply `info` (keeps what the hello said of the session).
  void adopt(const wire::PoolInfo& info);
  Error lost(const std::string& what);
  // The byte stream is out of step (a reply that does not parse or does not pair with its
  // request): nothing more can be read from it safely, so the connection is closed.
  Error broken(Error e);

  static constexpr size_t kReadChunk = size_t{16} * 1024;

  int fd_ = -1;
  bool lost_ = false;  // a call found the connection lost
  uint32_t next_id_ = 1;
  std::vector<std::byte> out_;
  std::vector<std::byte> in_;
  size_t in_have_ = 0;  // bytes of in_ read and not yet consumed (a frame, or the start of one)
  wire::PoolInfo pool_;
  uint32_t notified_epoch_ = 0;  // the newest epoch a pool_changed notice announced
  bool syncing_ = false;         // inside sync(): its own calls do not sync again
  uint64_t session_id_ = 0;
  HashScheme hash_scheme_{};
  std::unique_ptr<PoolMapping> mapping_;
  std::byte* base_ = nullptr;  // mapping_->base()
};

}  // namespace kvpool::client

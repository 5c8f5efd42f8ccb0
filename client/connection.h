// libkvpool: a worker's connection to kvpoold.
//
// Connection::attach() connects to the daemon's Unix socket, says hello, receives the pool's
// memory (segment descriptors passed with the reply, or CUDA IPC handles) and maps it
// (client/pool_mapping.h), so the pool's bytes are at the same offsets from base() in this process
// as in every other worker of the pool. Where a page's KV lies depends on the pool's layout()
// (common/geometry.h): page_major, page p is page(p) = base() + p · page_stride, contiguous;
// layer_major, its K and V of layer l are T · H · D elements in layer l's planes, which are
// layer_stride() bytes apart (PoolKernels::paged_kv describes either for the kernels).
// Every call is one request and one reply, batched: alloc(n), retain(ids), release(ids),
// lookup(chain), publish(pairs), stats(). Expected failures (out of pages, not held, quota, the
// daemon gone) come back as an Error value carrying the daemon's code and message; nothing
// throws.
//
// The pages a session holds are released by the daemon when the connection closes, however it
// closes (destructor, exit, kill -9). A worker publishes a page only after writing all its
// bytes, and reads a page only while holding a reference to it.
//
// Thread-safety: a Connection serves one call at a time; use one per thread or lock around it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/pool_mapping.h"
#include "common/protocol.h"

namespace kvpool::client {

using wire::Error;
template <typename T>
using Result = wire::Result<T>;
struct Ok {};

// $KVPOOL_SOCKET if set, else the daemon's default (common/paths.h).
std::string default_socket_path();

class Connection {
 public:
  // Memory::none is for tools that only talk to the daemon (kvpoolctl, observers): the pool's
  // memory is not mapped (no GPU context is made for a GPU pool), base() is null.
  enum class Memory { map, none };
  static Result<std::unique_ptr<Connection>> attach(const std::string& socket_path,
                                                    const std::string& worker_name,
                                                    const std::string& pool_name = "",
                                                    Memory memory = Memory::map);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const wire::PoolInfo& pool() const { return pool_; }
  uint64_t session_id() const { return session_id_; }
  // Where page 0 is in this process: host memory, or device memory of CUDA ordinal device().
  std::byte* base() const { return base_; }
  int device() const { return mapping_ ? mapping_->device() : -1; }
  // page_major: page p's bytes. layer_major: base() + p · page_stride, which is not where a
  // page's KV lies (use the layer_major offsets of common/geometry.h).
  std::byte* page(PageId p) const { return base_ + uint64_t{p} * pool_.page_stride; }
  KvLayout layout() const { return pool_.layout; }
  // Bytes from layer l's K plane to layer l + 1's in layer_major; 0 in page_major.
  uint64_t layer_stride() const {
    return layer_stride_bytes(pool_.geometry, pool_.layout, pool_.num_pages);
  }
  // The scales of page p in 8-bit pools (layers · kv_heads · 2 floats, kernels/paged_kv.h), in the
  // side region after the last page; nullptr for 16-bit pools.
  float* page_scales(PageId p) const;

  // hints (priority class, pin TTL) apply to the pages the call leaves this session holding;
  // the default says nothing and sends nothing.
  Result<std::vector<PageId>> alloc(uint32_t count, const PageHints& hints = {});
  Result<Ok> retain(std::span<const PageId> pages, const PageHints& hints = {});
  Result<Ok> release(std::span<const PageId> pages);
  // The pages of the longest cached prefix of `chain`, each now held by this session.
  Result<std::vector<PageId>> lookup(std::span<const BlockHash> chain, const PageHints& hints = {});
  // The same, with the tier that served each hit (wire::kTierDevice, or wire::kTierHost for a
  // block the daemon promoted from the pool's host tier into the page before answering).
  Result<wire::LookupReply> lookup_with_tiers(std::span<const BlockHash> chain,
                                              const PageHints& hints = {});
  Result<std::vector<PublishResult>> publish(std::span<const PublishItem> items,
                                             const PageHints& hints = {});
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

  // One request, one reply (the typed calls above use it).
  Result<wire::Reply> call(const wire::Request& request);

  // The socket, for tests that need to send raw bytes.
  int socket_fd() const { return fd_; }

 private:
  explicit Connection(int fd) : fd_(fd) {}
  // Sends out_, reads one reply frame into a Reply (or Error). Captures a passed fd, if any.
  Result<wire::Reply> round_trip(uint32_t request_id, std::vector<int>* passed_fds);
  Error lost(const std::string& what);
  // The byte stream is out of step (a reply that does not parse or does not pair with its
  // request): nothing more can be read from it safely, so the connection is closed.
  Error broken(Error e);

  static constexpr size_t kReadChunk = size_t{16} * 1024;

  int fd_ = -1;
  uint32_t next_id_ = 1;
  std::vector<std::byte> out_;
  std::vector<std::byte> in_;
  wire::PoolInfo pool_;
  uint64_t session_id_ = 0;
  std::unique_ptr<PoolMapping> mapping_;
  std::byte* base_ = nullptr;  // mapping_->base()
};

}  // namespace kvpool::client

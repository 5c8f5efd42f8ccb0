// EventStream: follows kvpoold's prefix-index events, as KV-aware routers consume them.
//
// open() attaches to a pool (hello) and sends subscribe on that connection; from then on the
// daemon pushes event batches on it (common/wire/protocol.h, event_batch): `stored` when a block
// hash is published, `removed` when it leaves the index (evicted or flushed), `cleared` when a
// flush empties the pool's index, each with the next sequence number of the daemon's log, and `gap`
// when this reader fell behind the daemon's ring: `count` events were lost, `seq` is where the
// stream resumes (a router should then resynchronise, e.g. treat its view of the pool as stale).
// A non-admin sees its own tenant's blocks only; sequence numbers of events it may not see, or
// of other pools, are simply absent.
//
// next() waits for the next batch with a timeout; nothing is ever read ahead unboundedly (one
// frame at a time, at most the protocol's frame limit).
//
// Thread-safety: one thread at a time. Errors are values (no exceptions).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/connection/connection.h"

namespace kvpool::client {

class EventStream {
 public:
  // from_seq 0 = new events only; N ≥ 1 = from N on, as far as the daemon's ring still holds.
  static Result<std::unique_ptr<EventStream>> open(const std::string& socket_path,
                                                   const std::string& pool_name, uint64_t from_seq);

  const wire::SubscribeReply& subscribed() const { return subscribed_; }
  const wire::PoolInfo& pool() const { return connection_->pool(); }

  // The next batch, waiting up to timeout_ms (< 0: no limit); an empty batch when none came.
  // After close(): invalid_argument.
  Result<wire::EventBatch> next(int timeout_ms);

  // Ends the subscription now; idempotent. The socket is shut down, which also wakes a next()
  // waiting on it in another thread (it then fails); the connection itself is freed with the
  // stream, so nothing a waiting next() still uses goes away under it.
  void close();
  bool closed() const { return closed_; }

 private:
  explicit EventStream(std::unique_ptr<Connection> c) : connection_(std::move(c)) {}
  // One whole frame into header_/payload; false with `error` set on failure, and false with an
  // ok status when the timeout passed first.
  bool read_frame(int timeout_ms, Error& error);

  static constexpr uint32_t kRequestId = 1;
  static constexpr size_t kReadChunk = size_t{64} * 1024;

  std::unique_ptr<Connection> connection_;
  std::atomic<bool> closed_{false};
  wire::SubscribeReply subscribed_;
  std::vector<std::byte> buffer_;
  size_t have_ = 0;
  wire::FrameHeader header_;
  std::vector<std::byte> payload_;
};

}  // namespace kvpool::client

// Server: kvpoold's Unix-socket front end on one Boost.Asio event loop.
//
// One thread runs the io_context; it alone touches the Service (and so the pools), so no pool
// state is ever shared with a lock. Each connection reads with non-blocking recv() when the
// socket is readable, decodes every complete frame in what arrived, hands each request to the
// Service and sends the replies with non-blocking sendmsg() (which also carries the pool's
// segment descriptors with the hello reply, SCM_RIGHTS). Nothing in the loop ever waits on a
// client, and no client can hold more than its share (docs/ARCHITECTURE.md, "Limits"):
//   - hello deadline: a connection that has not attached within limits.hello_timeout_ms is
//     closed, and before hello a frame may carry at most kMaxPreHelloPayload bytes, so idle or
//     bloated unattached connections cannot keep session slots or memory (admins have reserved
//     slots besides, see Service::open_session);
//   - output backlog: before each request is handled, the connection's queued replies are
//     checked; past kMaxBacklogBytes the server handles no more of its requests (they wait in
//     its input buffer) and reads nothing until the peer has read its replies. So a client that
//     pipelines requests with large replies and never reads holds at most the limit plus one
//     reply;
//   - fairness: one turn handles at most kMaxFramesPerTurn requests or kMaxReplyBytesPerTurn of
//     replies for a connection, then the loop serves others before coming back;
//   - memory: each connection's buffers shrink back after a large frame or reply, and all
//     connections' buffers together stay under limits.max_buffered_bytes: past it the connection
//     holding the most is closed, not everyone;
//   - a client that sends part of a frame and stalls: after frame_timeout its connection is
//     closed; so is one that does not take an error reply after which we close;
//   - copies: a copy too large for the loop runs on the CopyWorker thread; its connection
//     handles nothing more until the reply is queued, and a close meanwhile is completed (the
//     session's references released) only once the copy is done;
//   - out of file descriptors: accept pauses kAcceptBackoff instead of spinning;
//   - a malformed header (bad magic, version, oversized length) cannot be resynchronised: the
//     client gets an error reply and the connection is closed; a payload that does not decode
//     gets an error reply and the connection goes on.
// When a connection closes for any reason, its session's references are released at once (after
// its running copy, if any).
//
// Operations, metrics and events: after each read's requests are handled, every subscribed
// connection (one that sent subscribe) gets the new events the Service has for it, at most
// 256 KiB queued per subscriber: one that does not read stops receiving, its cursor falls
// behind the ring and it later gets a gap event instead of what it missed, so it can neither
// block the loop nor grow the daemon's memory. A subscribed connection takes no more requests.
// KV events for routers: after each turn of requests (before their replies are sent, so a router
// hears of a block no later than the worker that published it hears back) and when a session
// closes, every pool's index changes go to the KvEventPublisher, when there is one.
// The time from a read's completion to each of its replies being queued is recorded in the
// Service's "request" latency histograms, and an activity hook (the stats publisher) runs after
// every batch of requests, before their replies are sent, and at every session open and close.
//
// Thread-safety: everything runs on the io_context's thread, except the CopyWorker's copies.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "daemon/config/config.h"
#include "daemon/service/copy_worker.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/kv_event_publisher.h"

namespace kvpool::daemon {

// What the Server tells about activity (the stats publisher listens).
class ActivityListener {
 public:
  virtual ~ActivityListener() = default;
  virtual void on_activity() = 0;
};

class Server {
 public:
  static constexpr size_t kMaxBacklogBytes = size_t{16} << 20;
  static constexpr uint32_t kMaxPreHelloPayload = 4096;  // a hello is ≤ 2 × kMaxNameBytes + 8
  static constexpr size_t kMaxFramesPerTurn = 1024;
  static constexpr size_t kMaxReplyBytesPerTurn = size_t{1} << 20;
  static constexpr std::chrono::milliseconds kAcceptBackoff{100};

  Server(boost::asio::io_context& io, Service& service, std::chrono::milliseconds frame_timeout);
  ~Server();

  // Binds and listens on `path` with `mode` and (if not empty) group `group`. Refuses a path on
  // which another daemon answers; removes a stale socket file. Errors name the path and cause.
  wire::Result<bool> listen(const std::string& path, uint32_t mode, const std::string& group);
  // Stops accepting, closes every connection (releasing its references) and removes the socket.
  void stop();

  size_t connections() const { return connections_.size(); }
  // Told after requests were handled (before their replies are sent) and when sessions open or
  // close; null = nobody. Not owned.
  void set_activity_listener(ActivityListener* listener) { activity_ = listener; }
  // Where the pools' index changes go (events.zmq_endpoint); null = nowhere. Not owned.
  void set_kv_event_publisher(KvEventPublisher* publisher) { kv_publisher_ = publisher; }

 private:
  class Connection;
  friend class Connection;

  void accept();
  // After accept failed for want of descriptors: closes the one held in reserve and accepts the
  // waiting connection with it. False when it was not that failure or nothing could be accepted.
  bool accept_with_reserve(const boost::system::error_code& ec);
  // Opens a session for an accepted connection, or refuses it with an error frame.
  void serve(boost::asio::local::stream_protocol::socket socket);
  void closed(const std::shared_ptr<Connection>& c);
  // Pushes new events to the subscribers.
  void pump_subscribers();
  // Hands each pool's pending KV events to the KvEventPublisher as one batch.
  void publish_kv_events();
  // After a pool's segments changed: a pool_changed notice to each of its sessions that has not
  // had one (not to subscribed connections, which carry only events).
  void notify_pool_changes();
  // Hands the Service's background jobs (segments made ahead of need or given back) to the
  // CopyWorker; each completion tells the sessions of what changed.
  void start_background_jobs();
  // Closes the connections holding the most buffered bytes until the total is within
  // limits.max_buffered_bytes.
  void enforce_buffer_budget();

  boost::asio::io_context& io_;
  Service& service_;
  std::chrono::milliseconds frame_timeout_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  boost::asio::steady_timer accept_backoff_;  // pause after a failed accept (EMFILE)
  int reserve_fd_ = -1;  // /dev/null, closed to accept a worker when descriptors run out
  std::string path_;
  std::set<std::shared_ptr<Connection>> connections_;
  CopyWorker copy_worker_;
  // The remote tiers' network I/O, apart from the copies and from each other: a lookup's fetch
  // never waits behind a batch of writes (daemon/remote/remote_tier.h).
  CopyWorker remote_fetch_worker_;
  CopyWorker remote_store_worker_;
  CopyWorker& worker_for(const CopyJob& job) {
    switch (job.worker) {
      case CopyJob::Worker::remote_fetch:
        return remote_fetch_worker_;
      case CopyJob::Worker::remote_store:
        return remote_store_worker_;
      case CopyJob::Worker::copy:
        break;
    }
    return copy_worker_;
  }
  bool stopping_ = false;
  // Operations, metrics and events.
  std::set<Connection*> subscribers_;  // the connections in connections_ that are subscribed
  uint64_t pumped_seq_ = 0;            // the event sequence subscribers were last pumped up to
  ActivityListener* activity_ = nullptr;
  KvEventPublisher* kv_publisher_ = nullptr;
};

}  // namespace kvpool::daemon

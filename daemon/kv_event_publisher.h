// KvEventPublisher: kvpoold's ZeroMQ endpoint for KV-aware routers, in vLLM's format.
//
// Algorithm: the Server hands it, after each turn of requests, every pool's index changes of
// that turn (KvEventBatcher). Each non-empty pool batch becomes ONE multipart message on a PUB
// socket, as vLLM's ZmqEventPublisher sends it:
//   frame 0: topic   = events.zmq_topic + the pool's name (subscribers filter by prefix)
//   frame 1: seq     = 8-byte big-endian unsigned, 0 for the first batch, +1 per batch (one
//                      counter for the endpoint, all pools)
//   frame 2: payload = the msgpack batch of kv_event_encoder.h
// A batch is sent with ZMQ_DONTWAIT under a bounded ZMQ_SNDHWM. libzmq's PUB socket drops a
// message for a subscriber whose queue is full (that subscriber sees a gap in seq) and never
// blocks; a send libzmq refuses outright (EAGAIN or an error) is counted as dropped and logged,
// at most once every kDropLogInterval. A dropped batch keeps its sequence number, so every
// subscriber sees the gap, and it stays in the replay buffer.
//
// Replay (optional, events.zmq_replay_endpoint): a ROUTER socket answering vLLM's replay
// requests (identity, "", start seq 8 B BE) with every buffered batch of seq ≥ start as
// (identity, "", seq, payload) and then (identity, "", -1 as 8 B BE, ""). The buffer keeps the
// newest events.zmq_replay_batches batches and at most kMaxReplayBytes. The protocol carries no
// topic: replayed batches are those of every pool. The socket is polled every kReplayPoll on the
// event loop (only when replay is on), at most kMaxReplayRequestsPerPoll requests a poll, so a
// flood of requests cannot hold the loop for long; one request costs one send (a copy into
// libzmq) per buffered batch it asks for. Replies past the ROUTER's HWM for that peer are dropped
// by libzmq (the end marker with them), as with vLLM's publisher; its client has a timeout.
//
// Thread-safety: the event-loop thread only (libzmq sockets are not thread-safe); libzmq's own
// I/O thread does the network work. Error policy: start() returns an Error naming the endpoint
// and libzmq's message when a socket cannot be made or bound; afterwards nothing fails: sends
// that fail are counted and logged. Sockets close with ZMQ_LINGER 0: stopping never waits on a
// subscriber.
// A kvpoold built with KVPOOL_ZMQ=OFF (no libzmq, e.g. the portable GPU-check build) has no
// endpoint: start() refuses events.zmq_endpoint, naming the build option.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "daemon/config.h"
#include "daemon/kv_event_encoder.h"

namespace kvpool::daemon {

class KvEventPublisher {
 public:
  static constexpr std::chrono::seconds kDropLogInterval{10};
  static constexpr std::chrono::milliseconds kReplayPoll{100};
  static constexpr size_t kMaxReplayRequestsPerPoll = 16;
  static constexpr size_t kMaxReplayBytes = size_t{64} << 20;

  // Binds events.zmq_endpoint (and zmq_replay_endpoint when set).
  static wire::Result<std::unique_ptr<KvEventPublisher>> start(const EventsConfig& config,
                                                               boost::asio::io_context& io);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Encodes `events` (one pool's batch) and sends it under the pool's topic.
  void publish(const std::string& pool_name, const KvEventFormat& format,
               const std::vector<KvEvent>& events);

  const KvEventCounters& counters() const { return counters_; }
  uint64_t next_seq() const { return next_seq_; }

 private:
  KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io);
  wire::Result<bool> bind();
  // Sends frames as one multipart message; false when libzmq refused the first frame.
  bool send_message(void* socket, const std::vector<std::string_view>& frames);
  void remember(uint64_t seq, std::string payload);
  void poll_replay();
  void answer_replay(const std::string& identity, const std::string& start_seq);

  EventsConfig config_;
  boost::asio::steady_timer replay_timer_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  uint64_t next_seq_ = 0;
  KvEventCounters counters_;
  std::deque<std::pair<uint64_t, std::string>> buffer_;  // (seq, payload), oldest first
  size_t buffer_bytes_ = 0;
  std::chrono::steady_clock::time_point last_drop_log_{};
  uint64_t drops_logged_ = 0;  // batches_dropped when the last drop was logged
};

}  // namespace kvpool::daemon

// KvEventPublisher: kvpoold's ZeroMQ endpoint for KV-aware routers, in vLLM's format.
//
// Endpoint: bound, or connected to when a router binds and engines connect (llm-d's central
// indexer does): events.zmq_mode, see binds(). The replay endpoint is always bound. libzmq's
// connecting PUB takes in the router's subscription only after its first send following the
// connection (libzmq 4.3, measured), so the batches of that moment are lost to the router,
// which sees the gap in the sequence numbers and asks the replay socket, as after any gap.
//
// Algorithm: the Server hands it, after each turn of requests, every pool's index changes of
// that turn (KvEventBatcher). A pool's batch becomes one multipart message on a PUB socket, as
// vLLM's ZmqEventPublisher sends it, or several when it holds more than kMaxHashesPerMessage
// block hashes or, with token ids, kMaxTokensPerMessage ids (a batch of 262,144 blocks would
// otherwise be one 4.7 MiB message, far more with its tokens, and libzmq queues whole messages):
//   frame 0: topic   = events.zmq_topic + the pool's name (subscribers filter by prefix)
//   frame 1: seq     = 8-byte big-endian unsigned, 0 for the first message, +1 per message (one
//                      counter for the endpoint, all pools)
//   frame 2: payload = the msgpack batch of kv_event_encoder.h
// Memory: a message goes out with ZMQ_DONTWAIT and never blocks the loop. libzmq holds it until
// every subscriber's connection has taken it, so a subscriber that does not read makes libzmq
// hold messages. Two bounds: ZMQ_SNDHWM (events.zmq_send_hwm messages per subscriber; past it
// libzmq drops that subscriber's messages, silently) and a byte budget for everything libzmq
// holds (events.zmq_queue_bytes): each payload is handed over with a free function that gives
// its bytes back to the budget when libzmq lets go of it, and a message that would pass the
// budget is not sent. Such a message, and one libzmq refuses, counts as dropped and keeps its
// sequence number, so every subscriber sees the gap, and it stays in the replay buffer. Drops
// are logged at most once every kDropLogInterval. After a subscriber leaves, what libzmq freed
// is handed back to the system (malloc_trim), so the resident size falls back.
// Connections: a flood of connections that never complete ZMTP's handshake must not take the
// daemon's descriptors (the workers' socket needs them): the handshake must finish within
// kHandshakeInterval, and a ZmqConnectionCap keeps at most events.zmq_max_connections per socket.
//
// Replay (optional, events.zmq_replay_endpoint): a ROUTER socket answering vLLM's replay
// requests (identity, "", start seq 8 B BE) with every buffered batch of seq ≥ start as
// (identity, "", seq, payload) and then (identity, "", -1 as 8 B BE, ""). The buffer keeps the
// newest events.zmq_replay_batches batches and at most kMaxReplayBytes. vLLM's protocol carries
// no topic: replayed batches are those of every pool, which a router cannot place on a node with
// several pools. kvpool's extension: a request with a fourth frame "topic" (kReplayTopicFrame)
// gets (identity, "", seq, payload, topic) for each batch and (identity, "", -1, "", "") at the
// end; a request of three frames is answered exactly as vLLM's publisher does. The socket is polled
// every kReplayPoll on the event loop (only when replay is on), at most kMaxReplayRequestsPerPoll
// requests a poll, so a flood of requests cannot hold the loop for long; one request costs one send
// (a copy into libzmq) per buffered batch it asks for. Replies past the ROUTER's HWM for that peer
// are dropped by libzmq (the end marker with them), as with vLLM's publisher; its client has a
// timeout.
//
// Thread-safety: the event-loop thread only (libzmq sockets are not thread-safe); libzmq's own
// I/O thread does the network work and frees sent payloads (queued_bytes_ is atomic for that).
// Error policy: start() returns an Error naming the endpoint and libzmq's message when a socket
// cannot be made or bound; afterwards nothing fails: sends that fail are counted and logged.
// Sockets close with ZMQ_LINGER 0: stopping never waits on a subscriber.
// A kvpoold built with KVPOOL_ZMQ=OFF (no libzmq, e.g. the portable GPU-check build) has no
// endpoint: start() refuses events.zmq_endpoint, naming the build option.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/telemetry/kv_event_encoder.h"
#include "daemon/telemetry/zmq_connection_cap.h"

namespace kvpool::daemon {

class KvEventPublisher {
 public:
  static constexpr std::chrono::seconds kDropLogInterval{10};
  static constexpr std::chrono::milliseconds kReplayPoll{100};
  static constexpr size_t kMaxReplayRequestsPerPoll = 16;
  static constexpr size_t kMaxReplayBytes = size_t{64} << 20;
  // The fourth frame of a replay request that asks for each batch's topic.
  static constexpr std::string_view kReplayTopicFrame = "topic";
  static constexpr size_t kMaxHashesPerMessage = 4096;   // ≤ ~74 KiB of hashes
  static constexpr size_t kMaxTokensPerMessage = 65536;  // ≤ ~320 KiB of token ids
  static constexpr std::chrono::milliseconds kHandshakeInterval{2000};
  static constexpr std::chrono::milliseconds kTrimDelay{100};
  static constexpr int kTrimAttempts = 20;  // tries over 2 s for libzmq to free a left queue

  // Binds events.zmq_endpoint (and zmq_replay_endpoint when set).
  static wire::Result<std::unique_ptr<KvEventPublisher>> start(const EventsConfig& config,
                                                               boost::asio::io_context& io);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Blocks one message may carry: kMaxHashesPerMessage, fewer when token ids are sent so that
  // a message stays under kMaxTokensPerMessage ids (at least one block).
  static size_t max_blocks_per_message(const KvEventFormat& format);

  // Whether events.zmq_endpoint is bound (else connected to): zmq_mode bind or connect, or for
  // auto vLLM's older rule (bind a wildcard host, ipc or inproc; connect to anything else).
  static bool binds(const EventsConfig& config);

  // Encodes `events` (one pool's batch) and sends it under the pool's topic.
  void publish(const std::string& pool_name, const KvEventFormat& format,
               const std::vector<KvEvent>& events);

  const KvEventCounters& counters() const { return counters_; }
  uint64_t next_seq() const { return next_seq_; }
  // Payload bytes libzmq holds now (sent, not yet taken by every subscriber).
  uint64_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  // Connections the endpoint shut down past events.zmq_max_connections.
  uint64_t connections_refused() const;
  // At a clean stop, after the last publish: the destructor waits up to `linger` for libzmq to
  // hand what is queued (the stop's AllBlocksCleared) to the subscribers.
  void finish(std::chrono::milliseconds linger);

 private:
  KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io);
  wire::Result<bool> bind(boost::asio::io_context& io);
  // Encodes and sends one message of at most kMaxHashesPerMessage hashes.
  void send_batch(const std::string& topic, const KvEventFormat& format, double ts,
                  const std::vector<KvEvent>& events);
  // Sends topic, seq and `payload` (handed to libzmq, counted in queued_bytes_ until freed);
  // false when the budget or libzmq refused it.
  bool send_counted(const std::string& topic, const std::string& seq, std::string payload,
                    const char*& why);
  // Sends frames as one multipart message (copied), or its first frames when `more`; false when
  // libzmq refused the first frame.
  bool send_message(void* socket, const std::vector<std::string_view>& frames, bool more = false);
  void count_drop(const char* why);
  // After a subscriber left: give what libzmq freed back to the system, a little later (libzmq
  // frees a connection's queue after it reports the disconnect).
  void trim_soon(int attempts_left);
  void remember(uint64_t seq, const std::string& topic, std::string payload);
  void poll_replay();
  void answer_replay(const std::string& identity, const std::string& start_seq, bool with_topic);

  EventsConfig config_;
  boost::asio::steady_timer replay_timer_;
  boost::asio::steady_timer trim_timer_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::unique_ptr<ZmqConnectionCap> pub_cap_;
  std::unique_ptr<ZmqConnectionCap> replay_cap_;
  bool trim_pending_ = false;              // trim_timer_ is armed
  std::atomic<uint64_t> queued_bytes_{0};  // outlives the context: freed payloads subtract
  uint64_t next_seq_ = 0;
  KvEventCounters counters_;
  struct Buffered {
    uint64_t seq = 0;
    std::string topic;
    std::string payload;
  };
  std::deque<Buffered> buffer_;  // oldest first
  size_t buffer_bytes_ = 0;
  std::chrono::steady_clock::time_point last_drop_log_{};
  uint64_t drops_logged_ = 0;  // batches_dropped when the last drop was logged
};

}  // namespace kvpool::daemon

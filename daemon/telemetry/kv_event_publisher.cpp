#include "daemon/telemetry/kv_event_publisher.h"

#ifdef KVPOOL_WITH_ZMQ
#include <zmq.h>
#endif

#include <malloc.h>

#include <algorithm>
#include <cerrno>

#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

#ifdef KVPOOL_WITH_ZMQ

namespace {

std::string seq_bytes(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((seq >> (8 * (7 - i))) & 0xff);
  return out;
}

uint64_t seq_value(const std::string& bytes) {
  uint64_t v = 0;
  for (const char c : bytes)
    v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// Receives the rest of a multipart message that is already in (a message arrives whole).
std::vector<std::string> receive_message(void* socket) {
  std::vector<std::string> frames;
  for (;;) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      break;
    }
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) break;
  }
  return frames;
}

// A payload handed to libzmq: its bytes count in the publisher's queued bytes until libzmq's
// I/O thread (or the sender, on failure) frees it.
struct HeldPayload {
  std::string bytes;
  std::atomic<uint64_t>* queued;
};

// Every HeldPayload is made before a release increment of this; the free function reads it
// with acquire before touching the payload. libzmq's own hand-over between threads already
// orders the two, but in a library a race detector does not see: this says it where it can.
std::atomic<uint64_t> payloads_handed{0};

void free_held_payload(void* /*data*/, void* hint) {
  (void)payloads_handed.load(std::memory_order_acquire);
  auto* held = static_cast<HeldPayload*>(hint);
  held->queued->fetch_sub(held->bytes.capacity(), std::memory_order_relaxed);
  delete held;
}

// Returns freed heap memory to the system. The sanitizers bring their own allocator.
void release_freed_memory() {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  (void)malloc_trim(0);
#endif
}

// Blocks [i, i + n) of `e`: a described stored event is one chain (KvEventBatcher), so a later
// part's parent is the block before it; its token ids are its blocks' own.
KvEvent slice(const KvEvent& e, size_t i, size_t n, uint32_t block_size) {
  const auto at = [](size_t k) { return static_cast<std::ptrdiff_t>(k); };
  KvEvent part{e.kind,     {e.hashes.begin() + at(i), e.hashes.begin() + at(i + n)},
               e.tier,     e.described,
               e.parent,   {},
               e.lora_name};
  if (i > 0 && e.described) part.parent = e.hashes[i - 1];
  if (!e.token_ids.empty()) {
    part.token_ids.assign(e.token_ids.begin() + at(i * block_size),
                          e.token_ids.begin() + at((i + n) * block_size));
  }
  return part;
}

size_t hash_count(const std::vector<KvEvent>& events) {
  size_t n = 0;
  for (const KvEvent& e : events)
    n += std::max<size_t>(e.hashes.size(), 1);
  return n;
}

}  // namespace

size_t KvEventPublisher::max_blocks_per_message(const KvEventFormat& format) {
  if (!format.token_ids || format.block_size == 0) return kMaxHashesPerMessage;
  return std::clamp<size_t>(kMaxTokensPerMessage / format.block_size, 1, kMaxHashesPerMessage);
}

bool KvEventPublisher::binds(const EventsConfig& config) {
  if (config.zmq_mode == "auto") {
    // vLLM's rule before it always bound: a wildcard host or a local transport binds.
    const std::string& e = config.zmq_endpoint;
    return e.find('*') != std::string::npos || e.find("::") != std::string::npos ||
           e.starts_with("ipc://") || e.starts_with("inproc://");
  }
  return config.zmq_mode != "connect";
}

KvEventPublisher::KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io)
    : config_(config), replay_timer_(io), trim_timer_(io) {}

KvEventPublisher::~KvEventPublisher() {
  replay_timer_.cancel();
  trim_timer_.cancel();
  pub_cap_.reset();  // their monitors go before the sockets they watch
  replay_cap_.reset();
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  if (context_ != nullptr) zmq_ctx_term(context_);
}

wire::Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(
    const EventsConfig& config, boost::asio::io_context& io) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(config, io));
  if (auto bound = p->bind(io); !bound.ok()) return bound.error();
  if (p->replay_ != nullptr) p->poll_replay();
  return p;
}

wire::Result<bool> KvEventPublisher::bind(boost::asio::io_context& io) {
  auto fail = [](const std::string& key, const std::string& endpoint, const std::string& what) {
    return wire::Error{Status(Errc::internal), "events." + key + " \"" + endpoint + "\": " + what +
                                                   ": " + zmq_strerror(zmq_errno())};
  };
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return fail("zmq_endpoint", config_.zmq_endpoint, "no ZeroMQ context");
  const int linger = 0;  // stopping never waits for a subscriber
  const int hwm = static_cast<int>(config_.zmq_send_hwm);
  const int handshake_ms = static_cast<int>(kHandshakeInterval.count());
  auto make = [&](int type, const std::string& key, const std::string& endpoint, void*& socket,
                  std::unique_ptr<ZmqConnectionCap>& cap) -> wire::Result<bool> {
    socket = zmq_socket(context_, type);
    if (socket == nullptr) return fail(key, endpoint, "cannot make a socket");
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(socket, ZMQ_HANDSHAKE_IVL, &handshake_ms, sizeof handshake_ms);
    if (type == ZMQ_PUB && !binds(config_)) {
      if (zmq_connect(socket, endpoint.c_str()) != 0) return fail(key, endpoint, "cannot connect");
    } else if (zmq_bind(socket, endpoint.c_str()) != 0) {
      return fail(key, endpoint, "cannot bind");
    }
    auto started = ZmqConnectionCap::start(context_, socket, endpoint, "events." + key,
                                           config_.zmq_max_connections, io);
    if (!started.ok()) return started.error();
    cap = std::move(started.value());
    return true;
  };
  if (auto ok = make(ZMQ_PUB, "zmq_endpoint", config_.zmq_endpoint, pub_, pub_cap_); !ok.ok()) {
    return ok;
  }
  pub_cap_->set_on_disconnect([this] { trim_soon(kTrimAttempts); });
  if (!config_.zmq_replay_endpoint.empty()) {
    if (auto ok = make(ZMQ_ROUTER, "zmq_replay_endpoint", config_.zmq_replay_endpoint, replay_,
                       replay_cap_);
        !ok.ok()) {
      return ok;
    }
  }
  return true;
}

void KvEventPublisher::finish(std::chrono::milliseconds linger) {
  // The destructor's zmq_ctx_term then waits for what is queued, up to `linger`.
  const int ms = static_cast<int>(linger.count());
  if (pub_ != nullptr) zmq_setsockopt(pub_, ZMQ_LINGER, &ms, sizeof ms);
}

uint64_t KvEventPublisher::connections_refused() const {
  return (pub_cap_ ? pub_cap_->refused() : 0) + (replay_cap_ ? replay_cap_->refused() : 0);
}

void KvEventPublisher::publish(const std::string& pool_name, const KvEventFormat& format,
                               const std::vector<KvEvent>& events) {
  if (events.empty()) return;
  const double ts = unix_seconds();
  const std::string topic = config_.zmq_topic + pool_name;
  const size_t limit = max_blocks_per_message(format);
  if (hash_count(events) <= limit) {
    send_batch(topic, format, ts, events);
    return;
  }
  // Split in order: a message takes events, or parts of one, until it holds the maximum.
  std::vector<KvEvent> part;
  size_t held = 0;
  const auto send_if_full = [&] {
    if (held < limit) return;
    send_batch(topic, format, ts, part);
    part.clear();
    held = 0;
  };
  for (const KvEvent& e : events) {
    if (e.kind == KvEvent::Kind::cleared) {
      send_if_full();
      part.push_back(e);
      ++held;
      continue;
    }
    for (size_t i = 0; i < e.hashes.size();) {
      send_if_full();
      const size_t n = std::min(e.hashes.size() - i, limit - held);
      part.push_back(slice(e, i, n, format.block_size));
      held += n;
      i += n;
    }
  }
  if (!part.empty()) send_batch(topic, format, ts, part);
}

void KvEventPublisher::send_batch(const std::string& topic, const KvEventFormat& format, double ts,
                                  const std::vector<KvEvent>& events) {
  std::string payload;
  encode_kv_event_batch(ts, events, format, payload);
  const uint64_t seq = next_seq_++;
  std::string kept;
  if (replay_ != nullptr) kept = payload;
  const char* why = nullptr;
  if (send_counted(topic, seq_bytes(seq), std::move(payload), why)) {
    ++counters_.batches_published;
  } else {
    count_drop(why);
  }
  if (replay_ != nullptr) remember(seq, topic, std::move(kept));
}

bool KvEventPublisher::send_counted(const std::string& topic, const std::string& seq,
                                    std::string payload, const char*& why) {
  // The budget counts what the payload occupies, not only what it says.
  if (payload.capacity() > payload.size() + payload.size() / 4) payload.shrink_to_fit();
  if (queued_bytes_.load(std::memory_order_relaxed) + payload.capacity() >
      config_.zmq_queue_bytes) {
    why = "events.zmq_queue_bytes reached: a subscriber is not reading";
    return false;
  }
  auto* held = new HeldPayload{std::move(payload), &queued_bytes_};
  queued_bytes_.fetch_add(held->bytes.capacity(), std::memory_order_relaxed);  // freeing subtracts
  zmq_msg_t msg;
  zmq_msg_init_data(&msg, held->bytes.data(), held->bytes.size(), free_held_payload, held);
  // The last touch of `held` on this thread is above: from here libzmq's thread may free it.
  payloads_handed.fetch_add(1, std::memory_order_release);  // see free_held_payload
  // libzmq takes a multipart message whole or not at all once its first frame is in; a refusal
  // can only come at the first frame.
  bool sent = send_message(pub_, {topic, seq}, /*more=*/true) &&
              zmq_msg_send(&msg, pub_, ZMQ_DONTWAIT) >= 0;
  if (!sent) {
    why = zmq_strerror(zmq_errno());
    zmq_msg_close(&msg);  // frees the payload, which gives its bytes back
  }
  return sent;
}

void KvEventPublisher::count_drop(const char* why) {
  ++counters_.batches_dropped;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_drop_log_ >= kDropLogInterval) {
    log_event(LogLevel::warn, "kv_events_dropped",
              {kv("endpoint", config_.zmq_endpoint), kv("error", why),
               kv("queued_bytes", queued_bytes()), kv("limit", config_.zmq_queue_bytes),
               kv("dropped", counters_.batches_dropped - drops_logged_),
               kv("dropped_total", counters_.batches_dropped)});
    last_drop_log_ = now;
    drops_logged_ = counters_.batches_dropped;
  }
}

void KvEventPublisher::trim_soon(int attempts_left) {
  if (trim_pending_ && attempts_left == kTrimAttempts) return;  // under way: churn cannot delay it
  trim_pending_ = true;
  trim_timer_.expires_after(kTrimDelay);
  trim_timer_.async_wait([this, attempts_left](const boost::system::error_code& ec) {
    if (ec) return;
    // The PUB socket finishes tearing down a subscriber's queue only when the application calls
    // into it (libzmq runs socket commands on API calls): ask for its events to let it, then
    // give the memory back once libzmq's I/O thread has freed it (or the attempts run out:
    // another subscriber may still hold messages).
    int events = 0;
    size_t size = sizeof events;
    zmq_getsockopt(pub_, ZMQ_EVENTS, &events, &size);
    if (queued_bytes() > 0 && attempts_left > 1) {
      trim_soon(attempts_left - 1);  // not a fresh call: passes the check above
      return;
    }
    trim_pending_ = false;
    release_freed_memory();
    log_event(LogLevel::debug, "kv_events_memory_released", {kv("queued_bytes", queued_bytes())});
  });
}

bool KvEventPublisher::send_message(void* socket, const std::vector<std::string_view>& frames,
                                    bool more) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() || more ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) {
      // libzmq takes a multipart message whole or not at all once its first frame is in; a
      // refusal can only come at the first frame.
      return false;
    }
  }
  return true;
}

void KvEventPublisher::remember(uint64_t seq, const std::string& topic, std::string payload) {
  buffer_bytes_ += topic.size() + payload.size();
  buffer_.push_back(Buffered{seq, topic, std::move(payload)});
  while (!buffer_.empty() &&
         (buffer_.size() > config_.zmq_replay_batches || buffer_bytes_ > kMaxReplayBytes)) {
    buffer_bytes_ -= buffer_.front().topic.size() + buffer_.front().payload.size();
    buffer_.pop_front();
  }
}

void KvEventPublisher::poll_replay() {
  for (size_t n = 0; n < kMaxReplayRequestsPerPoll; ++n) {
    const std::vector<std::string> frames = receive_message(replay_);
    if (frames.empty()) break;
    ++counters_.replay_requests;
    // vLLM's request: identity, empty delimiter, start sequence (8 bytes big-endian); kvpool's
    // adds a frame "topic" asking for each batch's topic.
    const bool with_topic = frames.size() == 4 && frames[3] == kReplayTopicFrame;
    if ((frames.size() != 3 && !with_topic) || !frames[1].empty() || frames[2].size() != 8) {
      log_event(LogLevel::warn, "kv_events_bad_replay_request",
                {kv("endpoint", config_.zmq_replay_endpoint), kv("frames", frames.size())});
      continue;
    }
    answer_replay(frames[0], frames[2], with_topic);
  }
  replay_timer_.expires_after(kReplayPoll);
  replay_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) poll_replay();
  });
}

void KvEventPublisher::answer_replay(const std::string& identity, const std::string& start_seq,
                                     bool with_topic) {
  const uint64_t start = seq_value(start_seq);
  for (const Buffered& b : buffer_) {
    if (b.seq < start) continue;
    // ROUTER drops what passes its HWM for this peer; the client then misses the tail and
    // waits for the end marker in vain, as with vLLM's own publisher (it has a timeout).
    const std::string seq = seq_bytes(b.seq);
    std::vector<std::string_view> frames{identity, "", seq, b.payload};
    if (with_topic) frames.push_back(b.topic);
    (void)send_message(replay_, frames);
  }
  const std::string end = seq_bytes(~uint64_t{0});
  std::vector<std::string_view> frames{identity, "", end, ""};
  if (with_topic) frames.push_back("");
  (void)send_message(replay_, frames);
}

#else  // KVPOOL_ZMQ=OFF: no endpoint can be started; the rest is never reached.

KvEventPublisher::KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io)
    : config_(config), replay_timer_(io), trim_timer_(io) {}

KvEventPublisher::~KvEventPublisher() = default;

uint64_t KvEventPublisher::connections_refused() const {
  return 0;
}

void KvEventPublisher::finish(std::chrono::milliseconds) {}

bool KvEventPublisher::binds(const EventsConfig& config) {
  return config.zmq_mode != "connect";
}

wire::Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(const EventsConfig& config,
                                                                        boost::asio::io_context&) {
  return wire::Error{Status(Errc::invalid_argument),
                     "events.zmq_endpoint \"" + config.zmq_endpoint +
                         "\": this kvpoold was built without ZeroMQ (KVPOOL_ZMQ=OFF)"};
}

void KvEventPublisher::publish(const std::string&, const KvEventFormat&,
                               const std::vector<KvEvent>&) {}

#endif  // KVPOOL_WITH_ZMQ

}  // namespace kvpool::daemon

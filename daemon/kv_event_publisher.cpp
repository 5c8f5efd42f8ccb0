#include "daemon/kv_event_publisher.h"

#ifdef KVPOOL_WITH_ZMQ
#include <zmq.h>
#endif

#include <cerrno>

#include "daemon/log.h"

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

}  // namespace

KvEventPublisher::KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io)
    : config_(config), replay_timer_(io) {}

KvEventPublisher::~KvEventPublisher() {
  replay_timer_.cancel();
  if (pub_ != nullptr) zmq_close(pub_);
  if (replay_ != nullptr) zmq_close(replay_);
  if (context_ != nullptr) zmq_ctx_term(context_);
}

wire::Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(
    const EventsConfig& config, boost::asio::io_context& io) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(config, io));
  if (auto bound = p->bind(); !bound.ok()) return bound.error();
  if (p->replay_ != nullptr) p->poll_replay();
  return p;
}

wire::Result<bool> KvEventPublisher::bind() {
  auto fail = [](const std::string& key, const std::string& endpoint, const std::string& what) {
    return wire::Error{Status(Errc::internal), "events." + key + " \"" + endpoint + "\": " + what +
                                                   ": " + zmq_strerror(zmq_errno())};
  };
  context_ = zmq_ctx_new();
  if (context_ == nullptr) return fail("zmq_endpoint", config_.zmq_endpoint, "no ZeroMQ context");
  const int linger = 0;  // stopping never waits for a subscriber
  const int hwm = static_cast<int>(config_.zmq_send_hwm);
  auto make = [&](int type, const std::string& key, const std::string& endpoint,
                  void*& socket) -> wire::Result<bool> {
    socket = zmq_socket(context_, type);
    if (socket == nullptr) return fail(key, endpoint, "cannot make a socket");
    zmq_setsockopt(socket, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(socket, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(socket, endpoint.c_str()) != 0) return fail(key, endpoint, "cannot bind");
    return true;
  };
  if (auto ok = make(ZMQ_PUB, "zmq_endpoint", config_.zmq_endpoint, pub_); !ok.ok()) return ok;
  if (!config_.zmq_replay_endpoint.empty()) {
    if (auto ok = make(ZMQ_ROUTER, "zmq_replay_endpoint", config_.zmq_replay_endpoint, replay_);
        !ok.ok()) {
      return ok;
    }
  }
  return true;
}

void KvEventPublisher::publish(const std::string& pool_name, const KvEventFormat& format,
                               const std::vector<KvEvent>& events) {
  if (events.empty()) return;
  std::string payload;
  encode_kv_event_batch(unix_seconds(), events, format, payload);
  const uint64_t seq = next_seq_++;
  const std::string topic = config_.zmq_topic + pool_name;
  const std::string seq_frame = seq_bytes(seq);
  if (send_message(pub_, {topic, seq_frame, payload})) {
    ++counters_.batches_published;
  } else {
    ++counters_.batches_dropped;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_drop_log_ >= kDropLogInterval) {
      log_event(LogLevel::warn, "kv_events_dropped",
                {kv("endpoint", config_.zmq_endpoint), kv("error", zmq_strerror(zmq_errno())),
                 kv("dropped", counters_.batches_dropped - drops_logged_),
                 kv("dropped_total", counters_.batches_dropped)});
      last_drop_log_ = now;
      drops_logged_ = counters_.batches_dropped;
    }
  }
  if (replay_ != nullptr) remember(seq, std::move(payload));
}

bool KvEventPublisher::send_message(void* socket, const std::vector<std::string_view>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) {
      // libzmq takes a multipart message whole or not at all once its first frame is in; a
      // refusal can only come at the first frame.
      return false;
    }
  }
  return true;
}

void KvEventPublisher::remember(uint64_t seq, std::string payload) {
  buffer_bytes_ += payload.size();
  buffer_.emplace_back(seq, std::move(payload));
  while (!buffer_.empty() &&
         (buffer_.size() > config_.zmq_replay_batches || buffer_bytes_ > kMaxReplayBytes)) {
    buffer_bytes_ -= buffer_.front().second.size();
    buffer_.pop_front();
  }
}

void KvEventPublisher::poll_replay() {
  for (size_t n = 0; n < kMaxReplayRequestsPerPoll; ++n) {
    const std::vector<std::string> frames = receive_message(replay_);
    if (frames.empty()) break;
    ++counters_.replay_requests;
    // vLLM's request: identity, empty delimiter, start sequence (8 bytes big-endian).
    if (frames.size() != 3 || !frames[1].empty() || frames[2].size() != 8) {
      log_event(LogLevel::warn, "kv_events_bad_replay_request",
                {kv("endpoint", config_.zmq_replay_endpoint), kv("frames", frames.size())});
      continue;
    }
    answer_replay(frames[0], frames[2]);
  }
  replay_timer_.expires_after(kReplayPoll);
  replay_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) poll_replay();
  });
}

void KvEventPublisher::answer_replay(const std::string& identity, const std::string& start_seq) {
  const uint64_t start = seq_value(start_seq);
  for (const auto& [seq, payload] : buffer_) {
    if (seq < start) continue;
    // ROUTER drops what passes its HWM for this peer; the client then misses the tail and
    // waits for the end marker in vain, as with vLLM's own publisher (it has a timeout).
    (void)send_message(replay_, {identity, "", seq_bytes(seq), payload});
  }
  (void)send_message(replay_, {identity, "", seq_bytes(~uint64_t{0}), ""});
}

#else  // KVPOOL_ZMQ=OFF: no endpoint can be started; the rest is never reached.

KvEventPublisher::KvEventPublisher(const EventsConfig& config, boost::asio::io_context& io)
    : config_(config), replay_timer_(io) {}

KvEventPublisher::~KvEventPublisher() = default;

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

#include "daemon/telemetry/zmq_connection_cap.h"

#ifdef KVPOOL_WITH_ZMQ

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <zmq.h>

#include <cstddef>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// A monitor message: frame 1 = event (uint16) and value (uint32) in host order, frame 2 = the
// endpoint. Returns false when none is waiting.
bool next_event(void* monitor, uint16_t& event, uint32_t& value) {
  zmq_msg_t msg;
  zmq_msg_init(&msg);
  if (zmq_msg_recv(&msg, monitor, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&msg);
    return false;
  }
  const bool well_formed = zmq_msg_size(&msg) == 6;
  if (well_formed) {
    const auto* data = static_cast<const uint8_t*>(zmq_msg_data(&msg));
    std::memcpy(&event, data, sizeof event);
    std::memcpy(&value, data + 2, sizeof value);
  }
  bool more = zmq_msg_more(&msg) != 0;
  zmq_msg_close(&msg);
  while (more) {  // the endpoint frame (whole messages arrive at once)
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, monitor, ZMQ_DONTWAIT) < 0)
      more = false;
    else
      more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
  }
  if (!well_formed) event = 0;
  return true;
}

}  // namespace

ZmqConnectionCap::ZmqConnectionCap(void* socket, uint32_t max_connections,
                                   boost::asio::io_context& io)
    : socket_(socket), max_(max_connections), wake_(io) {}

wire::Result<std::unique_ptr<ZmqConnectionCap>> ZmqConnectionCap::start(
    void* context, void* socket, const std::string& endpoint, const std::string& name,
    uint32_t max_connections, boost::asio::io_context& io) {
  auto fail = [&](const std::string& what) {
    return wire::Error{Status(Errc::internal),
                       name + " \"" + endpoint + "\": " + what + ": " + zmq_strerror(zmq_errno())};
  };
  std::unique_ptr<ZmqConnectionCap> cap(new ZmqConnectionCap(socket, max_connections, io));
  // Where the socket is bound: the port libzmq chose for "tcp://HOST:*", or the ipc path.
  char last[512] = {};
  size_t last_size = sizeof last;
  if (zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, last, &last_size) != 0) {
    return fail("cannot read the bound address");
  }
  const std::string bound(last);
  if (bound.rfind("ipc://", 0) == 0) {
    cap->ipc_path_ = bound.substr(6);
  } else {
    cap->tcp_port_ = std::atoi(bound.substr(bound.rfind(':') + 1).c_str());
  }
  const std::string address = "inproc://kvpool-monitor-" + name;
  if (zmq_socket_monitor(socket, address.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) !=
      0) {
    return fail("cannot monitor the connections");
  }
  cap->monitor_ = zmq_socket(context, ZMQ_PAIR);
  if (cap->monitor_ == nullptr) return fail("cannot make the monitor socket");
  const int linger = 0;
  zmq_setsockopt(cap->monitor_, ZMQ_LINGER, &linger, sizeof linger);
  // No limit on queued events: libzmq's I/O thread sends them with a blocking send under the
  // socket's monitor lock, so a full queue (a flood while the loop is busy or already stopped)
  // would stall all of libzmq's I/O, and zmq_socket_monitor(nullptr) at the end with it. For an
  // inproc pipe, a receive limit of 0 here makes the whole pipe unbounded.
  const int unlimited = 0;
  zmq_setsockopt(cap->monitor_, ZMQ_RCVHWM, &unlimited, sizeof unlimited);
  if (zmq_connect(cap->monitor_, address.c_str()) != 0) return fail("cannot read the monitor");
  int fd = -1;
  size_t fd_size = sizeof fd;
  if (zmq_getsockopt(cap->monitor_, ZMQ_FD, &fd, &fd_size) != 0) {
    return fail("cannot wait on the monitor");
  }
  boost::system::error_code ec;
  cap->wake_.assign(fd, ec);
  if (ec) return fail("cannot wait on the monitor (" + ec.message() + ")");
  cap->drain();
  cap->wait();
  return cap;
}

ZmqConnectionCap::~ZmqConnectionCap() {
  boost::system::error_code ignored;
  wake_.cancel(ignored);
  (void)wake_.release();  // libzmq's descriptor: libzmq closes it
  zmq_socket_monitor(socket_, nullptr, 0);
  if (monitor_ != nullptr) zmq_close(monitor_);
}

// ZMQ_FD signals by edges: it becomes readable when libzmq has something new, and drain() reads
// until EAGAIN before the next wait is queued, on the same thread, so no edge falls between.
void ZmqConnectionCap::wait() {
  wake_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                   [this](const boost::system::error_code& ec) {
                     if (ec) return;  // cancelled: `this` may be gone
                     drain();
                     wait();
                   });
}

void ZmqConnectionCap::drain() {
  // Read everything first: an ACCEPTED whose DISCONNECTED is also here is over, and its
  // descriptor number may already belong to a newer connection.
  std::vector<std::pair<uint16_t, int>> events;
  std::unordered_map<int, int> disconnects_ahead;
  uint16_t event = 0;
  uint32_t value = 0;
  while (next_event(monitor_, event, value)) {
    events.emplace_back(event, static_cast<int>(value));
    if (event == ZMQ_EVENT_DISCONNECTED) ++disconnects_ahead[static_cast<int>(value)];
  }
  bool freed = false;
  pruned_ = false;
  for (const auto& [kind, fd] : events) {
    if (kind == ZMQ_EVENT_ACCEPTED) {
      if (disconnects_ahead[fd] == 0) accepted(fd);
    } else if (kind == ZMQ_EVENT_DISCONNECTED) {
      --disconnects_ahead[fd];
      if (open_.erase(fd) == 1) freed = true;
    }
  }
  if (freed && on_disconnect_) on_disconnect_();
}

void ZmqConnectionCap::accepted(int fd) {
  if (open_.size() >= max_ && !pruned_) {
    // A connection libzmq closed without a disconnect event would hold a place for ever. Once per
    // drain: a flood must not cost a scan of every held descriptor per connection.
    pruned_ = true;
    std::vector<int> gone;
    for (const int held : open_)
      if (!is_endpoint_connection(held)) gone.push_back(held);
    for (const int held : gone)
      open_.erase(held);
  }
  if (open_.size() < max_) {
    open_.insert(fd);
    return;
  }
  if (!is_endpoint_connection(fd)) return;  // already closed (and perhaps reused)
  ::shutdown(fd, SHUT_RDWR);
  if (refused_++ == 0 || refused_ % 1000 == 0) {
    log_event(LogLevel::warn, "zmq_connection_refused",
              {kv("open", open_.size()), kv("max", max_), kv("refused_total", refused_),
               kv("detail", "events.zmq_max_connections reached; the newest is shut down")});
  }
}

bool ZmqConnectionCap::is_endpoint_connection(int fd) const {
  int listening = 0;
  socklen_t len = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || listening != 0) {
    return false;
  }
  sockaddr_storage local{};
  socklen_t local_len = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  if (tcp_port_ >= 0) {
    if (local.ss_family == AF_INET) {
      return ntohs(reinterpret_cast<const sockaddr_in&>(local).sin_port) == tcp_port_;
    }
    if (local.ss_family == AF_INET6) {
      return ntohs(reinterpret_cast<const sockaddr_in6&>(local).sin6_port) == tcp_port_;
    }
    return false;
  }
  if (local.ss_family != AF_UNIX || local_len <= offsetof(sockaddr_un, sun_path)) return false;
  // The name as the kernel has it: a path, or an abstract name ("ipc://@name") after a NUL.
  const auto& un = reinterpret_cast<const sockaddr_un&>(local);
  std::string name(un.sun_path, local_len - offsetof(sockaddr_un, sun_path));
  if (!name.empty() && name[0] == '\0') {
    name[0] = '@';
  } else {
    name.resize(::strnlen(name.data(), name.size()));
  }
  return name == ipc_path_;
}

}  // namespace kvpool::daemon

#else  // KVPOOL_ZMQ=OFF: KvEventPublisher never starts one.

namespace kvpool::daemon {

ZmqConnectionCap::~ZmqConnectionCap() = default;

}  // namespace kvpool::daemon

#endif  // KVPOOL_WITH_ZMQ

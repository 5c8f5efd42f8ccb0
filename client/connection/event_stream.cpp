#include "client/connection/event_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace kvpool::client {

namespace {

Error failure(Errc code, std::string message) {
  return Error{Status(code), std::move(message)};
}

}  // namespace

Result<std::unique_ptr<EventStream>> EventStream::open(const std::string& socket_path,
                                                       const std::string& pool_name,
                                                       uint64_t from_seq) {
  // A reader hashes nothing: no scheme, so it follows pools of every scheme.
  auto c = Connection::attach(socket_path, "kvpoolctl-events", pool_name, Connection::Memory::none,
                              0, HashScheme{});
  if (!c.ok()) return c.error();
  std::unique_ptr<EventStream> s(new EventStream(std::move(c.value())));
  std::vector<std::byte> out;
  wire::encode_request(kRequestId, wire::SubscribeRequest{from_seq}, out);
  const int fd = s->connection_->socket_fd();
  for (size_t put = 0; put < out.size();) {
    const ssize_t n = ::send(fd, out.data() + put, out.size() - put, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failure(Errc::connection_lost, std::string("send: ") + std::strerror(errno));
    put += static_cast<size_t>(n);
  }
  Error e;
  if (!s->read_frame(-1, e)) return e;
  auto reply = wire::decode_reply(s->header_, s->payload_);
  if (!reply.ok()) return reply.error();
  const auto* sub = std::get_if<wire::SubscribeReply>(&reply.value());
  if (sub == nullptr)
    return failure(Errc::malformed_frame, "subscribe answered with another reply");
  s->subscribed_ = *sub;
  return s;
}

bool EventStream::read_frame(int timeout_ms, Error& error) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const int fd = connection_->socket_fd();
  size_t need = wire::kHeaderBytes;
  bool have_header = false;
  for (;;) {
    if (!have_header && have_ >= wire::kHeaderBytes) {
      auto h = wire::decode_header(std::span(buffer_).first(wire::kHeaderBytes));
      if (!h.ok()) {
        error = h.error();
        return false;
      }
      header_ = h.value();
      need = wire::kHeaderBytes + header_.length;
      have_header = true;
    }
    if (have_header && have_ >= need) break;
    if (buffer_.size() < std::max(need, kReadChunk)) buffer_.resize(std::max(need, kReadChunk));
    int wait = -1;
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      wait = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, wait);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      error = Error{};
      return false;
    }
    const ssize_t n = ::recv(fd, buffer_.data() + have_, buffer_.size() - have_, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = failure(Errc::connection_lost, n == 0 ? "kvpoold closed the event stream"
                                                    : std::string("recv: ") + std::strerror(errno));
      return false;
    }
    have_ += static_cast<size_t>(n);
  }
  payload_.assign(buffer_.begin() + wire::kHeaderBytes,
                  buffer_.begin() + static_cast<std::ptrdiff_t>(need));
  std::memmove(buffer_.data(), buffer_.data() + need, have_ - need);
  have_ -= need;
  return true;
}

void EventStream::close() {
  if (closed_.exchange(true)) return;
  ::shutdown(connection_->socket_fd(), SHUT_RDWR);
}

Result<wire::EventBatch> EventStream::next(int timeout_ms) {
  if (closed_) return failure(Errc::invalid_argument, "the event stream is closed");
  Error e;
  if (!read_frame(timeout_ms, e)) {
    if (e.status.ok()) return wire::EventBatch{};
    return e;
  }
  if (header_.opcode == (static_cast<uint16_t>(wire::Opcode::event_batch) | wire::kReplyBit)) {
    return wire::decode_event_batch(header_, payload_);
  }
  // Anything else is the daemon's error reply (e.g. after a request it refused) or garbage.
  auto reply = wire::decode_reply(header_, payload_);
  if (!reply.ok()) return reply.error();
  return failure(Errc::malformed_frame, "a reply where an event batch was expected");
}

}  // namespace kvpool::client

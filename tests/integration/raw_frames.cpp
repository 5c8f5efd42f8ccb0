#include "tests/integration/raw_frames.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace kvpool::testing {

namespace {

bool recv_exactly(int fd, std::byte* out, size_t n, int timeout_ms) {
  size_t got = 0;
  while (got < n) {
    if (timeout_ms >= 0 && !readable_within(fd, timeout_ms)) return false;
    const ssize_t r = ::recv(fd, out + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

bool readable_within(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1;
}

RawReply read_raw_reply(int fd, int timeout_ms) {
  RawReply out;
  std::vector<std::byte> buf(wire::kHeaderBytes);
  if (!recv_exactly(fd, buf.data(), buf.size(), timeout_ms)) {
    out.closed = true;
    return out;
  }
  const auto h = wire::decode_header(buf);
  if (!h.ok()) {
    out.closed = true;
    return out;
  }
  out.header = h.value();
  buf.resize(h.value().length);
  if (!recv_exactly(fd, buf.data(), buf.size(), timeout_ms)) {
    out.closed = true;
    return out;
  }
  const auto r = wire::decode_reply(h.value(), buf);
  if (!r.ok()) out.error = r.error();
  return out;
}

bool peer_closed(int fd) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0) return true;
    if (n < 0) return false;
  }
}

int connect_raw(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::vector<std::byte> frame(const wire::Request& r, uint32_t id) {
  std::vector<std::byte> out;
  wire::encode_request(id, r, out);
  return out;
}

bool send_all(int fd, const std::vector<std::byte>& b) {
  size_t sent = 0;
  while (sent < b.size()) {
    const ssize_t n = ::send(fd, b.data() + sent, b.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace kvpool::testing

#include "bench/ipc/ping_pong.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvpool::bench {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void serve(int listen_fd) {
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  std::vector<char> buf(1 << 20);
  std::vector<char> reply(1 << 20, 'r');
  for (;;) {
    size_t have = 0;
    uint32_t want = 8;
    uint32_t reply_bytes = 0;
    while (have < want) {
      const ssize_t n = ::recv(fd, buf.data() + have, buf.size() - have, 0);
      if (n <= 0) ::_exit(0);
      have += static_cast<size_t>(n);
      if (have >= 8) {
        std::memcpy(&want, buf.data(), 4);
        std::memcpy(&reply_bytes, buf.data() + 4, 4);
      }
    }
    if (::send(fd, reply.data(), reply_bytes, MSG_NOSIGNAL) != static_cast<ssize_t>(reply_bytes)) {
      ::_exit(1);
    }
  }
}

}  // namespace

Percentiles percentiles(std::vector<double>& samples) {
  if (samples.empty()) return {};
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) { return samples[static_cast<size_t>(q * double(samples.size() - 1))]; };
  return {at(0.50), at(0.99)};
}

PingPong::PingPong(const std::string& path) {
  const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ::unlink(path.c_str());
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0) {
    std::perror("ping-pong: bind");
    std::exit(1);
  }
  std::fflush(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) serve(lfd);
  ::close(lfd);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    std::perror("ping-pong: connect");
    std::exit(1);
  }
  ::unlink(path.c_str());
}

PingPong::~PingPong() {
  ::close(fd_);
  ::waitpid(pid_, nullptr, 0);
}

double PingPong::round_trip(uint32_t request, uint32_t reply) {
  out_.resize(std::max<uint32_t>(request, 8));
  std::memcpy(out_.data(), &request, 4);
  std::memcpy(out_.data() + 4, &reply, 4);
  in_.resize(std::max<size_t>(reply, 1));
  const auto t0 = Clock::now();
  if (::send(fd_, out_.data(), out_.size(), MSG_NOSIGNAL) < 0) std::exit(1);
  size_t have = 0;
  while (have < reply) {
    const ssize_t n = ::recv(fd_, in_.data() + have, in_.size() - have, 0);
    if (n <= 0) std::exit(1);
    have += static_cast<size_t>(n);
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

Percentiles PingPong::measure(uint32_t request, uint32_t reply, size_t n) {
  std::vector<double> us;
  us.reserve(n);
  for (size_t i = 0; i < n; ++i)
    us.push_back(round_trip(request, reply));
  return percentiles(us);
}

}  // namespace kvpool::bench

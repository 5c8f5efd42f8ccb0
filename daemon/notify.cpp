#include "daemon/notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

Notifier::Notifier() {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  path_ = path;
  if (path_.size() >= sizeof(sockaddr_un::sun_path) || (path_[0] != '/' && path_[0] != '@')) {
    log_event(LogLevel::warn, "notify_socket_invalid", {kv("path", path_)});
    return;
  }
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
}

Notifier::~Notifier() {
  if (fd_ >= 0) ::close(fd_);
}

bool Notifier::notify(std::string_view state) {
  if (fd_ < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  if (path_[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path_.size());
  const ssize_t n = ::sendto(fd_, state.data(), state.size(), MSG_NOSIGNAL,
                             reinterpret_cast<const sockaddr*>(&addr), len);
  if (n == static_cast<ssize_t>(state.size())) return true;
  if (!reported_failure_) {
    reported_failure_ = true;
    log_event(LogLevel::warn, "notify_failed",
              {kv("path", path_), kv("error", std::strerror(errno))});
  }
  return false;
}

std::chrono::microseconds Notifier::watchdog_interval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return std::chrono::microseconds(0);
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr) {
    if (std::strtol(pid, nullptr, 10) != ::getpid()) return std::chrono::microseconds(0);
  }
  const long long v = std::strtoll(usec, nullptr, 10);
  return std::chrono::microseconds(v > 0 ? v / 2 : 0);
}

}  // namespace kvpool::daemon

// Helpers for the tests that drive kvpoolctl and kvpoold's metrics endpoint: run kvpoolctl and
// parse its JSON, wait for a condition, find the endpoint's port in the daemon's log, and speak
// raw HTTP to it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {

inline const std::string kCtlBin = KVPOOLCTL_BIN;

// kvpoolctl with `args` against `d`; its exit code, and its output in `out`.
inline int ctl(const Daemon& d, const std::string& args, std::string& out) {
  return run_command(kCtlBin + " --socket " + d.socket() + " " + args, out);
}

// The JSON kvpoolctl prints for `args` (which must succeed).
inline nlohmann::json ctl_json(const Daemon& d, const std::string& args) {
  std::string out;
  EXPECT_EQ(ctl(d, args + " --json", out), 0) << args << ": " << out;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << args << ": not JSON: " << out;
    return {};
  }
}

// Polls `pred` every 10 ms for up to `ms`.
inline bool wait_until(const std::function<bool()>& pred, int ms = 5000) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// The daemon's log has a line containing `needle` (waiting up to 5 s for it).
inline bool log_has_line(const Daemon& d, const std::string& needle) {
  return wait_until([&] { return d.log().find(needle) != std::string::npos; });
}

// The port the daemon's metrics endpoint bound (its log says "metrics_listening address=H:P").
inline int metrics_port(const Daemon& d) {
  int port = -1;
  wait_until([&] {
    const std::string log = d.log();
    const size_t at = log.find("event=metrics_listening address=127.0.0.1:");
    if (at == std::string::npos) return false;
    port = std::stoi(
        log.substr(at + std::string("event=metrics_listening address=127.0.0.1:").size()));
    return true;
  });
  return port;
}

// A TCP connection to 127.0.0.1:port, or -1. Reads time out after `timeout_ms`.
inline int tcp_connect(int port, int timeout_ms = 3000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Everything the peer sends until it closes or the read times out.
inline std::string read_all(int fd) {
  std::string out;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` on a fresh connection and returns the whole response (the connection must
// close after it: send "Connection: close" for a valid request).
inline std::string http(int port, const std::string& request) {
  const int fd = tcp_connect(port);
  if (fd < 0) return "";
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out = read_all(fd);
  ::close(fd);
  return out;
}

inline std::string http_get(int port, const std::string& target) {
  return http(port, "GET " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
}

// The body of an HTTP response (after the blank line).
inline std::string http_body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

}  // namespace kvpool::testing

// ListenAddress: the "HOST:PORT" of kvpoold's metrics endpoint (config metrics.listen).
//
// HOST is a literal IPv4 address, a bracketed IPv6 address ("[::1]:9464") or "localhost"
// (127.0.0.1); no name is resolved, so the config means the same on every machine. PORT is
// 0..65535, 0 asking the kernel for a free port (the daemon logs the one it got). loopback says
// whether the address stays on this machine (127.0.0.0/8, ::1, ::ffff:127.0.0.0/104): the
// endpoint has no authentication, so the config refuses any other address unless told so.
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvpool::daemon {

struct ListenAddress {
  std::string host;  // the literal address, without brackets
  uint16_t port = 0;
  bool v6 = false;
  bool loopback = false;
};

// "" on success (and `out` set), else what is wrong with `text`.
std::string parse_listen_address(std::string_view text, ListenAddress& out);

}  // namespace kvpool::daemon

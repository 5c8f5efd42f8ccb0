#include "daemon/config/listen_address.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace kvpool::daemon {

std::string parse_listen_address(std::string_view text, ListenAddress& out) {
  const std::string expected = " (expected HOST:PORT, e.g. \"127.0.0.1:9464\" or \"[::1]:9464\")";
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos)
    return "\"" + std::string(text) + "\" has no port" + expected;
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return "port \"" + std::string(port) + "\" is not a number in 0..65535" + expected;
  }
  ListenAddress a;
  a.port = static_cast<uint16_t>(value);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
    a.v6 = true;
  }
  if (!a.v6 && host == "localhost") host = "127.0.0.1";
  a.host = std::string(host);
  if (a.v6) {
    in6_addr v6{};
    if (::inet_pton(AF_INET6, a.host.c_str(), &v6) != 1) {
      return "\"" + a.host + "\" is not an IPv6 address" + expected;
    }
    static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    a.loopback = IN6_IS_ADDR_LOOPBACK(&v6) ||
                 (std::memcmp(v6.s6_addr, kMapped, sizeof kMapped) == 0 && v6.s6_addr[12] == 127);
  } else {
    in_addr v4{};
    if (::inet_pton(AF_INET, a.host.c_str(), &v4) != 1) {
      return "\"" + a.host + "\" is not an IPv4 address (or [IPv6], or localhost)" + expected;
    }
    a.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  }
  out = std::move(a);
  return {};
}

}  // namespace kvpool::daemon

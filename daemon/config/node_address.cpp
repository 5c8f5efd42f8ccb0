#include "daemon/config/node_address.h"

#include <charconv>

namespace kvpool::daemon {

std::optional<NodeAddress> parse_node_address(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return std::nullopt;
  }
  std::string_view host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return std::nullopt;
    host = host.substr(1, host.size() - 2);
  }
  const std::string_view port = text.substr(colon + 1);
  uint16_t p = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc{} || end != port.data() + port.size() || p == 0) return std::nullopt;
  return NodeAddress{std::string(host), p};
}

}  // namespace kvpool::daemon

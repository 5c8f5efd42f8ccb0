// A Redis node's address, "HOST:PORT", as the remote tier's config (pools[].remote_tier.cluster)
// and the cluster's redirections (MOVED, ASK) and slot map write it. HOST is a name or an
// address, resolved when the remote tier connects (managed services give names).
//
// Thread-safety: plain values and a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvpool::daemon {

struct NodeAddress {
  std::string host;
  uint16_t port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
  friend bool operator==(const NodeAddress&, const NodeAddress&) = default;
};

// "HOST:PORT" (an IPv6 host in brackets, "[::1]:7000"), or nothing when malformed.
std::optional<NodeAddress> parse_node_address(std::string_view text);

}  // namespace kvpool::daemon

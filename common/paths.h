// Where kvpoold's socket lives by default, shared by the daemon and its clients.
#pragma once

#include <string>

namespace kvpool {

// $XDG_RUNTIME_DIR/kvpool/kvpoold.sock when XDG_RUNTIME_DIR is an absolute path (a user
// session; the XDG spec says to ignore a relative one), else /run/kvpool/kvpoold.sock (a system
// service, the systemd unit's RuntimeDirectory).
std::string default_socket_path();

}  // namespace kvpool

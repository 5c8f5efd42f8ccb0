#include "common/paths.h"

#include <cstdlib>

namespace kvpool {

std::string default_socket_path() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/kvpool/kvpoold.sock";
  return "/run/kvpool/kvpoold.sock";
}

}  // namespace kvpool

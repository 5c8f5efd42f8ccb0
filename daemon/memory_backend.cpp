#include "daemon/memory_backend.h"

#include "daemon/host_backend.h"

namespace kvpool::daemon {

wire::Result<std::unique_ptr<MemoryBackend>> make_backend(std::string_view name, int device,
                                                          std::string& why) {
  (void)device;
  if (name == "host") {
    why = "host backend: named in the config";
    return std::unique_ptr<MemoryBackend>(std::make_unique<HostBackend>());
  }
  if (name == "auto") {
    why = "host backend: auto, and this build has no CUDA backend yet";
    return std::unique_ptr<MemoryBackend>(std::make_unique<HostBackend>());
  }
  return wire::Error{Status(Errc::invalid_argument),
                     "backend " + std::string(name) +
                         " is not available in this build (the CUDA backends are not built yet); "
                         "use host or auto"};
}

}  // namespace kvpool::daemon

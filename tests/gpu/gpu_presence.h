// Whether this machine has an NVIDIA GPU, decided without a CUDA call.
#pragma once

#include <unistd.h>

namespace kvpool::gpu_check {

// An NVIDIA device node (/dev/nvidiactl or /dev/nvidia0) exists: the one sign of a GPU that needs
// no CUDA call, so it is safe in a process that forks workers later (CUDA is not fork-safe once
// initialised). Where it is true, a CUDA backend or runtime that fails is a failure, never "no
// GPU here" (exit 77).
inline bool nvidia_device_node_present() {
  return ::access("/dev/nvidiactl", F_OK) == 0 || ::access("/dev/nvidia0", F_OK) == 0;
}

}  // namespace kvpool::gpu_check

// kvpoold --check-config's warnings about memory. A pool's memory is reserved whole when kvpoold
// starts (docs/ARCHITECTURE.md), so a capacity larger than what the backend can give on this
// machine is a start that fails; a config may still be valid for another machine, so this is a
// warning, not an error. capacity_warnings() is a pure function of the config and the figure it
// is given, so tests give it any figure; available_memory_for() reads this machine's.
//
// Thread-safety: plain functions. Error policy: nothing fails; a figure that cannot be known is
// nullopt and nothing is checked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config/config.h"

namespace kvpool::daemon {

struct AvailableMemory {
  uint64_t bytes = 0;
  std::string what;  // where the figure comes from, said after it in a warning
};

// What `config.backend` can give pools here: for host, and auto where no GPU can be used, the
// smaller of MemAvailable and /dev/shm's free space; for fake-device (memfd, not bounded by
// /dev/shm), MemAvailable. nullopt where it cannot be told without a CUDA context: cuda-vmm,
// cuda-ipc, and auto on a kvpoold built with CUDA where a driver is installed.
std::optional<AvailableMemory> available_memory_for(const Config& config);

// The errors this machine makes of `config`: what kvpoold would refuse to start with, or what
// could not mean anything here. kvpoold --check-config prints them and exits 1; kvpoold refuses
// to start with the same lines, so the two never disagree. Each "FILE:LINE: KEY: ...":
//   - a host_tier larger than MemAvailable (the tier's memory is taken at start);
//   - a memory_budget in bytes larger than what the backend can give (host and fake-device);
//   - an elastic pool whose max_capacity needs more than wire::kMaxSegments segments of
//     segment_size, rounded up to the backend's granularity (host: the system page; fake-device
//     and CUDA: 2 MiB), with the smallest segment_size that fits.
// Figures that cannot be known without a CUDA context (a GPU's free memory) are not checked.
std::vector<std::string> machine_errors(const Config& config);

// One line per pool whose capacity in bytes or pages, with the pools before it, is more than
// `available`: "FILE:LINE: pools[0].capacity: 96.0 GiB is more than the 22.1 GiB of memory
// available here (...)". Capacities given as a fraction take what there is and never warn.
std::vector<std::string> capacity_warnings(const Config& config, const AvailableMemory& available);

}  // namespace kvpool::daemon

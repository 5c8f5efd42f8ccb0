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

#include "daemon/config.h"

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

// One line per pool whose capacity in bytes or pages, with the pools before it, is more than
// `available`: "FILE:LINE: pools[0].capacity: 96.0 GiB is more than the 22.1 GiB of memory
// available here (...)". Capacities given as a fraction take what there is and never warn.
std::vector<std::string> capacity_warnings(const Config& config, const AvailableMemory& available);

}  // namespace kvpool::daemon

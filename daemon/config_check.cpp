// kvpoold --check-config's memory warnings (see config_check.h): each pool's capacity against
// what the configured backend can give on this machine.
#include "daemon/config_check.h"

#include <unistd.h>

#include <cstdint>

#include "common/byte_units.h"
#include "common/system_memory.h"

namespace kvpool::daemon {

namespace {

// Whether auto would end on the host backend here, told without creating a CUDA context: always
// on a kvpoold built without CUDA, and where no NVIDIA driver is installed (no /dev/nvidiactl).
bool auto_means_host() {
#ifdef KVPOOL_WITH_CUDA
  return ::access("/dev/nvidiactl", F_OK) != 0;
#else
  return true;
#endif
}

}  // namespace

std::optional<AvailableMemory> available_memory_for(const Config& config) {
  const auto avail = mem_available_bytes();
  if (config.backend == "fake-device") {
    if (!avail) return std::nullopt;
    return AvailableMemory{*avail, "MemAvailable, for the fake-device backend's memfd memory"};
  }
  if (config.backend != "host" && !(config.backend == "auto" && auto_means_host())) {
    return std::nullopt;
  }
  const std::string backend = config.backend == "host"
                                  ? "for the host backend"
                                  : "for the host backend, which auto picks here";
  const auto shm = shm_free_bytes();
  if (shm && (!avail || *shm <= *avail)) {
    return AvailableMemory{*shm, "/dev/shm's free space, " + backend};
  }
  if (avail) {
    std::string what = "MemAvailable, " + backend;
    if (shm) what += "; /dev/shm has " + human_bytes(*shm) + " free";
    return AvailableMemory{*avail, std::move(what)};
  }
  return std::nullopt;
}

std::vector<std::string> capacity_warnings(const Config& config, const AvailableMemory& available) {
  std::vector<std::string> warnings;
  uint64_t before = 0;  // bytes of the pools listed before, in bytes or pages
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pool = config.pools[i];
    if (pool.capacity.unit == Capacity::Unit::fraction) continue;
    const uint64_t per_page = page_data_bytes(pool.geometry) + page_scale_bytes(pool.geometry);
    const uint64_t pages = pool.capacity.unit == Capacity::Unit::pages
                               ? pool.capacity.value
                               : pool.capacity.value / per_page;
    // What the daemon reserves, rounding aside (the parser keeps it below 2^63 bytes).
    const uint64_t bytes = pages * per_page;
    std::string size = human_bytes(bytes);
    if (pool.capacity.unit == Capacity::Unit::pages) {
      size = std::to_string(pages) + " pages of " + human_bytes(per_page) + " (" + size + ")";
    }
    const uint64_t with_before = bytes > UINT64_MAX - before ? UINT64_MAX : before + bytes;
    if (with_before > available.bytes) {
      const std::string where = pool.capacity_at.text.empty()
                                    ? "pools[" + std::to_string(i) + "].capacity"
                                    : pool.capacity_at.text;
      std::string line = where + ": " + size;
      if (before > 0 && bytes <= available.bytes) {
        line += ", with the " + human_bytes(before) + " of the pools before it,";
      }
      line += " is more than the " + human_bytes(available.bytes) + " of memory available here (" +
              available.what +
              "); kvpoold reserves pool memory at start and would refuse to start with it";
      warnings.push_back(std::move(line));
    }
    before = with_before;
  }
  return warnings;
}

}  // namespace kvpool::daemon

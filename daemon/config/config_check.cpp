// kvpoold --check-config's memory warnings (see config_check.h): each pool's capacity against
// what the configured backend can give on this machine.
#include "daemon/config/config_check.h"

#include <unistd.h>

#include <cstdint>
#include <map>
#include <numeric>

#include "common/byte_units.h"
#include "common/system_memory.h"
#include "common/wire/protocol.h"
#include "daemon/core/types.h"

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

// The granularity the backend rounds segments to: the system page on host memory, 2 MiB on
// fake-device and on CUDA (the VMM granularity of every current NVIDIA GPU).
uint64_t segment_granularity(const Config& config) {
  if (config.backend == "host" || (config.backend == "auto" && auto_means_host())) {
    const long page = ::sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<uint64_t>(page) : 4096;
  }
  return uint64_t{2} << 20;
}

uint64_t round_up_to(uint64_t v, uint64_t g) {
  return (v + g - 1) / g * g;
}

std::string where(const KeyLocation& at, const std::string& key) {
  return at.text.empty() ? key : at.text;
}

}  // namespace

std::vector<std::string> machine_errors(const Config& config) {
  std::vector<std::string> errors;
  const auto avail = mem_available_bytes();
  const uint64_t gran = segment_granularity(config);
  // A hybrid model's host tiers (one per group) take their memory together.
  std::map<std::string, uint64_t> model_host_bytes;
  auto host_bytes = [](const PoolConfig& p) {
    const uint64_t per_page = page_data_bytes(p.geometry) + page_scale_bytes(p.geometry);
    return p.host_tier->unit == Capacity::Unit::pages ? p.host_tier->value * per_page
                                                      : p.host_tier->value;
  };
  for (const PoolConfig& p : config.pools) {
    if (!p.model.empty() && p.host_tier && p.host_tier->unit != Capacity::Unit::fraction) {
      model_host_bytes[p.model] += host_bytes(p);
    }
  }
  for (size_t i = 0; i < config.pools.size(); ++i) {
    const PoolConfig& pool = config.pools[i];
    const std::string key = "pools[" + std::to_string(i) + "].";
    const uint64_t stride = page_data_bytes(pool.geometry);
    const uint64_t scale = page_scale_bytes(pool.geometry);
    const uint64_t per_page = stride + scale;
    // A model's groups are checked once, at its first group, with their sum.
    const bool host_checked = pool.model.empty() || pool.group == 0;
    if (pool.host_tier && pool.host_tier->unit != Capacity::Unit::fraction && avail &&
        host_checked) {
      const uint64_t bytes = pool.model.empty() ? host_bytes(pool) : model_host_bytes[pool.model];
      if (bytes > *avail) {
        errors.push_back(where(pool.host_tier_at, key + "host_tier") + ": " + human_bytes(bytes) +
                         " is more than the " + human_bytes(*avail) +
                         " of memory available here (MemAvailable); the host tier takes its "
                         "memory at start");
      }
    }
    if (!pool.max_capacity) continue;
    const uint64_t max_pages = std::min<uint64_t>(pool.max_capacity->unit == Capacity::Unit::pages
                                                      ? pool.max_capacity->value
                                                      : pool.max_capacity->value / per_page,
                                                  core::kMaxPages);
    uint64_t segment = round_up_to(std::max(pool.segment_size, stride), gran);
    uint64_t region = round_up_to(max_pages * stride, gran);
    if (pool.layout == KvLayout::layer_major) {
      // Segmented, as PoolRuntime::create_elastic lays it out: segments of whole granules and
      // whole plane blocks, the pool whole segments.
      const uint64_t block = stride / (uint64_t{kv_planes(pool.geometry)} * pool.geometry.layers);
      segment = round_up_to(std::max(pool.segment_size, stride), std::lcm(gran, block));
      const uint64_t per_segment = segment / stride;
      region = (max_pages + per_segment - 1) / per_segment * segment;
    }
    const uint64_t scale_segments = scale != 0 ? 1 : 0;
    const uint64_t segments = (region + segment - 1) / segment + scale_segments;
    if (segments > wire::kMaxSegments) {
      const uint64_t fits = round_up_to((region + wire::kMaxSegments - scale_segments - 1) /
                                            (wire::kMaxSegments - scale_segments),
                                        gran);
      const std::string at = pool.segment_size_at.text.empty()
                                 ? where(pool.max_capacity_at, key + "max_capacity")
                                 : pool.segment_size_at.text;
      errors.push_back(at + ": max_capacity (" + human_bytes(max_pages * stride) +
                       " of pages) needs " + std::to_string(segments) + " segments of " +
                       human_bytes(segment) + "; a pool has at most " +
                       std::to_string(wire::kMaxSegments) + " (segment_size of at least " +
                       human_bytes(fits) + ")");
    }
  }
  if (config.memory_budget && config.memory_budget->unit == Capacity::Unit::bytes) {
    if (const auto available = available_memory_for(config);
        available && config.memory_budget->value > available->bytes) {
      errors.push_back(where(config.memory_budget_at, "memory_budget") + ": " +
                       human_bytes(config.memory_budget->value) + " is more than the " +
                       human_bytes(available->bytes) + " of memory available here (" +
                       available->what + ")");
    }
  }
  return errors;
}

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
  if (const auto cgroup = cgroup_memory_free_bytes();
      cgroup && (!avail || *cgroup < *avail) && (!shm || *cgroup < *shm)) {
    return AvailableMemory{*cgroup,
                           "what this process's cgroup allows (memory.max − "
                           "memory.current), " +
                               backend};
  }
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

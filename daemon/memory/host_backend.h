// The host backend: pool memory in POSIX shared memory (Boost.Interprocess).
//
// A segment is created under a fresh name "/kvpool-<pid>-<n>", sized, and its name is removed at
// once: from then on only the daemon's descriptor (and the descriptors workers receive over
// SCM_RIGHTS) reach it, no process can open it by name, and nothing is left in /dev/shm when
// the daemon stops, normally or by kill -9. The kernel frees the memory when the last
// descriptor and mapping are gone. At start, remove_stale_segments() removes names a daemon
// killed inside that short window left behind (their pid no longer runs).
//
// A segment is reserved whole when it is created (posix_fallocate), so every page is backed
// before any process touches it: a page that tmpfs cannot back on first touch would be a SIGBUS
// in a worker, or in kvpoold during a copy. A pool larger than /dev/shm's free space or than
// MemAvailable is refused before anything is reserved, the error naming both sizes.
//
// Elastic host pools are not Boost.Interprocess segments: they are memfd segments mapped through
// MemfdVmm (create_elastic_vmm_memory, the fake-device code) at the system page size, the same
// granularity() fixed host pools round to, so a layout the caller rounded for this backend fits.
// memfd memory has no name (nothing to clean up in /dev/shm) and is bounded by MemAvailable, not
// by /dev/shm's size; workers map it as they map a host pool's descriptor (MemfdVmm). Fixed host
// pools are unchanged.
#pragma once

#include "daemon/memory/memory_backend.h"

namespace kvpool::daemon {

class HostBackend final : public MemoryBackend {
 public:
  std::string_view name() const override { return "host"; }
  uint64_t available_bytes() const override;
  uint64_t granularity() const override;
  // Always one segment: shared memory has no granularity to work around.
  wire::Result<std::unique_ptr<PoolMemory>> create(uint64_t bytes, uint64_t max_segment_bytes,
                                                   std::string_view label) override;
  wire::Result<std::unique_ptr<PoolMemory>> create_elastic(const ElasticLayout& layout,
                                                           std::string_view label) override;

  // Removes /dev/shm/kvpool-<pid>-* entries whose pid is not running. Returns how many.
  static int remove_stale_segments();
};

}  // namespace kvpool::daemon

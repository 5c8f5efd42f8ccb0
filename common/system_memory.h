// What memory this machine can give a new pool, read without allocating any: MemAvailable from
// /proc/meminfo, the free space of /dev/shm (a tmpfs whose size, not RAM, bounds POSIX shared
// memory) and what this process's cgroup (v2) still allows (memory.max − memory.current +
// inactive file cache, at the tightest level up to the root: a container's limit, which MemAvailable does not show, and which
// tmpfs pages are charged to); and reserve_file(), which backs a whole segment at creation. Pool
// memory that is only sized (ftruncate) gets its pages on first touch, and a page that tmpfs or
// memory cannot back then is a SIGBUS in whichever process touched it; so the backends check a pool
// against these figures, then reserve it, and a pool too large is refused at start with the cause.
// `kvpoold --check-config` warns with the same figures.
//
// Thread-safety: stateless; any thread. Error policy: a figure that cannot be read is nullopt
// (the caller then has nothing to check against); nothing throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kvpool {

// MemAvailable: memory that can be handed out without swapping, in bytes.
std::optional<uint64_t> mem_available_bytes();

// Bytes an unprivileged process may still allocate in the filesystem holding `dir` (statvfs
// f_bavail × f_frsize); for /dev/shm, what new shared memory may take.
std::optional<uint64_t> fs_free_bytes(const char* dir);
inline std::optional<uint64_t> shm_free_bytes() {
  return fs_free_bytes("/dev/shm");
}

// What this process's cgroup may still take, in bytes; nullopt where no level of it sets
// memory.max (or cgroup v2 is not mounted).
std::optional<uint64_t> cgroup_memory_free_bytes();
// The same from `cgroup_root` (where cgroup v2 is mounted) and the text of /proc/self/cgroup.
std::optional<uint64_t> cgroup_memory_free_bytes(const std::string& cgroup_root,
                                                 const std::string& proc_self_cgroup);

// Backs every byte of [0, bytes) of the file `fd` (posix_fallocate, which returns the error
// number rather than setting errno; retried on EINTR, which tmpfs answers when a signal arrives
// during a long reservation). Returns 0 or the error number.
int reserve_file(int fd, uint64_t bytes);

}  // namespace kvpool

// MemAvailable, a filesystem's free space, reserving a file's blocks and byte sizes for messages
// (see system_memory.h).
#include "common/system_memory.h"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <cerrno>

#include <fstream>

namespace kvpool {

std::optional<uint64_t> mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> fs_free_bytes(const char* dir) {
  struct statvfs vfs {};
  if (::statvfs(dir, &vfs) != 0) return std::nullopt;
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

int reserve_file(int fd, uint64_t bytes) {
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  return err;
}

}  // namespace kvpool

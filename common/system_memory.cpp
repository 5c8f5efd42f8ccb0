// MemAvailable, a filesystem's free space, reserving a file's blocks and byte sizes for messages
// (see system_memory.h).
#include "common/system_memory.h"

#include <fcntl.h>
#include <sys/statvfs.h>

#include <cerrno>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

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

namespace {

// The number in a cgroup file ("max" and unreadable files are nullopt).
std::optional<uint64_t> read_cgroup_value(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// memory.stat's inactive_file: file cache the kernel reclaims before anything else.
uint64_t inactive_file_bytes(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "inactive_file") return value;
  }
  return 0;
}

}  // namespace

std::optional<uint64_t> cgroup_memory_free_bytes(const std::string& cgroup_root,
                                                 const std::string& proc_self_cgroup) {
  // cgroup v2's line is "0::/PATH"; v1 lines name their controllers.
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  std::string path;
  bool found = false;
  while (std::getline(lines, line)) {
    if (line.rfind("0::", 0) == 0) {
      path = line.substr(3);
      found = true;
    }
  }
  if (!found) return std::nullopt;
  const std::filesystem::path root = std::filesystem::path(cgroup_root).lexically_normal();
  const std::filesystem::path rel = std::filesystem::path(path).relative_path();
  for (const auto& part : rel)
    if (part == "..") return std::nullopt;  // never read outside the root
  std::filesystem::path dir = rel.empty() ? root : (root / rel).lexically_normal();
  std::optional<uint64_t> tightest;
  for (;;) {
    if (const auto max = read_cgroup_value(dir / "memory.max")) {
      // What is charged, less the file cache the kernel would reclaim first (as MemAvailable
      // counts it): a container that read its model weights is not out of memory.
      uint64_t current = read_cgroup_value(dir / "memory.current").value_or(0);
      current -= std::min(current, inactive_file_bytes(dir / "memory.stat"));
      const uint64_t free = *max > current ? *max - current : 0;
      tightest = tightest ? std::min(*tightest, free) : free;
    }
    // Up to the root, never above it (a path with ".." in it stops there too).
    if (dir == root || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < root.string().size()) break;
  }
  return tightest;
}

std::optional<uint64_t> cgroup_memory_free_bytes() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory_free_bytes("/sys/fs/cgroup", text.str());
}

int reserve_file(int fd, uint64_t bytes) {
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (err == EINTR);
  return err;
}

}  // namespace kvpool

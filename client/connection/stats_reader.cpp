#include "client/connection/stats_reader.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

namespace kvpool::client {

namespace {

constexpr size_t kMaxSegmentBytes = size_t{64} << 20;

uint64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

}  // namespace

std::string read_stats_segment(const std::string& socket_path, stats::Snapshot& out) {
  const std::string path = socket_path + ".stats";
  struct stat sock {};
  if (::stat(socket_path.c_str(), &sock) != 0) return "no socket at " + socket_path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return path + ": " + std::strerror(errno);
  struct stat st {};
  std::string why;
  if (::fstat(fd, &st) != 0) {
    why = path + ": " + std::strerror(errno);
  } else if (!S_ISREG(st.st_mode) || st.st_uid != sock.st_uid) {
    why = path + " is not a regular file owned by the socket's owner";
  } else if (st.st_size < static_cast<off_t>(sizeof(stats::SegmentHeader)) ||
             st.st_size > static_cast<off_t>(kMaxSegmentBytes)) {
    why = path + " has an unexpected size";
  }
  void* map = MAP_FAILED;
  const auto bytes = static_cast<size_t>(st.st_size);
  if (why.empty()) {
    map = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) why = path + ": mmap: " + std::strerror(errno);
  }
  ::close(fd);
  if (!why.empty()) return why;
  std::vector<std::byte> snapshot;
  why = stats::seqlock_read(static_cast<const std::byte*>(map), bytes, snapshot);
  ::munmap(map, bytes);
  if (!why.empty()) return path + ": " + why;
  why = stats::decode(snapshot, stats::kLayoutVersion, out);
  if (!why.empty()) return path + ": " + why;
  const auto pid = static_cast<pid_t>(out.daemon.pid);
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) {
    return path + ": its daemon (pid " + std::to_string(out.daemon.pid) + ") is gone";
  }
  const uint64_t now = monotonic_ns();
  const auto max_age = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(kMaxSegmentAge).count());
  if (now > out.daemon.published_mono_ns && now - out.daemon.published_mono_ns > max_age) {
    return path + ": the snapshot is older than " + std::to_string(kMaxSegmentAge.count()) +
           " s (the daemon is not publishing)";
  }
  return {};
}

}  // namespace kvpool::client

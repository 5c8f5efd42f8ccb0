#include "daemon/telemetry/stats_segment.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/stats_layout.h"

namespace kvpool::daemon {

namespace {

wire::Error failure(const std::string& path, const std::string& what, int err) {
  return wire::Error{Status(Errc::internal),
                     "stats segment " + path + ": " + what + ": " + std::strerror(err)};
}

}  // namespace

wire::Result<std::unique_ptr<StatsSegment>> StatsSegment::create_file(const std::string& path,
                                                                      size_t snapshot_bytes,
                                                                      uint32_t socket_mode,
                                                                      const std::string& group) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return wire::Error{Status(Errc::internal), "stats segment " + path + " is a directory"};
    }
    if (::unlink(path.c_str()) != 0) return failure(path, "cannot remove the stale file", errno);
  }
  gid_t gid = static_cast<gid_t>(-1);
  if (!group.empty()) {
    const struct group* g = ::getgrnam(group.c_str());
    if (g == nullptr) return wire::Error{Status(Errc::internal), "group " + group + " is unknown"};
    gid = g->gr_gid;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return failure(path, "create", errno);
  const size_t bytes = sizeof(stats::SegmentHeader) + snapshot_bytes;
  // Read access follows connect access: group and others may read when the socket lets them in.
  const mode_t mode =
      0600 | ((socket_mode & 0060) != 0 ? 0040 : 0) | ((socket_mode & 0006) != 0 ? 0004 : 0);
  const char* step = nullptr;
  if (::fchmod(fd, mode) != 0) {
    step = "chmod";
  } else if (gid != static_cast<gid_t>(-1) && ::fchown(fd, static_cast<uid_t>(-1), gid) != 0) {
    step = "chown";
  } else if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    step = "ftruncate";
  }
  void* p = step == nullptr ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                            : MAP_FAILED;
  if (step == nullptr && p == MAP_FAILED) step = "mmap";
  const int err = errno;
  ::close(fd);
  if (step != nullptr) {
    ::unlink(path.c_str());
    return failure(path, step, err);
  }
  auto* base = static_cast<std::byte*>(p);
  stats::seqlock_init(base, snapshot_bytes);
  return std::unique_ptr<StatsSegment>(new StatsSegment(base, bytes, path));
}

wire::Result<std::unique_ptr<StatsSegment>> StatsSegment::create_anonymous(size_t snapshot_bytes) {
  const size_t bytes = sizeof(stats::SegmentHeader) + snapshot_bytes;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return failure("(anonymous)", "mmap", errno);
  auto* base = static_cast<std::byte*>(p);
  stats::seqlock_init(base, snapshot_bytes);
  return std::unique_ptr<StatsSegment>(new StatsSegment(base, bytes, ""));
}

StatsSegment::~StatsSegment() {
  ::munmap(base_, bytes_);
  if (!path_.empty()) ::unlink(path_.c_str());
}

void StatsSegment::publish(std::span<const std::byte> snapshot) {
  if (sizeof(stats::SegmentHeader) + snapshot.size() != bytes_) return;  // a caller bug: skip
  stats::seqlock_write(base_, snapshot);
}

std::string StatsSegment::read(std::vector<std::byte>& snapshot) const {
  return stats::seqlock_read(base_, bytes_, snapshot);
}

}  // namespace kvpool::daemon

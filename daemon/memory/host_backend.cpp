#include "daemon/memory/host_backend.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/byte_units.h"
#include "common/device/memfd_vmm.h"
#include "common/system_memory.h"
#include "daemon/memory/page_copier.h"
#include "daemon/memory/vmm_backend.h"

namespace kvpool::daemon {

namespace bip = boost::interprocess;

namespace {

constexpr std::string_view kPrefix = "kvpool-";

class HostMemory final : public PoolMemory {
 public:
  HostMemory(bip::shared_memory_object shm, uint64_t bytes)
      : shm_(std::move(shm)),
        region_(shm_, bip::read_write, 0, static_cast<size_t>(bytes)),
        segments_{wire::SegmentInfo{bytes, {}, 0}},
        fds_{shm_.get_mapping_handle().handle},
        copier_(make_host_copier()) {}
  uint64_t bytes() const override { return segments_[0].bytes; }
  std::byte* base() const override { return static_cast<std::byte*>(region_.get_address()); }
  const std::vector<wire::SegmentInfo>& segments() const override { return segments_; }
  const std::vector<int>& fds() const override { return fds_; }
  std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    return copier_->copy(args, num_pages);
  }
  std::string convert_pages(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                            uint32_t dst_num_pages) override {
    return copier_->convert(args, src_num_pages, dst_num_pages);
  }

 private:
  bip::shared_memory_object shm_;  // owns the descriptor; its name is already gone
  bip::mapped_region region_;      // the daemon's own view, for page copies
  std::vector<wire::SegmentInfo> segments_;
  std::vector<int> fds_;
  std::unique_ptr<PageCopier> copier_;
};

// "" when `bytes` of new shared memory fit both /dev/shm and memory, else why not. Checked before
// anything is reserved: on tmpfs a fallocate that fails has first filled the filesystem, and
// filling memory pushes every process on the machine towards the OOM killer.
std::string why_no_room(uint64_t bytes) {
  if (const auto shm = shm_free_bytes(); shm && bytes > *shm) {
    return "/dev/shm has " + human_bytes(*shm) + " free (tmpfs size; see `df -h /dev/shm`)";
  }
  if (const auto avail = mem_available_bytes(); avail && bytes > *avail) {
    return "only " + human_bytes(*avail) + " of memory is available (MemAvailable, /proc/meminfo)";
  }
  if (const auto cgroup = cgroup_memory_free_bytes(); cgroup && bytes > *cgroup) {
    return "this process's cgroup allows only " + human_bytes(*cgroup) +
           " more (memory.max − memory.current)";
  }
  return {};
}

}  // namespace

uint64_t HostBackend::available_bytes() const {
  const auto avail = mem_available_bytes();
  const auto shm = shm_free_bytes();
  uint64_t bytes = avail && shm ? std::min(*avail, *shm) : avail ? *avail : shm.value_or(0);
  if (const auto cgroup = cgroup_memory_free_bytes()) bytes = std::min(bytes, *cgroup);
  // Whole system pages, so that "100%" rounded up to them still passes create()'s check.
  return bytes / granularity() * granularity();
}

uint64_t HostBackend::granularity() const {
  const long page = ::sysconf(_SC_PAGESIZE);
  return page > 0 ? static_cast<uint64_t>(page) : 4096;
}

wire::Result<std::unique_ptr<PoolMemory>> HostBackend::create(uint64_t bytes, uint64_t,
                                                              std::string_view label) {
  static std::atomic<uint32_t> counter{0};
  const std::string name =
      std::string(kPrefix) + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const uint64_t rounded = round_up(bytes, granularity());
  const std::string cannot = "host backend, pool " + std::string(label) + ": cannot reserve " +
                             human_bytes(rounded) + " (" + std::to_string(rounded) +
                             " bytes) of shared memory: ";
  if (std::string why = why_no_room(rounded); !why.empty()) {
    return wire::Error{Status(Errc::invalid_argument), cannot + why};
  }
  try {
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write, 0600);
    // Unlink first: whatever happens next, the name never outlives this call.
    bip::shared_memory_object::remove(name.c_str());
    shm.truncate(static_cast<bip::offset_t>(rounded));
    // Every page backed now, or the pool is refused: a page tmpfs cannot back on first touch
    // would be a SIGBUS in a worker, or in kvpoold during a copy. On failure the descriptor is
    // closed and the kernel takes back what was reserved.
    if (const int err = reserve_file(shm.get_mapping_handle().handle, rounded); err != 0) {
      std::string why = std::string("posix_fallocate: ") + std::strerror(err);
      if (const auto shm_free = shm_free_bytes()) {
        why += " (/dev/shm has " + human_bytes(*shm_free) + " free)";
      }
      return wire::Error{Status(Errc::internal), cannot + why};
    }
    return std::unique_ptr<PoolMemory>(std::make_unique<HostMemory>(std::move(shm), rounded));
  } catch (const bip::interprocess_exception& e) {
    bip::shared_memory_object::remove(name.c_str());
    return wire::Error{Status(Errc::internal), cannot + e.what()};
  }
}

wire::Result<std::unique_ptr<PoolMemory>> HostBackend::create_elastic(const ElasticLayout& layout,
                                                                      std::string_view label) {
  return create_elastic_vmm_memory(std::make_shared<device::MemfdVmm>(granularity()), layout,
                                   "host backend, pool " + std::string(label) + ": ",
                                   make_host_copier());
}

int HostBackend::remove_stale_segments() {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* ent = ::readdir(dir)) {
    const std::string_view n = ent->d_name;
    if (n.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::string rest(n.substr(kPrefix.size()));
    const auto dash = rest.find('-');
    if (dash == std::string::npos) continue;
    const long pid = std::strtol(rest.substr(0, dash).c_str(), nullptr, 10);
    if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (bip::shared_memory_object::remove(std::string(n).c_str())) ++removed;
  }
  ::closedir(dir);
  return removed;
}

}  // namespace kvpool::daemon

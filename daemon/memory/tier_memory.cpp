#include "daemon/memory/tier_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "common/byte_units.h"
#include "common/system_memory.h"

namespace kvpool::daemon {

namespace detail {

AnonymousMemory::~AnonymousMemory() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

std::string AnonymousMemory::map(uint64_t bytes) {
  if (const auto avail = mem_available_bytes(); avail && bytes > *avail) {
    return "a host tier of " + std::to_string(bytes) + " bytes does not fit in MemAvailable (" +
           std::to_string(*avail) + " bytes)";
  }
  // MAP_POPULATE past a container's memory.max is the OOM killer, not a failed mmap.
  if (const auto cgroup = cgroup_memory_free_bytes(); cgroup && bytes > *cgroup) {
    return "a host tier of " + std::to_string(bytes) + " bytes is more than this process's " +
           "cgroup allows (" + std::to_string(*cgroup) + " bytes: memory.max − memory.current)";
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    return "mmap of " + std::to_string(bytes) + " bytes for the host tier: " + std::strerror(errno);
  }
  base_ = static_cast<std::byte*>(p);
  bytes_ = bytes;
  return "";
}

#ifndef KVPOOL_WITH_CUDA
wire::Result<std::unique_ptr<TierMemory>> make_cuda_tier_memory(int, uint64_t) {
  return wire::Error{Status(Errc::internal), "this kvpoold was built without CUDA"};
}
#endif

}  // namespace detail

namespace {

class HostTierMemory final : public TierMemory {
 public:
  std::byte* base() const override { return mem_.base(); }
  uint64_t bytes() const override { return mem_.bytes(); }
  std::string copy(std::span<const ByteRun> runs) override {
    for (const ByteRun& r : runs)
      std::memcpy(r.dst, r.src, r.bytes);
    return "";
  }
  detail::AnonymousMemory mem_;
};

}  // namespace

wire::Result<std::unique_ptr<TierMemory>> make_tier_memory(int device, uint64_t bytes,
                                                           std::string_view label) {
  auto fail = [&](const std::string& why) {
    return wire::Error{Status(Errc::invalid_argument),
                       "pool " + std::string(label) + ": host tier: " + why};
  };
  if (bytes == 0) return fail("zero bytes");
  if (device >= 0) {
    auto m = detail::make_cuda_tier_memory(device, bytes);
    if (!m.ok()) return fail(m.error().message);
    return m;
  }
  auto m = std::make_unique<HostTierMemory>();
  if (std::string err = m->mem_.map(bytes); !err.empty()) return fail(err);
  return std::unique_ptr<TierMemory>(std::move(m));
}

}  // namespace kvpool::daemon

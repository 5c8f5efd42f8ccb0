// MemfdVmm: the VmmApi over host memory. create() is memfd_create + ftruncate + fallocate,
// export_fd() a duplicate descriptor, import_fd() a duplicate of the received one, reserve() an
// inaccessible anonymous range, map() a MAP_FIXED shared mapping into it, set_access() mprotect
// to read-write, unmap() puts the reservation back.
//
// A segment is reserved whole when it is created: a memfd page that cannot be backed on first
// touch is a SIGBUS in whichever process touches it. memfd memory is tmpfs but not bounded by
// /dev/shm's size, so why_no_room() compares with MemAvailable, and create() refuses a segment
// that does not fit before allocating anything.
//
// It serves two backends: "fake-device" (the daemon creates segments with it, at a 2 MiB
// granularity like a GPU's, so the CUDA-VMM path — segment rounding, several fds over
// SCM_RIGHTS, contiguous mapping — runs in CI) and the worker side of "host" (a Boost.Interprocess
// shared-memory descriptor maps the same way as a memfd).
//
// Thread-safety: stateless; any thread. Errors name the call and errno's text.
#pragma once

#include "common/device/vmm.h"

namespace kvpool::device {

class MemfdVmm final : public VmmApi {
 public:
  // `granularity` must be a multiple of the system page size.
  explicit MemfdVmm(uint64_t granularity);
  std::string_view name() const override { return "memfd"; }
  uint64_t granularity() const override { return granularity_; }
  std::string why_no_room(uint64_t bytes) const override;
  wire::Result<VmmHandle> create(uint64_t bytes) override;
  wire::Result<int> export_fd(VmmHandle handle) override;
  wire::Result<VmmHandle> import_fd(int fd, uint64_t bytes) override;
  void release(VmmHandle handle) override;
  void discard(VmmHandle handle, uint64_t bytes) override;
  wire::Result<uintptr_t> reserve(uint64_t bytes) override;
  wire::Result<bool> map(uintptr_t va, uint64_t bytes, VmmHandle handle) override;
  wire::Result<bool> set_access(uintptr_t va, uint64_t bytes) override;
  void unmap(uintptr_t va, uint64_t bytes) override;
  void unreserve(uintptr_t va, uint64_t bytes) override;

  static uint64_t system_page_size();

 private:
  uint64_t granularity_;
};

}  // namespace kvpool::device

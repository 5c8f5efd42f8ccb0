// VmmApi: the virtual-memory primitives every descriptor-based pool backend goes through, and
// VmmMapping, which maps a pool's segments contiguously with them (DESIGN §2).
//
// The sequence, the same in the daemon and in every worker:
//   daemon: create(bytes) per segment → export_fd(handle) → the fds go to a worker (SCM_RIGHTS)
//   worker: import_fd(fd) per segment → reserve(total) → map(va + offset, handle) per segment →
//           set_access(va, total)
// so `base + page · page_stride` names the same page in every process, whatever the number of
// segments. The daemon maps its own segments the same way for its page copies.
//
// Two implementations: MemfdVmm (memfd_create + mmap; the "fake-device" backend, which runs the
// whole sequence on host memory so CI exercises everything but the CUDA calls, and the worker side
// of the "host" backend) and CudaVmm (cuMemCreate with POSIX-fd handles, cuMemMap, cuMemSetAccess;
// common/device/cuda_device.h).
//
// Handles are opaque 64-bit values owned by whoever created or imported them (release() frees
// one). Descriptors returned by export_fd() belong to the caller; import_fd() never takes the
// descriptor it is given.
//
// Error policy: every call that can fail returns an Error naming the primitive, the sizes and the
// cause; nothing throws. Thread-safety: the implementations keep no mutable state, so calls may
// come from any thread; a VmmMapping is not synchronised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol.h"

namespace kvpool::device {

using VmmHandle = uint64_t;

class VmmApi {
 public:
  virtual ~VmmApi() = default;
  virtual std::string_view name() const = 0;
  // Segment sizes and mapping offsets are multiples of this.
  virtual uint64_t granularity() const = 0;
  // "" when `bytes` of new segments in all could be created now, else why not; checked without
  // allocating anything, before a pool's first segment, so that a pool too large is refused
  // before any of it is taken. The default knows of no limit (create() then answers).
  virtual std::string why_no_room(uint64_t /*bytes*/) const { return {}; }
  virtual wire::Result<VmmHandle> create(uint64_t bytes) = 0;
  virtual wire::Result<int> export_fd(VmmHandle handle) = 0;
  virtual wire::Result<VmmHandle> import_fd(int fd, uint64_t bytes) = 0;
  virtual void release(VmmHandle handle) = 0;
  virtual wire::Result<uintptr_t> reserve(uint64_t bytes) = 0;
  virtual wire::Result<bool> map(uintptr_t va, uint64_t bytes, VmmHandle handle) = 0;
  virtual wire::Result<bool> set_access(uintptr_t va, uint64_t bytes) = 0;
  // Undo map() (the range stays reserved) and reserve().
  virtual void unmap(uintptr_t va, uint64_t bytes) = 0;
  virtual void unreserve(uintptr_t va, uint64_t bytes) = 0;
};

// Segments mapped back to back in one reserved range. Owns the handles it is given and releases
// them, with the mapping, when destroyed. The memory itself lives until every process that maps
// or holds a handle to it has let go.
class VmmMapping {
 public:
  // Maps handles[i] (sizes[i] bytes, each a multiple of the granularity) at the running offset.
  // On failure everything done so far is undone and every handle released.
  static wire::Result<std::unique_ptr<VmmMapping>> map(std::shared_ptr<VmmApi> api,
                                                       std::vector<VmmHandle> handles,
                                                       std::span<const uint64_t> sizes);
  ~VmmMapping();
  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;

  std::byte* base() const { return reinterpret_cast<std::byte*>(va_); }
  uint64_t bytes() const { return bytes_; }
  const std::vector<VmmHandle>& handles() const { return handles_; }
  VmmApi& api() const { return *api_; }

 private:
  VmmMapping(std::shared_ptr<VmmApi> api, std::vector<VmmHandle> handles)
      : api_(std::move(api)), handles_(std::move(handles)) {}

  std::shared_ptr<VmmApi> api_;
  std::vector<VmmHandle> handles_;
  std::vector<uint64_t> sizes_;  // of the segments mapped so far
  uintptr_t va_ = 0;
  uint64_t bytes_ = 0;  // reserved
};

// Imports `fds` (one per segment, sizes[i] bytes each) and maps them contiguously. The
// descriptors stay the caller's.
wire::Result<std::unique_ptr<VmmMapping>> import_and_map(std::shared_ptr<VmmApi> api,
                                                         std::span<const int> fds,
                                                         std::span<const uint64_t> sizes);

}  // namespace kvpool::device

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
// Elastic pools reserve more than they map: VmmMapping::reserve() takes the whole virtual range
// up front and map_at() / unmap_at() add or remove one segment at an explicit offset inside it,
// so the pool's base address never moves while it grows and shrinks. The rest of the range stays
// reserved and inaccessible (memfd: PROT_NONE; CUDA: reserved, unmapped VA).
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

#include "common/wire/protocol.h"

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
  // Gives the memory of `bytes` of `handle` back now, even while other processes map it (they
  // read zeros there afterwards); for a segment nobody may use any more. The default can not:
  // the memory goes when the last mapping does (CUDA).
  virtual void discard(VmmHandle /*handle*/, uint64_t /*bytes*/) {}
  virtual wire::Result<uintptr_t> reserve(uint64_t bytes) = 0;
  virtual wire::Result<bool> map(uintptr_t va, uint64_t bytes, VmmHandle handle) = 0;
  virtual wire::Result<bool> set_access(uintptr_t va, uint64_t bytes) = 0;
  // Undo map() (the range stays reserved) and reserve().
  virtual void unmap(uintptr_t va, uint64_t bytes) = 0;
  virtual void unreserve(uintptr_t va, uint64_t bytes) = 0;
};

// Segments mapped at offsets inside one reserved range. Owns the handles it is given and releases
// each, with its mapping, when the segment is unmapped or the mapping destroyed. The memory
// itself lives until every process that maps or holds a handle to it has let go.
//
// Invariants: segments lie inside [0, bytes()), at granularity multiples, without overlapping;
// each is mapped read-write; the rest of the range is reserved and inaccessible.
// Errors (bad offsets or sizes, a failing primitive) leave the mapping as it was.
class VmmMapping {
 public:
  struct Segment {
    uint64_t offset = 0;  // from base()
    uint64_t bytes = 0;
    VmmHandle handle = 0;
  };

  // An empty reservation of `reserve_bytes` (a multiple of the granularity, > 0).
  static wire::Result<std::unique_ptr<VmmMapping>> reserve(std::shared_ptr<VmmApi> api,
                                                           uint64_t reserve_bytes);
  // Reserves the sizes' sum and maps handles[i] (sizes[i] bytes, each a multiple of the
  // granularity) at the running offset. On failure everything done so far is undone and every
  // handle released.
  static wire::Result<std::unique_ptr<VmmMapping>> map(std::shared_ptr<VmmApi> api,
                                                       std::vector<VmmHandle> handles,
                                                       std::span<const uint64_t> sizes);
  ~VmmMapping();
  VmmMapping(const VmmMapping&) = delete;
  VmmMapping& operator=(const VmmMapping&) = delete;

  // Maps `bytes` of `handle` at `offset` and makes them read-write. Takes the handle: on failure
  // it is released and the mapping is left as it was. invalid_argument when the range is not
  // granularity-aligned, leaves the reservation or overlaps a mapped segment.
  wire::Result<bool> map_at(uint64_t offset, uint64_t bytes, VmmHandle handle);
  // Imports `fd` (the caller keeps it) and maps it at `offset`, as map_at.
  wire::Result<bool> import_at(int fd, uint64_t offset, uint64_t bytes);
  // Unmaps the segment that starts at `offset` (the range becomes reserved and inaccessible
  // again) and releases its handle. invalid_argument when no segment starts there.
  wire::Result<bool> unmap_at(uint64_t offset);
  // As unmap_at, but the handle is the caller's to release (off the event loop: giving back a
  // segment's memory takes as long as zeroing it took).
  wire::Result<VmmHandle> unmap_keep(uint64_t offset);

  std::byte* base() const { return reinterpret_cast<std::byte*>(va_); }
  // Bytes reserved (mapped or not).
  uint64_t bytes() const { return bytes_; }
  // Bytes of the segments mapped now.
  uint64_t mapped_bytes() const { return mapped_; }
  // The mapped segments, by offset.
  const std::vector<Segment>& segments() const { return segments_; }
  VmmApi& api() const { return *api_; }

 private:
  explicit VmmMapping(std::shared_ptr<VmmApi> api) : api_(std::move(api)) {}
  // "" when [offset, offset + bytes) can take a new segment, else why not.
  std::string why_not_mappable(uint64_t offset, uint64_t bytes) const;

  std::shared_ptr<VmmApi> api_;
  std::vector<Segment> segments_;  // sorted by offset
  uintptr_t va_ = 0;
  uint64_t bytes_ = 0;   // reserved
  uint64_t mapped_ = 0;  // the segments' sum
};

// Imports `fds` (one per segment, sizes[i] bytes each) and maps them contiguously. The
// descriptors stay the caller's.
wire::Result<std::unique_ptr<VmmMapping>> import_and_map(std::shared_ptr<VmmApi> api,
                                                         std::span<const int> fds,
                                                         std::span<const uint64_t> sizes);
// A worker's view of an elastic pool: reserves `reserve_bytes` and imports fds[i] (sizes[i]
// bytes) at offsets[i]. The descriptors stay the caller's; on failure nothing is left mapped.
wire::Result<std::unique_ptr<VmmMapping>> import_and_map_at(std::shared_ptr<VmmApi> api,
                                                            uint64_t reserve_bytes,
                                                            std::span<const int> fds,
                                                            std::span<const uint64_t> sizes,
                                                            std::span<const uint64_t> offsets);

}  // namespace kvpool::device

// PoolMapping: a worker's view of a pool's memory, made from the hello reply (wire::PoolInfo)
// and the segment descriptors that came with it.
//
//   host, fake-device  a reservation of pool.reserved_bytes (MemfdVmm), each descriptor imported
//                      and mapped at its segment's offset
//   cuda-vmm           the same sequence with CudaVmm on the GPU whose UUID the daemon named
//   cuda-ipc           cudaIpcOpenMemHandle of the one segment's handle, once per process
// Either way base() + page · page_stride is page `page`, in host memory (device() < 0) or in the
// device memory of CUDA ordinal device() of this process.
//
// Elastic pools: the reservation is made once, for the pool's largest size, so base() never
// moves. update() follows a changed segment list (grow, shrink): it unmaps the segments that are
// gone, imports and maps the new ones, and leaves the others alone, so pointers into unchanged
// segments stay valid. A segment is "the same" when its offset, size and handle bytes match and,
// for memfd backends, its descriptor names the same file (a segment shrunk away and grown back at
// the same offset between two updates is new memory). cuda-vmm segments carry no identity beyond
// offset, size and handle: a shrink and a grow at the same offset between two updates are not
// seen (the daemon may put a per-segment serial in the handle bytes to make them seen).
// cuda-ipc pools never change.
//
// Validation (map and update): one descriptor per segment (fd backends), each segment non-empty,
// inside the reservation, none overlapping another; segment_bytes their sum; the pages
// [0, num_pages) and, in 8-bit pools, their scales at scales_offset inside mapped segments.
//
// Error policy: map() and update() return an Error naming the pool, the backend and the cause (a
// GPU not visible here, a build without CUDA, a descriptor count that does not match, a segment
// outside the reservation); update() leaves the mapping as it was when the new list is refused
// before anything changed. Thread-safety: none; the owner (Connection) serialises map, update
// and readers of the segment list.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "common/wire/protocol.h"

namespace kvpool::client {

class PoolMapping {
 public:
  virtual ~PoolMapping() = default;
  virtual std::byte* base() const = 0;
  // Bytes reserved from base() (mapped or not).
  virtual uint64_t bytes() const = 0;
  // The CUDA ordinal (in this process) the memory is on; −1 for host memory.
  virtual int device() const = 0;

  // Follows `pool`'s segment list (fds: one per segment, in order; they stay the caller's).
  // Returns whether anything was mapped or unmapped.
  virtual wire::Result<bool> update(const wire::PoolInfo& pool, std::span<const int> fds) = 0;

  // The descriptors stay the caller's (close them after).
  static wire::Result<std::unique_ptr<PoolMapping>> map(const wire::PoolInfo& pool,
                                                        std::span<const int> fds);
};

}  // namespace kvpool::client

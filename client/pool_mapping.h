// PoolMapping: a worker's view of a pool's memory, made from the hello reply (wire::PoolInfo)
// and the segment descriptors that came with it.
//
//   host, fake-device  the descriptors are imported and mapped back to back with MemfdVmm
//   cuda-vmm           the same sequence with CudaVmm on the GPU whose UUID the daemon named
//   cuda-ipc           cudaIpcOpenMemHandle of the one segment's handle, once per process
// Either way base() + page · page_stride is page `page`, in host memory (device() < 0) or in the
// device memory of CUDA ordinal device() of this process.
//
// Error policy: map() returns an Error naming the backend and the cause (a GPU not visible here,
// a build without CUDA, a descriptor count that does not match). Thread-safety: immutable after
// map().
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "common/protocol.h"

namespace kvpool::client {

class PoolMapping {
 public:
  virtual ~PoolMapping() = default;
  virtual std::byte* base() const = 0;
  virtual uint64_t bytes() const = 0;
  // The CUDA ordinal (in this process) the memory is on; −1 for host memory.
  virtual int device() const = 0;

  // The descriptors stay the caller's (close them after).
  static wire::Result<std::unique_ptr<PoolMapping>> map(const wire::PoolInfo& pool,
                                                        std::span<const int> fds);
};

}  // namespace kvpool::client

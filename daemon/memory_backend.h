// Memory backends: where a pool's pages live, behind one narrow interface (after mimalloc's
// prim.h): create a pool's memory, say how a worker reaches it, copy pages inside it, release it.
//
// Backends (DESIGN §2):
//   host         POSIX shared memory (Boost.Interprocess), one segment, its fd sent over
//                SCM_RIGHTS. The default where no GPU is usable.
//   cuda-vmm     cuMemCreate segments with POSIX-fd handles (vmm_backend.h over CudaVmm).
//   cuda-ipc     one cudaMalloc segment per pool and its cudaIpcMemHandle (cuda_ipc_backend.h).
//   fake-device  the cuda-vmm sequence on memfd memory (vmm_backend.h over MemfdVmm), for tests:
//                never picked by auto.
// A pool's memory is [num_pages × page_stride bytes of pages][num_pages × page_scale_bytes of
// scales], in one or more segments that every process maps back to back, so a page's address is
// base + page · page_stride everywhere. The daemon maps it too, for its page copies.
//
// Error policy: create() returns an Error naming the cause (the failing call, sizes and the
// system's or CUDA's text); nothing throws out of a backend. Thread-safety: the event loop owns
// the backend and its pools' memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/protocol.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

class PoolMemory {
 public:
  virtual ~PoolMemory() = default;
  // Bytes mapped in all (the segments' sum).
  virtual uint64_t bytes() const = 0;
  // The daemon's own mapping of the memory (a device pointer for the CUDA backends).
  virtual std::byte* base() const = 0;
  // What a worker needs to map the memory, in mapping order (PoolInfo::segments).
  virtual const std::vector<wire::SegmentInfo>& segments() const = 0;
  // One descriptor per segment, sent with the hello reply; empty when the backend hands memory
  // over another way. Owned by this object.
  virtual const std::vector<int>& fds() const = 0;
  // Copies pages (all layers, K and V, and their scales) src[i] → dst[i] on the daemon's own
  // stream and waits for the copy; `args.kv` is filled in by the caller from base(). Returns ""
  // or the error text.
  virtual std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) = 0;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string_view name() const = 0;
  // Bytes a new pool could take now (for capacities given as a fraction).
  virtual uint64_t available_bytes() const = 0;
  // Segment sizes are rounded up to this.
  virtual uint64_t granularity() const = 0;
  // The CUDA device (ordinal and UUID) the memory is on; −1 and zeros for host memory.
  virtual int device() const { return -1; }
  virtual std::array<uint8_t, 16> device_uuid() const { return {}; }
  // A pool's memory of at least `bytes`, in segments of at most `max_segment_bytes` (0: one).
  virtual wire::Result<std::unique_ptr<PoolMemory>> create(uint64_t bytes,
                                                           uint64_t max_segment_bytes,
                                                           std::string_view label) = 0;
};

// Picks a backend by config name ("auto", "host", "cuda-vmm", "cuda-ipc", "fake-device") for
// CUDA device `device`. auto tries cuda-vmm, then cuda-ipc, then host; `why` receives a line for
// the log saying what was chosen and why (what each refused candidate answered). A named CUDA
// backend that cannot be used is an Error naming the cause.
wire::Result<std::unique_ptr<MemoryBackend>> make_backend(std::string_view name, int device,
                                                          std::string& why);

// `bytes` rounded up to a multiple of `granularity` (> 0).
constexpr uint64_t round_up(uint64_t bytes, uint64_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}

// Segment sizes for `bytes` of pool: each a multiple of `granularity`, at most
// `max_segment_bytes` (rounded down to the granularity, 0 = unlimited), covering `bytes`.
std::vector<uint64_t> plan_segments(uint64_t bytes, uint64_t granularity,
                                    uint64_t max_segment_bytes);

}  // namespace kvpool::daemon

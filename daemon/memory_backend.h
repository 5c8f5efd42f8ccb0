// Memory backends: where a pool's pages live, behind one narrow interface (after mimalloc's
// prim.h): create a segment, say how to hand it to a worker, release it.
//
// Backends (DESIGN §2): "host" (POSIX shared memory through Boost.Interprocess, handed to workers
// as a file descriptor over SCM_RIGHTS) is built here; "cuda-vmm" and "cuda-ipc" come with the
// GPU pool. A segment is laid out as [num_pages × page_stride bytes of pages][num_pages ×
// page_scale_bytes of scales], so a page's address is base + page · page_stride in every process.
//
// Error policy: create() returns an Error naming the cause (e.g. the failing call and errno
// text); nothing throws out of a backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/protocol.h"

namespace kvpool::daemon {

class MemorySegment {
 public:
  virtual ~MemorySegment() = default;
  virtual uint64_t bytes() const = 0;
  // A file descriptor a worker maps to reach the segment (sent with SCM_RIGHTS), or -1 when the
  // backend hands segments over another way. Owned by the segment.
  virtual int shareable_fd() const = 0;
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string_view name() const = 0;
  // Bytes a new segment could take now (for capacities given as a fraction).
  virtual uint64_t available_bytes() const = 0;
  // Segment sizes are rounded up to this.
  virtual uint64_t granularity() const = 0;
  virtual wire::Result<std::unique_ptr<MemorySegment>> create(uint64_t bytes,
                                                              std::string_view label) = 0;
};

// Picks a backend by config name ("auto", "host", "cuda-vmm", "cuda-ipc"). `why` receives a line
// for the log saying what was chosen and why.
wire::Result<std::unique_ptr<MemoryBackend>> make_backend(std::string_view name, int device,
                                                          std::string& why);

}  // namespace kvpool::daemon

// TierMemory: the host memory a pool's host tier keeps its slots in, and the copies between it
// and the pool's own memory (daemon/memory/host_tier_store.h says what is copied when).
//
// Two kinds, chosen by where the pool's memory is:
//   host memory (host, fake-device backends)  anonymous private memory, copied with memcpy;
//   a CUDA device (cuda-vmm, cuda-ipc)        the same memory pinned with cudaHostRegister, so
//                                             copies are DMA, on a stream of the daemon's own
//                                             (cudaMemcpyAsync, then a stream synchronise).
// The memory is reserved whole at creation (MAP_POPULATE, then pinned where pinning applies), so
// a tier that the machine cannot hold is refused at start, naming both sizes, rather than failing
// on a later demotion. Only kvpoold maps it: workers never see host-tier bytes, only the device
// pages they are promoted into.
//
// Error policy: make_tier_memory returns an Error naming the cause; copy() returns "" or the
// error text, and then some of the runs may have been copied. Thread-safety: one copy() at a time,
// from any thread (the event loop or the CopyWorker's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/wire/protocol.h"

namespace kvpool::daemon {

// One contiguous run of bytes; either side may be device memory on the CUDA kinds.
struct ByteRun {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

class TierMemory {
 public:
  virtual ~TierMemory() = default;
  virtual std::byte* base() const = 0;
  virtual uint64_t bytes() const = 0;
  // Copies every run and waits until the bytes are in place.
  virtual std::string copy(std::span<const ByteRun> runs) = 0;
};

// `bytes` of tier memory for the pool `label`, pinned for CUDA device `device` (≥ 0) or plain
// host memory (−1).
wire::Result<std::unique_ptr<TierMemory>> make_tier_memory(int device, uint64_t bytes,
                                                           std::string_view label);

namespace detail {
// The anonymous mapping both kinds start from (tier_memory.cpp).
class AnonymousMemory {
 public:
  AnonymousMemory() = default;
  ~AnonymousMemory();
  AnonymousMemory(const AnonymousMemory&) = delete;
  AnonymousMemory& operator=(const AnonymousMemory&) = delete;
  // "" or the error (the size checked against MemAvailable first, then mmap with MAP_POPULATE).
  std::string map(uint64_t bytes);
  std::byte* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
};
// Pinned, with a CUDA stream (cuda_tier_memory.cpp; an error in builds without CUDA).
wire::Result<std::unique_ptr<TierMemory>> make_cuda_tier_memory(int device, uint64_t bytes);
}  // namespace detail

}  // namespace kvpool::daemon

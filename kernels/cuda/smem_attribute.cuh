// Opting a kernel in to more than 48 KiB of dynamic shared memory, once per kernel and device.
//
// cudaFuncSetAttribute(MaxDynamicSharedMemorySize) is per (function, device) and sticks until the
// context goes, so calling it before every launch costs a driver call per launch for nothing.
// allow_dynamic_smem<Kernel, Bytes>() sets it the first time a device launches Kernel and
// remembers that in one bit per device (devices 0..63; a higher ordinal sets it every time).
// Thread-safe: two threads may both set it the first time, which is harmless.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace kvpool::kernels::cuda {

template <auto Kernel, int Bytes>
cudaError_t allow_dynamic_smem() {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Bytes);
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return e;
}

}  // namespace kvpool::kernels::cuda

// The CUDA backends' factories: cuda-vmm (VmmBackend over CudaVmm) and cuda-ipc (one cudaMalloc
// segment per pool, exported with cudaIpcGetMemHandle). Both open the configured device first,
// so "no driver", "no device" and "no such ordinal" come back as Errors naming the cause. In a
// build without CUDA both say so.
#pragma once

#include <memory>

#include "daemon/memory/memory_backend.h"

namespace kvpool::daemon {

wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_vmm_backend(int device);
wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_ipc_backend(int device);

}  // namespace kvpool::daemon

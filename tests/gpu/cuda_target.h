// The CUDA side of the kernel check: the CUDA kernels as a KernelTarget (tests/gpu/kernel_check.h)
// and the decode bandwidth benchmark. Compiled only where nvcc is found.
#pragma once

#include <memory>
#include <string>

#include "tests/gpu/kernel_check.h"

namespace kvpool::gpu_check {

// The first CUDA device as a target, or nullptr with `err` set (the CUDA call and its error).
// `device` describes the device (name, multiprocessors, memory) when there is one.
std::unique_ptr<KernelTarget> make_cuda_target(std::string& device, std::string& err);

// The decode bandwidth table next to the device copy bandwidth, on stdout. 0, or 1 after a CUDA
// error (printed to stderr).
int run_cuda_bench();

}  // namespace kvpool::gpu_check

// KVPOOL_HD marks the pieces shared by the CPU and CUDA kernels: plain functions of their
// arguments, compiled for the host always and for the device under nvcc.
#pragma once

#if defined(__CUDACC__)
#define KVPOOL_HD __host__ __device__ __forceinline__
#else
#define KVPOOL_HD inline
#endif

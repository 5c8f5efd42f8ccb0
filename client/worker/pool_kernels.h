// PoolKernels: the kernels of kernels/ launched against a worker's attached pool.
//
// It fills each call's PagedKv (base, page stride, scales side region, geometry, layout and the
// layer_major planes' pages) from the Connection and dispatches on where the pool lives:
//   host memory (host, fake-device)   the CPU kernels, synchronously; `stream` is ignored and
//                                     every pointer in the args is host memory;
//   device memory (cuda-vmm, cuda-ipc) the CUDA kernels, asynchronously on `stream` (a
//                                     cudaStream_t as void*, nullptr = the default stream) on
//                                     the pool's GPU; every pointer in the args is device memory.
// decode's split-KV workspace is kept here and grown on demand (device memory), so one
// PoolKernels per stream; sm_count for split planning is read from the device once.
// The pool's attention kind decides what decode and extend see (kernels::geometry_mask): on a
// sliding or chunked pool a caller's mask with no window and no chunk gets the pool's, one that
// names the pool's own is accepted, and one that names another is refused; sinks are the
// caller's to give. On a latent (MLA) pool append takes k only and decode and extend take the
// caller's value_dim (the latent width); on a GPU they run the CUDA latent kernel
// (kernels/cuda/latent.cu).
//
// Error policy: each call returns "" or a message naming the bad argument or the failed launch;
// a pool on a GPU in a build without CUDA is refused. Thread-safety: one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "client/connection/connection.h"
#include "kernels/paged_kv.h"

namespace kvpool::client {

class PoolKernels {
 public:
  explicit PoolKernels(const Connection& connection);
  ~PoolKernels();
  PoolKernels(const PoolKernels&) = delete;
  PoolKernels& operator=(const PoolKernels&) = delete;

  // The pool as the kernels see it (args.kv of every call).
  kernels::PagedKv paged_kv() const;
  const Connection& connection() const { return connection_; }
  bool on_device() const { return device_ >= 0; }

  // max_context: the largest context_lens[s] (known to the host even when the array is not).
  std::string decode(kernels::DecodeArgs args, uint32_t max_context, void* stream = nullptr);
  // total_new_tokens: q_offsets[num_seqs].
  std::string extend(kernels::ExtendArgs args, uint32_t total_new_tokens, void* stream = nullptr);
  std::string append_kv(kernels::AppendArgs args, void* stream = nullptr);
  std::string copy_pages(kernels::CopyPagesArgs args, void* stream = nullptr);

  // Mixed precision (kernels/paged_kv.h, MixedPrecision; MixedSequence): decode and extend over
  // block tables whose leading older_pages[s] entries are pages of `older`'s pool (same shape,
  // usually 8-bit), the rest of this one's. Both pools must live in the same memory (host, or
  // one GPU; there older_pages is a device array). The CUDA decode reads any mixed table; the CUDA
  // extend reads a 16-bit pool over an 8-bit one, or a latent pool's of any pair (kernels_cuda.h).
  std::string decode_mixed(kernels::DecodeArgs args, const PoolKernels& older,
                           const uint32_t* older_pages, uint32_t max_context,
                           void* stream = nullptr);
  std::string extend_mixed(kernels::ExtendArgs args, const PoolKernels& older,
                           const uint32_t* older_pages, uint32_t total_new_tokens,
                           void* stream = nullptr);
  // Re-encodes whole pages of this pool into `dst`'s (same shape, another dtype or layout):
  // from[i] → to[i], host arrays, pages the caller holds (kernels/paged_kv.h, ConvertPagesArgs).
  // The ids are checked on the host first (cpu::check_convert_pages). Synchronous: on a GPU the
  // ids are staged into a device buffer kept here and the call returns once the conversion
  // finished on `stream`, so the caller may publish the pages at once.
  std::string convert_to(const PoolKernels& dst, std::span<const PageId> from,
                         std::span<const PageId> to, void* stream = nullptr);

 private:
  // args.mask as the pool's kind has it ("" or why the caller's contradicts the pool's).
  std::string pool_mask(kernels::AttentionMask& mask) const;
  // `other`'s pool as a mixed call's older pool, or why it cannot be one with this pool.
  std::string older_pool(const PoolKernels& other, const uint32_t* older_pages,
                         kernels::MixedPrecision& out) const;

  const Connection& connection_;
  int device_ = -1;
  int sm_count_ = 0;
  void* workspace_ = nullptr;  // device memory for decode's chunk states
  size_t workspace_bytes_ = 0;
  void* ids_ = nullptr;  // device memory for convert_to's page ids
  size_t ids_bytes_ = 0;
};

}  // namespace kvpool::client

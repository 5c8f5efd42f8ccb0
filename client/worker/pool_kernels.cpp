#include "client/worker/pool_kernels.h"

#include "kernels/cpu/kernels_cpu.h"
#include "kernels/pool_view.h"

#ifdef KVPOOL_WITH_CUDA
#include <cuda_runtime_api.h>

#include "common/device/cuda_device.h"
#include "kernels/cuda/kernels_cuda.h"
#endif

namespace kvpool::client {

namespace {

constexpr const char* kNoCuda =
    "the pool is in GPU memory but this libkvpool was built without CUDA";

}  // namespace

PoolKernels::PoolKernels(const Connection& connection)
    : connection_(connection), device_(connection.device()) {
#ifdef KVPOOL_WITH_CUDA
  if (device_ >= 0) cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_);
#endif
}

PoolKernels::~PoolKernels() {
#ifdef KVPOOL_WITH_CUDA
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (ids_ != nullptr) cudaFree(ids_);
#endif
}

kernels::PagedKv PoolKernels::paged_kv() const {
  return kernels::paged_kv_of(connection_.pool(), connection_.base());
}

std::string PoolKernels::pool_mask(kernels::AttentionMask& mask) const {
  const Geometry& g = connection_.pool().geometry;
  const kernels::AttentionMask pool = kernels::geometry_mask(g);
  if (kernels::mask_is_none(pool)) return {};
  if (mask.window_left == -1 && mask.chunk == 0) {
    mask.window_left = pool.window_left;
    mask.chunk = pool.chunk;
    return {};
  }
  if (mask.window_left != pool.window_left || mask.chunk != pool.chunk) {
    return "mask (window_left " + std::to_string(mask.window_left) + ", chunk " +
           std::to_string(mask.chunk) + ") contradicts the pool's " +
           std::string(attention_kind_name(g.kind)) + " geometry with window " +
           std::to_string(g.window) + " (window_left " + std::to_string(pool.window_left) +
           ", chunk " + std::to_string(pool.chunk) + "); leave both unset to take the pool's";
  }
  return {};
}

std::string PoolKernels::decode(kernels::DecodeArgs args, uint32_t max_context, void* stream) {
  args.kv = paged_kv();
  if (std::string e = pool_mask(args.mask); !e.empty()) return e;
  if (device_ < 0) return kernels::cpu::decode(args, connection_.pool().num_pages);
#ifdef KVPOOL_WITH_CUDA
  cudaSetDevice(device_);
  const size_t need = kernels::cuda::decode_workspace_bytes(args, max_context, sm_count_);
  if (need > workspace_bytes_) {
    // The old workspace may still be in use by work queued on the stream.
    if (workspace_ != nullptr) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
      cudaFree(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
    }
    if (const cudaError_t e = cudaMalloc(&workspace_, need); e != cudaSuccess) {
      return device::cuda_error_text("decode workspace", e);
    }
    workspace_bytes_ = need;
  }
  return kernels::cuda::decode(args, max_context, sm_count_, workspace_, workspace_bytes_, stream);
#else
  (void)max_context;
  (void)stream;
  return kNoCuda;
#endif
}

std::string PoolKernels::extend(kernels::ExtendArgs args, uint32_t total_new_tokens, void* stream) {
  args.kv = paged_kv();
  if (std::string e = pool_mask(args.mask); !e.empty()) return e;
  if (device_ < 0) return kernels::cpu::extend(args, connection_.pool().num_pages);
#ifdef KVPOOL_WITH_CUDA
  cudaSetDevice(device_);
  return kernels::cuda::extend(args, total_new_tokens, stream);
#else
  (void)total_new_tokens;
  (void)stream;
  return kNoCuda;
#endif
}

std::string PoolKernels::append_kv(kernels::AppendArgs args, void* stream) {
  args.kv = paged_kv();
  if (device_ < 0) return kernels::cpu::append_kv(args, connection_.pool().num_pages);
#ifdef KVPOOL_WITH_CUDA
  cudaSetDevice(device_);
  return kernels::cuda::append_kv(args, stream);
#else
  (void)stream;
  return kNoCuda;
#endif
}

std::string PoolKernels::copy_pages(kernels::CopyPagesArgs args, void* stream) {
  args.kv = paged_kv();
  if (device_ < 0) return kernels::cpu::copy_pages(args, connection_.pool().num_pages);
#ifdef KVPOOL_WITH_CUDA
  cudaSetDevice(device_);
  return kernels::cuda::copy_pages(args, stream);
#else
  (void)stream;
  return kNoCuda;
#endif
}

std::string PoolKernels::older_pool(const PoolKernels& other, const uint32_t* older_pages,
                                    kernels::MixedPrecision& out) const {
  if (other.device_ != device_) {
    return "the older pool is in " +
           (other.device_ < 0 ? std::string("host memory")
                              : "GPU " + std::to_string(other.device_)) +
           " and this one in " +
           (device_ < 0 ? std::string("host memory") : "GPU " + std::to_string(device_)) +
           ": a mixed call reads both from one place";
  }
  if (&other.connection_ == &connection_) return "the older pool is this pool";
  if (other.connection_.base() == nullptr) {
    return "the older pool's connection maps no memory (attached without a mapping)";
  }
  out = kernels::MixedPrecision{other.paged_kv(), older_pages, other.connection_.pool().num_pages};
  return {};
}

std::string PoolKernels::decode_mixed(kernels::DecodeArgs args, const PoolKernels& older,
                                      const uint32_t* older_pages, uint32_t max_context,
                                      void* stream) {
  if (std::string e = older_pool(older, older_pages, args.mixed); !e.empty()) return e;
  return decode(args, max_context, stream);
}

std::string PoolKernels::extend_mixed(kernels::ExtendArgs args, const PoolKernels& older,
                                      const uint32_t* older_pages, uint32_t total_new_tokens,
                                      void* stream) {
  if (std::string e = older_pool(older, older_pages, args.mixed); !e.empty()) return e;
  return extend(args, total_new_tokens, stream);
}

std::string PoolKernels::convert_to(const PoolKernels& dst, std::span<const PageId> from,
                                    std::span<const PageId> to, void* stream) {
  if (from.size() != to.size()) {
    return "convert_to: " + std::to_string(from.size()) + " source pages for " +
           std::to_string(to.size()) + " destinations";
  }
  if (dst.device_ != device_) return "convert_to: the two pools are not in the same memory";
  if (from.empty()) return {};
  kernels::ConvertPagesArgs args{paged_kv(), dst.paged_kv(), static_cast<uint32_t>(from.size()),
                                 from.data(), to.data()};
  const uint32_t src_pages = connection_.pool().num_pages;
  const uint32_t dst_pages = dst.connection_.pool().num_pages;
  if (device_ < 0) return kernels::cpu::convert_pages(args, src_pages, dst_pages);
  if (std::string e = kernels::cpu::check_convert_pages(args, src_pages, dst_pages); !e.empty()) {
    return e;
  }
#ifdef KVPOOL_WITH_CUDA
  cudaSetDevice(device_);
  const size_t bytes = from.size() * sizeof(PageId);
  auto s = static_cast<cudaStream_t>(stream);
  if (2 * bytes > ids_bytes_) {
    if (ids_ != nullptr) {
      cudaFree(ids_);  // every earlier call waited for its conversion: nothing reads it now
      ids_ = nullptr;
      ids_bytes_ = 0;
    }
    if (const cudaError_t e = cudaMalloc(&ids_, 2 * bytes); e != cudaSuccess) {
      return device::cuda_error_text("convert_to page ids", e);
    }
    ids_bytes_ = 2 * bytes;
  }
  auto* ids = static_cast<PageId*>(ids_);
  std::string err;
  if (cudaMemcpyAsync(ids, from.data(), bytes, cudaMemcpyHostToDevice, s) != cudaSuccess ||
      cudaMemcpyAsync(ids + from.size(), to.data(), bytes, cudaMemcpyHostToDevice, s) !=
          cudaSuccess) {
    err = "convert_to: copying the page ids to the GPU failed";
  } else {
    args.src_pages = ids;
    args.dst_pages = ids + from.size();
    err = kernels::cuda::convert_pages(args, stream);
  }
  // The ids are pageable host memory and the pages are published next: wait for the stream.
  if (const cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess && err.empty()) {
    err = device::cuda_error_text("convert_to", e);
  }
  return err;
#else
  (void)stream;
  return kNoCuda;
#endif
}

}  // namespace kvpool::client

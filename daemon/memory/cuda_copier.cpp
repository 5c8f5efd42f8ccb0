// The CUDA PageCopier: the copy-pages and convert-pages kernels on a stream of the daemon's own,
// in batches of at most wire::kMaxBatch pairs whose page lists are staged through pinned host
// memory into a device buffer of that size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "common/device/cuda_device.h"
#include "daemon/memory/page_copier.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::daemon {

namespace {

class CudaCopier final : public PageCopier {
 public:
  ~CudaCopier() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (host_ != nullptr) cudaFreeHost(host_);
    if (dev_ != nullptr) cudaFree(dev_);
  }

  std::string init(int device) {
    device_ = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return device::cuda_error_text("cudaSetDevice", e);
    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return device::cuda_error_text("cudaStreamCreate", e);
    const size_t bytes = size_t{2} * wire::kMaxBatch * sizeof(PageId);
    void* host = nullptr;
    void* dev = nullptr;
    if ((e = cudaMallocHost(&host, bytes)) != cudaSuccess)
      return device::cuda_error_text("cudaMallocHost", e);
    host_ = static_cast<PageId*>(host);
    if ((e = cudaMalloc(&dev, bytes)) != cudaSuccess)
      return device::cuda_error_text("cudaMalloc", e);
    dev_ = static_cast<PageId*>(dev);
    return "";
  }

  std::string copy(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    (void)num_pages;  // the service checked every page id against the pool
    return staged(args.src, args.dst, args.num_pairs, "copy-pages",
                  [&](const PageId* src, const PageId* dst, uint32_t n) {
                    kernels::CopyPagesArgs d = args;
                    d.src = src;
                    d.dst = dst;
                    d.num_pairs = n;
                    return kernels::cuda::copy_pages(d, stream_);
                  });
  }

  std::string convert(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                      uint32_t dst_num_pages) override {
    // The ids are checked here, on the host: the kernel trusts them.
    if (std::string err = kernels::cpu::check_convert_pages(args, src_num_pages, dst_num_pages);
        !err.empty()) {
      return err;
    }
    return staged(args.src_pages, args.dst_pages, args.num_pairs, "convert-pages",
                  [&](const PageId* src, const PageId* dst, uint32_t n) {
                    kernels::ConvertPagesArgs d = args;
                    d.src_pages = src;
                    d.dst_pages = dst;
                    d.num_pairs = n;
                    return kernels::cuda::convert_pages(d, stream_);
                  });
  }

 private:
  // Runs launch(src, dst, n) on the stream for the pairs in batches of at most kMaxBatch, each
  // batch's two page lists staged through the pinned buffer into the device one, and waits for
  // each batch (the next reuses the buffers). "" or the error, naming `what`.
  template <typename Launch>
  std::string staged(const PageId* src, const PageId* dst, uint32_t pairs, const char* what,
                     Launch&& launch) {
    if (pairs == 0) return "";
    cudaSetDevice(device_);
    for (uint32_t first = 0; first < pairs; first += wire::kMaxBatch) {
      const uint32_t n = std::min<uint32_t>(pairs - first, wire::kMaxBatch);
      const size_t list = size_t{n} * sizeof(PageId);
      std::memcpy(host_, src + first, list);
      std::memcpy(host_ + n, dst + first, list);
      cudaError_t e = cudaMemcpyAsync(dev_, host_, 2 * list, cudaMemcpyHostToDevice, stream_);
      if (e != cudaSuccess) return device::cuda_error_text("cudaMemcpyAsync of the page lists", e);
      if (std::string err = launch(dev_, dev_ + n, n); !err.empty()) return err;
      if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess)
        return device::cuda_error_text(what, e);
    }
    return "";
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  PageId* host_ = nullptr;
  PageId* dev_ = nullptr;
};

}  // namespace

wire::Result<std::unique_ptr<PageCopier>> make_cuda_copier(int device) {
  auto c = std::make_unique<CudaCopier>();
  std::string err = c->init(device);
  if (!err.empty()) return wire::Error{Status(Errc::internal), "daemon copy stream: " + err};
  return std::unique_ptr<PageCopier>(std::move(c));
}

}  // namespace kvpool::daemon

// The CUDA PageCopier: the copy-pages kernel on a stream of the daemon's own, with the page lists
// staged through pinned host memory into a device buffer sized for the largest batch.
#include <cuda_runtime_api.h>

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
    if (args.num_pairs == 0) return "";
    if (args.num_pairs > wire::kMaxBatch) return "copy: more pairs than kMaxBatch";
    cudaSetDevice(device_);
    const size_t list = size_t{args.num_pairs} * sizeof(PageId);
    std::memcpy(host_, args.src, list);
    std::memcpy(host_ + args.num_pairs, args.dst, list);
    cudaError_t e = cudaMemcpyAsync(dev_, host_, 2 * list, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) return device::cuda_error_text("cudaMemcpyAsync of the page lists", e);
    kernels::CopyPagesArgs d = args;
    d.src = dev_;
    d.dst = dev_ + args.num_pairs;
    std::string err = kernels::cuda::copy_pages(d, stream_);
    if (!err.empty()) return err;
    if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess)
      return device::cuda_error_text("copy-pages", e);
    return "";
  }

  std::string convert(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                      uint32_t dst_num_pages) override {
    // The ids are checked here, on the host: the kernel trusts them.
    if (std::string err = kernels::cpu::check_convert_pages(args, src_num_pages, dst_num_pages);
        !err.empty()) {
      return err;
    }
    if (args.num_pairs == 0) return "";
    if (args.num_pairs > wire::kMaxBatch) return "convert: more pairs than kMaxBatch";
    cudaSetDevice(device_);
    const size_t list = size_t{args.num_pairs} * sizeof(PageId);
    std::memcpy(host_, args.src_pages, list);
    std::memcpy(host_ + args.num_pairs, args.dst_pages, list);
    cudaError_t e = cudaMemcpyAsync(dev_, host_, 2 * list, cudaMemcpyHostToDevice, stream_);
    if (e != cudaSuccess) return device::cuda_error_text("cudaMemcpyAsync of the page lists", e);
    kernels::ConvertPagesArgs d = args;
    d.src_pages = dev_;
    d.dst_pages = dev_ + args.num_pairs;
    std::string err = kernels::cuda::convert_pages(d, stream_);
    if (!err.empty()) return err;
    if ((e = cudaStreamSynchronize(stream_)) != cudaSuccess)
      return device::cuda_error_text("convert-pages", e);
    return "";
  }

 private:
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

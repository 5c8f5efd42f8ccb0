// The CUDA TierMemory: anonymous host memory pinned with cudaHostRegister, so that demotions and
// promotions are DMA copies, issued on a stream of the daemon's own and waited for.
#include <cuda_runtime_api.h>

#include "common/device/cuda_device.h"
#include "daemon/memory/tier_memory.h"

namespace kvpool::daemon::detail {

namespace {

class CudaTierMemory final : public TierMemory {
 public:
  ~CudaTierMemory() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (registered_) cudaHostUnregister(mem_.base());
  }
  std::string init(int device, uint64_t bytes) {
    device_ = device;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return device::cuda_error_text("cudaSetDevice", e);
    if (std::string err = mem_.map(bytes); !err.empty()) return err;
    if ((e = cudaHostRegister(mem_.base(), bytes, cudaHostRegisterDefault)) != cudaSuccess)
      return device::cuda_error_text("cudaHostRegister of the host tier", e);
    registered_ = true;
    if ((e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)) != cudaSuccess)
      return device::cuda_error_text("cudaStreamCreate", e);
    return "";
  }
  std::byte* base() const override { return mem_.base(); }
  uint64_t bytes() const override { return mem_.bytes(); }
  std::string copy(std::span<const ByteRun> runs) override {
    // Large batches run on the CopyWorker's thread, whose current device is its own.
    if (const cudaError_t e = cudaSetDevice(device_); e != cudaSuccess)
      return device::cuda_error_text("cudaSetDevice (host tier)", e);
    for (const ByteRun& r : runs) {
      const cudaError_t e = cudaMemcpyAsync(r.dst, r.src, r.bytes, cudaMemcpyDefault, stream_);
      if (e != cudaSuccess) return device::cuda_error_text("cudaMemcpyAsync (host tier)", e);
    }
    const cudaError_t e = cudaStreamSynchronize(stream_);
    return e == cudaSuccess ? "" : device::cuda_error_text("cudaStreamSynchronize (host tier)", e);
  }

 private:
  AnonymousMemory mem_;
  bool registered_ = false;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

wire::Result<std::unique_ptr<TierMemory>> make_cuda_tier_memory(int device, uint64_t bytes) {
  auto m = std::make_unique<CudaTierMemory>();
  if (std::string err = m->init(device, bytes); !err.empty()) {
    return wire::Error{Status(Errc::internal), err};
  }
  return std::unique_ptr<TierMemory>(std::move(m));
}

}  // namespace kvpool::daemon::detail

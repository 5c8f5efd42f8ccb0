#include "daemon/memory/cuda_backends.h"

#include "daemon/memory/vmm_backend.h"

#ifdef KVPOOL_WITH_CUDA
#include "common/device/cuda_device.h"
#endif

namespace kvpool::daemon {

#ifndef KVPOOL_WITH_CUDA

namespace {
wire::Error not_built(const char* name) {
  return wire::Error{Status(Errc::invalid_argument),
                     std::string(name) +
                         " is not available: this kvpoold was built without CUDA (no nvcc at "
                         "build time); use host or auto"};
}
}  // namespace

wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_vmm_backend(int) {
  return not_built("cuda-vmm");
}
wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_ipc_backend(int) {
  return not_built("cuda-ipc");
}

#else

namespace {

wire::Error on_device(int ordinal, const char* backend, const wire::Error& e) {
  return wire::Error{
      e.status, std::string(backend) + " on device " + std::to_string(ordinal) + ": " + e.message};
}

class IpcMemory final : public PoolMemory {
 public:
  ~IpcMemory() override {
    if (ptr_ != nullptr) device::ipc_free(ptr_);
  }
  uint64_t bytes() const override { return segments_[0].bytes; }
  std::byte* base() const override { return static_cast<std::byte*>(ptr_); }
  const std::vector<wire::SegmentInfo>& segments() const override { return segments_; }
  const std::vector<int>& fds() const override { return no_fds_; }
  std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    return copier_->copy(args, num_pages);
  }
  std::string convert_pages(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                            uint32_t dst_num_pages) override {
    return copier_->convert(args, src_num_pages, dst_num_pages);
  }

  void* ptr_ = nullptr;
  std::vector<wire::SegmentInfo> segments_;
  std::vector<int> no_fds_;
  std::unique_ptr<PageCopier> copier_;
};

class IpcBackend final : public MemoryBackend {
 public:
  explicit IpcBackend(device::CudaDevice dev) : dev_(std::move(dev)) {}
  std::string_view name() const override { return "cuda-ipc"; }
  uint64_t available_bytes() const override { return dev_.free_bytes; }
  // cudaMalloc has no granularity a caller must honour; 2 MiB keeps segments page-table friendly.
  uint64_t granularity() const override { return uint64_t{2} << 20; }
  int device() const override { return dev_.ordinal; }
  std::array<uint8_t, 16> device_uuid() const override { return dev_.uuid; }

  wire::Result<std::unique_ptr<PoolMemory>> create(uint64_t bytes, uint64_t,
                                                   std::string_view label) override {
    const uint64_t rounded = round_up(bytes, granularity());
    auto seg = device::ipc_allocate(rounded);
    if (!seg.ok()) {
      return wire::Error{seg.error().status, "cuda-ipc backend, pool " + std::string(label) + ": " +
                                                 seg.error().message};
    }
    auto mem = std::make_unique<IpcMemory>();
    mem->ptr_ = seg.value().ptr;
    mem->segments_.push_back(wire::SegmentInfo{rounded, std::move(seg.value().handle), 0});
    auto copier = make_cuda_copier(dev_.ordinal);
    if (!copier.ok()) return copier.error();
    mem->copier_ = std::move(copier.value());
    return std::unique_ptr<PoolMemory>(std::move(mem));
  }

 private:
  device::CudaDevice dev_;
};

}  // namespace

wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_vmm_backend(int ordinal) {
  auto dev = device::open_cuda_device(ordinal);
  if (!dev.ok()) return on_device(ordinal, "cuda-vmm", dev.error());
  auto api = device::make_cuda_vmm(dev.value());
  if (!api.ok()) return on_device(ordinal, "cuda-vmm", api.error());
  VmmBackend::Options o;
  o.name = "cuda-vmm";
  o.api = api.value();
  o.device = ordinal;
  o.device_uuid = dev.value().uuid;
  o.available_bytes = dev.value().free_bytes;
  o.make_copier = [ordinal] { return make_cuda_copier(ordinal); };
  return std::unique_ptr<MemoryBackend>(std::make_unique<VmmBackend>(std::move(o)));
}

wire::Result<std::unique_ptr<MemoryBackend>> make_cuda_ipc_backend(int ordinal) {
  auto dev = device::open_cuda_device(ordinal);
  if (!dev.ok()) return on_device(ordinal, "cuda-ipc", dev.error());
  return std::unique_ptr<MemoryBackend>(std::make_unique<IpcBackend>(std::move(dev.value())));
}

#endif

}  // namespace kvpool::daemon

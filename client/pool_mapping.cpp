#include "client/pool_mapping.h"

#include <numeric>
#include <vector>

#include "common/device/memfd_vmm.h"
#include "common/device/vmm.h"
#ifdef KVPOOL_WITH_CUDA
#include "common/device/cuda_device.h"
#endif

namespace kvpool::client {

namespace {

wire::Error fail(const wire::PoolInfo& pool, std::string why) {
  return wire::Error{Status(Errc::internal), "cannot map pool " + pool.pool_name + " (backend " +
                                                 pool.backend + "): " + std::move(why)};
}

class VmmPoolMapping final : public PoolMapping {
 public:
  VmmPoolMapping(std::unique_ptr<device::VmmMapping> m, int device)
      : m_(std::move(m)), device_(device) {}
  std::byte* base() const override { return m_->base(); }
  uint64_t bytes() const override { return m_->bytes(); }
  int device() const override { return device_; }

 private:
  std::unique_ptr<device::VmmMapping> m_;
  int device_;
};

#ifdef KVPOOL_WITH_CUDA
class IpcPoolMapping final : public PoolMapping {
 public:
  IpcPoolMapping(void* ptr, uint64_t bytes, int device)
      : ptr_(ptr), bytes_(bytes), device_(device) {}
  ~IpcPoolMapping() override { device::ipc_close(ptr_); }
  std::byte* base() const override { return static_cast<std::byte*>(ptr_); }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }

 private:
  void* ptr_;
  uint64_t bytes_;
  int device_;
};
#endif

}  // namespace

wire::Result<std::unique_ptr<PoolMapping>> PoolMapping::map(const wire::PoolInfo& pool,
                                                            std::span<const int> fds) {
  std::vector<uint64_t> sizes;
  for (const wire::SegmentInfo& s : pool.segments)
    sizes.push_back(s.bytes);
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  if (sizes.empty() || total != pool.segment_bytes) {
    return fail(pool, std::to_string(sizes.size()) + " segments of " + std::to_string(total) +
                          " bytes for a pool of " + std::to_string(pool.segment_bytes));
  }
  const uint64_t scale_bytes = page_scale_bytes(pool.geometry);
  if (uint64_t{pool.num_pages} * (pool.page_stride + scale_bytes) > total) {
    return fail(pool, std::to_string(pool.num_pages) + " pages do not fit its " +
                          std::to_string(total) + " bytes");
  }
  if (pool.backend == "host" || pool.backend == "fake-device") {
    // Host memory: any granularity that divides the segments works; the page size always does.
    auto api = std::make_shared<device::MemfdVmm>(device::MemfdVmm::system_page_size());
    auto m = device::import_and_map(std::move(api), fds, sizes);
    if (!m.ok()) return fail(pool, m.error().message);
    return std::unique_ptr<PoolMapping>(std::make_unique<VmmPoolMapping>(std::move(m.value()), -1));
  }
#ifdef KVPOOL_WITH_CUDA
  if (pool.backend == "cuda-vmm" || pool.backend == "cuda-ipc") {
    auto dev = device::find_cuda_device(pool.device_uuid);
    if (!dev.ok()) return fail(pool, dev.error().message);
    if (pool.backend == "cuda-vmm") {
      auto api = device::make_cuda_vmm(dev.value());
      if (!api.ok()) return fail(pool, api.error().message);
      auto m = device::import_and_map(api.value(), fds, sizes);
      if (!m.ok()) return fail(pool, m.error().message);
      return std::unique_ptr<PoolMapping>(
          std::make_unique<VmmPoolMapping>(std::move(m.value()), dev.value().ordinal));
    }
    if (pool.segments.size() != 1) return fail(pool, "cuda-ipc pools have one segment");
    auto p = device::ipc_open(pool.segments[0].handle);
    if (!p.ok()) return fail(pool, p.error().message);
    return std::unique_ptr<PoolMapping>(
        std::make_unique<IpcPoolMapping>(p.value(), total, dev.value().ordinal));
  }
#else
  if (pool.backend == "cuda-vmm" || pool.backend == "cuda-ipc") {
    return fail(pool, "this libkvpool was built without CUDA");
  }
#endif
  return fail(pool, "unknown backend");
}

}  // namespace kvpool::client

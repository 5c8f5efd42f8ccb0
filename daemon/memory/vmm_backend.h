// VmmBackend: pool memory made of VmmApi segments (common/device/vmm.h) — "cuda-vmm" over
// CudaVmm and "fake-device" over MemfdVmm, the same code either way.
//
// create(): the pool's bytes are cut into segments (plan_segments: granularity multiples, at most
// max_segment_bytes each); the api is asked whether they fit in all (VmmApi::why_no_room: memfd
// compares with MemAvailable) before the first exists, then each is created and exported as a
// descriptor; the daemon then maps them back to back for its own page copies. Workers receive
// the descriptors with the hello reply and run import_and_map(). The memory lives while any process
// maps it or holds a descriptor: with cuda-vmm, workers keep reading their pages across a daemon
// crash (docs/ARCHITECTURE.md).
//
// create_elastic(): the layout's whole range is reserved (VmmMapping::reserve), the scales region
// is created and mapped whole, then the initial pages segments one by one as grow_segment() adds
// them: why_no_room is asked for the scales and initial pages together before any exists, and
// again before each later segment. The same code serves the host backend's elastic pools
// (create_elastic_vmm_memory over MemfdVmm).
//
// Error policy and thread-safety as MemoryBackend.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/device/vmm.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/memory/page_copier.h"

namespace kvpool::daemon {

class VmmBackend final : public MemoryBackend {
 public:
  struct Options {
    std::string name;  // "cuda-vmm" or "fake-device"
    std::shared_ptr<device::VmmApi> api;
    int device = -1;
    std::array<uint8_t, 16> device_uuid{};
    uint64_t available_bytes = 0;
    // Makes the copier each pool uses (host or CUDA stream).
    std::function<wire::Result<std::unique_ptr<PageCopier>>()> make_copier;
  };
  explicit VmmBackend(Options options) : o_(std::move(options)) {}

  std::string_view name() const override { return o_.name; }
  uint64_t available_bytes() const override { return o_.available_bytes; }
  uint64_t granularity() const override { return o_.api->granularity(); }
  int device() const override { return o_.device; }
  std::array<uint8_t, 16> device_uuid() const override { return o_.device_uuid; }
  wire::Result<std::unique_ptr<PoolMemory>> create(uint64_t bytes, uint64_t max_segment_bytes,
                                                   std::string_view label) override;
  wire::Result<std::unique_ptr<PoolMemory>> create_elastic(const ElasticLayout& layout,
                                                           std::string_view label) override;

 private:
  Options o_;
};

// Elastic pool memory over `api` (see above); `where` prefixes every error ("host backend, pool
// x: "). Takes the copier the pool will use.
wire::Result<std::unique_ptr<PoolMemory>> create_elastic_vmm_memory(
    std::shared_ptr<device::VmmApi> api, const ElasticLayout& layout, const std::string& where,
    std::unique_ptr<PageCopier> copier);

// The fake-device backend: MemfdVmm at a GPU-like 2 MiB granularity, CPU copies.
std::unique_ptr<MemoryBackend> make_fake_device_backend();

}  // namespace kvpool::daemon

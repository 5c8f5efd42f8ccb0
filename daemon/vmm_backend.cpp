#include "daemon/vmm_backend.h"

#include <unistd.h>

#include "common/device/memfd_vmm.h"

namespace kvpool::daemon {

namespace {

class VmmMemory final : public PoolMemory {
 public:
  ~VmmMemory() override {
    for (int fd : fds_)
      ::close(fd);
  }
  uint64_t bytes() const override { return mapping_->bytes(); }
  std::byte* base() const override { return mapping_->base(); }
  const std::vector<wire::SegmentInfo>& segments() const override { return segments_; }
  const std::vector<int>& fds() const override { return fds_; }
  std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    return copier_->copy(args, num_pages);
  }

  std::vector<wire::SegmentInfo> segments_;
  std::vector<int> fds_;  // exported, one per segment
  std::unique_ptr<device::VmmMapping> mapping_;
  std::unique_ptr<PageCopier> copier_;
};

}  // namespace

std::vector<uint64_t> plan_segments(uint64_t bytes, uint64_t granularity,
                                    uint64_t max_segment_bytes) {
  const uint64_t rounded = round_up(bytes, granularity);
  uint64_t cap = max_segment_bytes / granularity * granularity;
  if (cap == 0) cap = rounded;
  std::vector<uint64_t> sizes;
  for (uint64_t left = rounded; left > 0;) {
    const uint64_t s = left < cap ? left : cap;
    sizes.push_back(s);
    left -= s;
  }
  return sizes;
}

wire::Result<std::unique_ptr<PoolMemory>> VmmBackend::create(uint64_t bytes,
                                                             uint64_t max_segment_bytes,
                                                             std::string_view label) {
  const std::string where = o_.name + " backend, pool " + std::string(label) + ": ";
  auto fail = [&](const wire::Error& e) { return wire::Error{e.status, where + e.message}; };
  const std::vector<uint64_t> sizes = plan_segments(bytes, granularity(), max_segment_bytes);
  if (sizes.size() > wire::kMaxSegments) {
    return wire::Error{Status(Errc::invalid_argument),
                       where + std::to_string(sizes.size()) + " segments of at most " +
                           std::to_string(max_segment_bytes) + " bytes exceed the limit of " +
                           std::to_string(wire::kMaxSegments) + " (raise max_segment_bytes)"};
  }
  uint64_t total = 0;
  for (uint64_t s : sizes)
    total += s;
  // Refused before the first segment exists: segments are reserved as they are created, so a
  // pool that does not fit would otherwise take memory up to the failing one.
  if (std::string why = o_.api->why_no_room(total); !why.empty()) {
    return wire::Error{Status(Errc::invalid_argument), where + why};
  }
  auto mem = std::make_unique<VmmMemory>();
  std::vector<device::VmmHandle> handles;
  // Until the mapping owns them, the handles made so far are released on failure.
  auto release_and_fail = [&](const wire::Error& e) {
    for (device::VmmHandle done : handles)
      o_.api->release(done);
    return fail(e);
  };
  for (uint64_t s : sizes) {
    auto h = o_.api->create(s);
    if (!h.ok()) return release_and_fail(h.error());
    handles.push_back(h.value());
    auto fd = o_.api->export_fd(h.value());
    if (!fd.ok()) return release_and_fail(fd.error());
    mem->fds_.push_back(fd.value());
    mem->segments_.push_back(wire::SegmentInfo{s, {}});
  }
  auto mapping = device::VmmMapping::map(o_.api, std::move(handles), sizes);
  if (!mapping.ok()) return fail(mapping.error());
  mem->mapping_ = std::move(mapping.value());
  auto copier = o_.make_copier();
  if (!copier.ok()) return fail(copier.error());
  mem->copier_ = std::move(copier.value());
  return std::unique_ptr<PoolMemory>(std::move(mem));
}

std::unique_ptr<MemoryBackend> make_fake_device_backend() {
  VmmBackend::Options o;
  o.name = "fake-device";
  o.api = std::make_shared<device::MemfdVmm>(uint64_t{2} << 20);
  o.available_bytes =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * device::MemfdVmm::system_page_size() / 2;
  o.make_copier = [] { return wire::Result<std::unique_ptr<PageCopier>>(make_host_copier()); };
  return std::make_unique<VmmBackend>(std::move(o));
}

}  // namespace kvpool::daemon

#include "daemon/memory/vmm_backend.h"

#include <unistd.h>

#include <atomic>
#include <cstring>

#include <algorithm>

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
  std::string convert_pages(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                            uint32_t dst_num_pages) override {
    return copier_->convert(args, src_num_pages, dst_num_pages);
  }

  std::vector<wire::SegmentInfo> segments_;
  std::vector<int> fds_;  // exported, one per segment
  std::unique_ptr<device::VmmMapping> mapping_;
  std::unique_ptr<PageCopier> copier_;
};

// An elastic pool: segments_ and fds_ in offset order, the pages segments first (the first
// pages_segments_ entries, back to back from 0), then the scales segment if any.
class ElasticVmmMemory final : public PoolMemory {
 public:
  ElasticVmmMemory(std::shared_ptr<device::VmmApi> api, const ElasticLayout& layout,
                   std::string where, std::unique_ptr<device::VmmMapping> mapping,
                   std::unique_ptr<PageCopier> copier)
      : api_(std::move(api)),
        layout_(layout),
        where_(std::move(where)),
        mapping_(std::move(mapping)),
        copier_(std::move(copier)) {}
  ~ElasticVmmMemory() override {
    for (int fd : fds_)
      ::close(fd);
  }
  uint64_t bytes() const override { return mapping_->mapped_bytes(); }
  std::byte* base() const override { return mapping_->base(); }
  const std::vector<wire::SegmentInfo>& segments() const override { return segments_; }
  const std::vector<int>& fds() const override { return fds_; }
  std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    return copier_->copy(args, num_pages);
  }
  std::string convert_pages(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                            uint32_t dst_num_pages) override {
    return copier_->convert(args, src_num_pages, dst_num_pages);
  }
  bool elastic() const override { return true; }
  uint64_t reserved_bytes() const override { return mapping_->bytes(); }
  uint64_t pages_bytes_mapped() const override { return pages_mapped_; }

  wire::Result<Growth> plan_growth(uint64_t after, bool check_room) const override {
    const uint64_t end = pages_mapped_ + after;
    if (end >= layout_.pages_region_bytes) {
      return fail("the pages region is mapped whole (" + std::to_string(pages_mapped_) +
                  " bytes): the pool is at its maximum size");
    }
    const uint64_t left = layout_.pages_region_bytes - end;
    const uint64_t planned =
        after == 0 ? 0 : (after + layout_.segment_bytes - 1) / layout_.segment_bytes;
    if (segments_.size() + planned >= wire::kMaxSegments) {
      return fail("a pool has at most " + std::to_string(wire::kMaxSegments) + " segments");
    }
    Growth g;
    g.offset = end;
    g.bytes = std::min(layout_.segment_bytes, left);
    if (std::string why = check_room ? api_->why_no_room(g.bytes) : ""; !why.empty()) {
      return fail(why);
    }
    return g;
  }

  void make_growth(Growth& g) const override {
    auto h = api_->create(g.bytes);
    if (!h.ok()) {
      g.error = where_ + h.error().message;
      return;
    }
    auto fd = api_->export_fd(h.value());
    if (!fd.ok()) {
      api_->release(h.value());
      g.error = where_ + fd.error().message;
      return;
    }
    g.memory = LooseSegment(api_, h.value(), fd.value(), g.offset, g.bytes);
  }

  wire::Result<bool> commit_growth(Growth& g) override {
    if (!g.error.empty()) return wire::Error{Status(Errc::internal), g.error};
    // Segment memory does not depend on where it goes: one made for an end that has moved
    // (another grow or a shrink ran meanwhile) fits the end now if a segment there has its size.
    const uint64_t left =
        layout_.pages_region_bytes - std::min(layout_.pages_region_bytes, pages_mapped_);
    if (g.memory.empty() || g.bytes != std::min(layout_.segment_bytes, left) ||
        segments_.size() >= wire::kMaxSegments) {
      return fail("the pool's end moved from " + std::to_string(g.offset) + " to " +
                  std::to_string(pages_mapped_) + " bytes while its next segment was made");
    }
    g.offset = pages_mapped_;
    const auto [handle, fd] = g.memory.take();
    return place_segment(g.offset, g.bytes, handle, fd, pages_segments_);
  }

  wire::Result<bool> shrink_segment(LooseSegment* loose) override {
    if (pages_segments_ <= 1) {
      return fail("the first pages segment stays: the pool cannot shrink below " +
                  std::to_string(pages_mapped_) + " bytes of pages");
    }
    const size_t last = pages_segments_ - 1;
    auto unmapped = mapping_->unmap_keep(segments_[last].offset);
    if (!unmapped.ok()) return fail(unmapped.error().message);
    LooseSegment gone(api_, unmapped.value(), fds_[last], segments_[last].offset,
                      segments_[last].bytes);
    if (loose != nullptr) *loose = std::move(gone);  // else released here
    pages_mapped_ -= segments_[last].bytes;
    segments_.erase(segments_.begin() + static_cast<std::ptrdiff_t>(last));
    fds_.erase(fds_.begin() + static_cast<std::ptrdiff_t>(last));
    --pages_segments_;
    return true;
  }

  // Creates, exports and maps a segment of `bytes` at `offset`, listed at `index`. Nothing is
  // left of it on failure.
  wire::Result<bool> add_segment(uint64_t offset, uint64_t bytes, size_t index) {
    auto h = api_->create(bytes);
    if (!h.ok()) return prefixed(h.error());
    auto fd = api_->export_fd(h.value());
    if (!fd.ok()) {
      api_->release(h.value());
      return prefixed(fd.error());
    }
    return place_segment(offset, bytes, h.value(), fd.value(), index);
  }

  // Maps a created segment (handle and exported fd, both taken) at `offset`, listed at `index`.
  wire::Result<bool> place_segment(uint64_t offset, uint64_t bytes, device::VmmHandle handle,
                                   int fd, size_t index) {
    auto mapped = mapping_->map_at(offset, bytes, handle);  // takes the handle
    if (!mapped.ok()) {
      ::close(fd);
      return prefixed(mapped.error());
    }
    const auto at = static_cast<std::ptrdiff_t>(index);
    // A serial names this segment: a worker that missed a shrink and the grow that put a new
    // segment at the same offset must see that it is other memory (cuda-vmm descriptors carry no
    // identity a worker could compare).
    static std::atomic<uint64_t> next_serial{1};
    const uint64_t serial = next_serial.fetch_add(1, std::memory_order_relaxed);
    std::vector<uint8_t> id(sizeof serial);
    std::memcpy(id.data(), &serial, sizeof serial);
    segments_.insert(segments_.begin() + at, wire::SegmentInfo{bytes, std::move(id), offset});
    fds_.insert(fds_.begin() + at, fd);
    if (offset < layout_.pages_region_bytes) {
      pages_mapped_ += bytes;
      ++pages_segments_;
    }
    return true;
  }

 private:
  wire::Error fail(const std::string& why) const {
    return wire::Error{Status(Errc::invalid_argument), where_ + why};
  }
  wire::Error prefixed(const wire::Error& e) const {
    return wire::Error{e.status, where_ + e.message};
  }

  std::shared_ptr<device::VmmApi> api_;
  ElasticLayout layout_;
  std::string where_;
  std::unique_ptr<device::VmmMapping> mapping_;
  std::unique_ptr<PageCopier> copier_;
  std::vector<wire::SegmentInfo> segments_;
  std::vector<int> fds_;
  uint64_t pages_mapped_ = 0;
  size_t pages_segments_ = 0;
};

}  // namespace

wire::Result<std::unique_ptr<PoolMemory>> create_elastic_vmm_memory(
    std::shared_ptr<device::VmmApi> api, const ElasticLayout& layout, const std::string& where,
    std::unique_ptr<PageCopier> copier) {
  const uint64_t g = api->granularity();
  const ElasticLayout& l = layout;
  auto bad = [&](const std::string& why) {
    return wire::Error{Status(Errc::invalid_argument), where + "elastic layout: " + why};
  };
  for (const uint64_t v : {l.reserve_bytes, l.pages_region_bytes, l.scales_offset, l.scales_bytes,
                           l.segment_bytes, l.initial_pages_bytes}) {
    if (v % g != 0) {
      return bad(std::to_string(v) + " bytes is not a multiple of the " + std::string(api->name()) +
                 " granularity (" + std::to_string(g) + ")");
    }
  }
  if (l.segment_bytes == 0 || l.pages_region_bytes == 0 || l.initial_pages_bytes == 0) {
    return bad("the segment, pages region and initial pages sizes must be positive");
  }
  if (l.initial_pages_bytes > l.pages_region_bytes ||
      (l.initial_pages_bytes % l.segment_bytes != 0 &&
       l.initial_pages_bytes != l.pages_region_bytes)) {
    return bad("initial pages of " + std::to_string(l.initial_pages_bytes) +
               " bytes are not whole segments of " + std::to_string(l.segment_bytes) +
               " bytes inside the pages region of " + std::to_string(l.pages_region_bytes));
  }
  if (l.scales_bytes != 0 &&
      (l.scales_offset < l.pages_region_bytes || l.scales_offset > l.reserve_bytes ||
       l.scales_bytes > l.reserve_bytes - l.scales_offset)) {
    return bad("the scales region [" + std::to_string(l.scales_offset) + ", +" +
               std::to_string(l.scales_bytes) + ") is not after the pages region inside the " +
               std::to_string(l.reserve_bytes) + "-byte reservation");
  }
  if (l.pages_region_bytes > l.reserve_bytes) {
    return bad("the pages region of " + std::to_string(l.pages_region_bytes) +
               " bytes exceeds the reservation of " + std::to_string(l.reserve_bytes));
  }
  const uint64_t max_segments = (l.pages_region_bytes + l.segment_bytes - 1) / l.segment_bytes +
                                (l.scales_bytes != 0 ? 1 : 0);
  if (max_segments > wire::kMaxSegments) {
    return bad(std::to_string(max_segments) + " segments of " + std::to_string(l.segment_bytes) +
               " bytes at full size exceed the limit of " + std::to_string(wire::kMaxSegments) +
               " (larger segments)");
  }
  // Refused before the first segment exists, as create() does.
  if (std::string why = api->why_no_room(l.scales_bytes + l.initial_pages_bytes); !why.empty()) {
    return wire::Error{Status(Errc::invalid_argument), where + why};
  }
  auto mapping = device::VmmMapping::reserve(api, l.reserve_bytes);
  if (!mapping.ok()) return wire::Error{mapping.error().status, where + mapping.error().message};
  auto mem = std::make_unique<ElasticVmmMemory>(api, layout, where, std::move(mapping.value()),
                                                std::move(copier));
  if (l.scales_bytes != 0) {
    auto s = mem->add_segment(l.scales_offset, l.scales_bytes, 0);
    if (!s.ok()) return s.error();
  }
  while (mem->pages_bytes_mapped() < l.initial_pages_bytes) {
    const uint64_t bytes =
        std::min(l.segment_bytes, l.initial_pages_bytes - mem->pages_bytes_mapped());
    auto s = mem->add_segment(mem->pages_bytes_mapped(), bytes,
                              mem->segments().size() - (l.scales_bytes != 0 ? 1 : 0));
    if (!s.ok()) return s.error();
  }
  return std::unique_ptr<PoolMemory>(std::move(mem));
}

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
  uint64_t offset = 0;
  for (uint64_t s : sizes) {
    auto h = o_.api->create(s);
    if (!h.ok()) return release_and_fail(h.error());
    handles.push_back(h.value());
    auto fd = o_.api->export_fd(h.value());
    if (!fd.ok()) return release_and_fail(fd.error());
    mem->fds_.push_back(fd.value());
    mem->segments_.push_back(wire::SegmentInfo{s, {}, offset});
    offset += s;
  }
  auto mapping = device::VmmMapping::map(o_.api, std::move(handles), sizes);
  if (!mapping.ok()) return fail(mapping.error());
  mem->mapping_ = std::move(mapping.value());
  auto copier = o_.make_copier();
  if (!copier.ok()) return fail(copier.error());
  mem->copier_ = std::move(copier.value());
  return std::unique_ptr<PoolMemory>(std::move(mem));
}

wire::Result<std::unique_ptr<PoolMemory>> VmmBackend::create_elastic(const ElasticLayout& layout,
                                                                     std::string_view label) {
  const std::string where = o_.name + " backend, pool " + std::string(label) + ": ";
  auto copier = o_.make_copier();
  if (!copier.ok()) return wire::Error{copier.error().status, where + copier.error().message};
  return create_elastic_vmm_memory(o_.api, layout, where, std::move(copier.value()));
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

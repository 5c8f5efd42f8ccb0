#include "common/device/vmm.h"

#include <algorithm>
#include <numeric>

namespace kvpool::device {

namespace {

wire::Error bad(std::string message) {
  return wire::Error{Status(Errc::invalid_argument), std::move(message)};
}

}  // namespace

wire::Result<std::unique_ptr<VmmMapping>> VmmMapping::reserve(std::shared_ptr<VmmApi> api,
                                                              uint64_t reserve_bytes) {
  const uint64_t g = api->granularity();
  if (reserve_bytes == 0 || reserve_bytes % g != 0) {
    return bad("a reservation of " + std::to_string(reserve_bytes) +
               " bytes is not a positive multiple of the " + std::string(api->name()) +
               " granularity (" + std::to_string(g) + ")");
  }
  std::unique_ptr<VmmMapping> m(new VmmMapping(std::move(api)));
  auto va = m->api_->reserve(reserve_bytes);
  if (!va.ok()) return va.error();
  m->va_ = va.value();
  m->bytes_ = reserve_bytes;
  return m;
}

wire::Result<std::unique_ptr<VmmMapping>> VmmMapping::map(std::shared_ptr<VmmApi> api,
                                                          std::vector<VmmHandle> handles,
                                                          std::span<const uint64_t> sizes) {
  auto release_all = [&](size_t from) {
    for (size_t i = from; i < handles.size(); ++i)
      api->release(handles[i]);
  };
  if (handles.size() != sizes.size() || sizes.empty()) {
    release_all(0);
    return bad("a pool mapping needs one size per segment");
  }
  const uint64_t g = api->granularity();
  for (uint64_t s : sizes) {
    if (s == 0 || s % g != 0) {
      release_all(0);
      return bad("segment of " + std::to_string(s) + " bytes is not a multiple of the " +
                 std::string(api->name()) + " granularity (" + std::to_string(g) + ")");
    }
  }
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  auto m = reserve(api, total);
  if (!m.ok()) {
    release_all(0);
    return m.error();
  }
  // The destructor undoes the segments mapped so far; map_at releases the one it fails on.
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto mapped = m.value()->map_at(offset, sizes[i], handles[i]);
    if (!mapped.ok()) {
      release_all(i + 1);
      return mapped.error();
    }
    offset += sizes[i];
  }
  return m;
}

VmmMapping::~VmmMapping() {
  for (const Segment& s : segments_) {
    api_->unmap(va_ + s.offset, s.bytes);
    api_->release(s.handle);
  }
  if (va_ != 0) api_->unreserve(va_, bytes_);
}

std::string VmmMapping::why_not_mappable(uint64_t offset, uint64_t bytes) const {
  const uint64_t g = api_->granularity();
  const std::string range =
      "a segment of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset);
  if (bytes == 0 || bytes % g != 0 || offset % g != 0) {
    return range + " is not aligned to the " + std::string(api_->name()) + " granularity (" +
           std::to_string(g) + ")";
  }
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return range + " ends past the reservation of " + std::to_string(bytes_) + " bytes";
  }
  // The first segment ending after `offset` is the only one that can overlap from below or
  // inside; segments are sorted and disjoint.
  const auto it = std::find_if(segments_.begin(), segments_.end(),
                               [&](const Segment& s) { return s.offset + s.bytes > offset; });
  if (it != segments_.end() && it->offset < offset + bytes) {
    return range + " overlaps the mapped segment of " + std::to_string(it->bytes) +
           " bytes at offset " + std::to_string(it->offset);
  }
  return {};
}

wire::Result<bool> VmmMapping::map_at(uint64_t offset, uint64_t bytes, VmmHandle handle) {
  if (std::string why = why_not_mappable(offset, bytes); !why.empty()) {
    api_->release(handle);
    return bad(std::move(why));
  }
  auto mapped = api_->map(va_ + offset, bytes, handle);
  if (!mapped.ok()) {
    api_->release(handle);
    return mapped.error();
  }
  auto access = api_->set_access(va_ + offset, bytes);
  if (!access.ok()) {
    api_->unmap(va_ + offset, bytes);
    api_->release(handle);
    return access.error();
  }
  const auto at = std::lower_bound(segments_.begin(), segments_.end(), offset,
                                   [](const Segment& s, uint64_t o) { return s.offset < o; });
  segments_.insert(at, Segment{offset, bytes, handle});
  mapped_ += bytes;
  return true;
}

wire::Result<bool> VmmMapping::import_at(int fd, uint64_t offset, uint64_t bytes) {
  // Checked before the import too: a descriptor that cannot be placed is not worth a handle.
  if (std::string why = why_not_mappable(offset, bytes); !why.empty()) return bad(std::move(why));
  auto h = api_->import_fd(fd, bytes);
  if (!h.ok()) return h.error();
  return map_at(offset, bytes, h.value());
}

wire::Result<bool> VmmMapping::unmap_at(uint64_t offset) {
  auto h = unmap_keep(offset);
  if (!h.ok()) return h.error();
  api_->release(h.value());
  return true;
}

wire::Result<VmmHandle> VmmMapping::unmap_keep(uint64_t offset) {
  const auto it = std::find_if(segments_.begin(), segments_.end(),
                               [&](const Segment& s) { return s.offset == offset; });
  if (it == segments_.end()) {
    return bad("no mapped segment starts at offset " + std::to_string(offset));
  }
  api_->unmap(va_ + it->offset, it->bytes);
  const VmmHandle handle = it->handle;
  mapped_ -= it->bytes;
  segments_.erase(it);
  return handle;
}

wire::Result<std::unique_ptr<VmmMapping>> import_and_map(std::shared_ptr<VmmApi> api,
                                                         std::span<const int> fds,
                                                         std::span<const uint64_t> sizes) {
  if (fds.size() != sizes.size()) {
    return bad("received " + std::to_string(fds.size()) + " segment descriptors for " +
               std::to_string(sizes.size()) + " segments");
  }
  std::vector<VmmHandle> handles;
  for (size_t i = 0; i < fds.size(); ++i) {
    auto h = api->import_fd(fds[i], sizes[i]);
    if (!h.ok()) {
      for (VmmHandle done : handles)
        api->release(done);
      return h.error();
    }
    handles.push_back(h.value());
  }
  return VmmMapping::map(std::move(api), std::move(handles), sizes);
}

wire::Result<std::unique_ptr<VmmMapping>> import_and_map_at(std::shared_ptr<VmmApi> api,
                                                            uint64_t reserve_bytes,
                                                            std::span<const int> fds,
                                                            std::span<const uint64_t> sizes,
                                                            std::span<const uint64_t> offsets) {
  if (fds.size() != sizes.size() || fds.size() != offsets.size()) {
    return bad("received " + std::to_string(fds.size()) + " segment descriptors for " +
               std::to_string(sizes.size()) + " sizes and " + std::to_string(offsets.size()) +
               " offsets");
  }
  auto m = VmmMapping::reserve(std::move(api), reserve_bytes);
  if (!m.ok()) return m.error();
  for (size_t i = 0; i < fds.size(); ++i) {
    auto mapped = m.value()->import_at(fds[i], offsets[i], sizes[i]);
    if (!mapped.ok()) return mapped.error();
  }
  return m;
}

}  // namespace kvpool::device

#include "common/device/vmm.h"

#include <numeric>

namespace kvpool::device {

wire::Result<std::unique_ptr<VmmMapping>> VmmMapping::map(std::shared_ptr<VmmApi> api,
                                                          std::vector<VmmHandle> handles,
                                                          std::span<const uint64_t> sizes) {
  // The destructor undoes whatever part of the sequence ran, so every early return cleans up.
  std::unique_ptr<VmmMapping> m(new VmmMapping(std::move(api), std::move(handles)));
  if (m->handles_.size() != sizes.size() || sizes.empty()) {
    return wire::Error{Status(Errc::invalid_argument), "a pool mapping needs one size per segment"};
  }
  const uint64_t g = m->api_->granularity();
  for (uint64_t s : sizes) {
    if (s == 0 || s % g != 0) {
      return wire::Error{Status(Errc::invalid_argument),
                         "segment of " + std::to_string(s) + " bytes is not a multiple of the " +
                             std::string(m->api_->name()) + " granularity (" + std::to_string(g) +
                             ")"};
    }
  }
  const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  auto va = m->api_->reserve(total);
  if (!va.ok()) return va.error();
  m->va_ = va.value();
  m->bytes_ = total;
  uint64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto mapped = m->api_->map(m->va_ + offset, sizes[i], m->handles_[i]);
    if (!mapped.ok()) return mapped.error();
    m->sizes_.push_back(sizes[i]);
    offset += sizes[i];
  }
  auto access = m->api_->set_access(m->va_, total);
  if (!access.ok()) return access.error();
  return m;
}

VmmMapping::~VmmMapping() {
  uint64_t offset = 0;
  for (uint64_t s : sizes_) {
    api_->unmap(va_ + offset, s);
    offset += s;
  }
  if (va_ != 0) api_->unreserve(va_, bytes_);
  for (VmmHandle h : handles_)
    api_->release(h);
}

wire::Result<std::unique_ptr<VmmMapping>> import_and_map(std::shared_ptr<VmmApi> api,
                                                         std::span<const int> fds,
                                                         std::span<const uint64_t> sizes) {
  if (fds.size() != sizes.size()) {
    return wire::Error{Status(Errc::invalid_argument),
                       "received " + std::to_string(fds.size()) + " segment descriptors for " +
                           std::to_string(sizes.size()) + " segments"};
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

}  // namespace kvpool::device

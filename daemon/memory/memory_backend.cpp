#include "daemon/memory/memory_backend.h"

#include <unistd.h>

#include <utility>

namespace kvpool::daemon {

LooseSegment& LooseSegment::operator=(LooseSegment&& o) noexcept {
  if (this != &o) {
    reset();
    api_ = std::move(o.api_);
    handle_ = o.handle_;
    fd_ = std::exchange(o.fd_, -1);
    offset_ = o.offset_;
    bytes_ = o.bytes_;
  }
  return *this;
}

std::pair<device::VmmHandle, int> LooseSegment::take() {
  api_ = nullptr;
  return {handle_, std::exchange(fd_, -1)};
}

void LooseSegment::reset() {
  if (api_ == nullptr) return;
  api_->discard(handle_, bytes_);
  api_->release(handle_);
  if (fd_ >= 0) ::close(fd_);
  api_ = nullptr;
  fd_ = -1;
}

wire::Result<bool> PoolMemory::grow_segment() {
  auto g = plan_growth();
  if (!g.ok()) return g.error();
  make_growth(g.value());
  return commit_growth(g.value());
}

wire::Result<bool> PoolMemory::shrink_segment(LooseSegment*) {
  return wire::Error{Status(Errc::invalid_argument), "a fixed-size pool cannot shrink"};
}

wire::Result<Growth> PoolMemory::plan_growth(uint64_t, bool) const {
  return wire::Error{Status(Errc::invalid_argument), "a fixed-size pool cannot grow"};
}

void PoolMemory::make_growth(Growth& g) const {
  g.error = "a fixed-size pool cannot grow";
}

wire::Result<bool> PoolMemory::commit_growth(Growth&) {
  return wire::Error{Status(Errc::invalid_argument), "a fixed-size pool cannot grow"};
}

wire::Result<std::unique_ptr<PoolMemory>> MemoryBackend::create_elastic(const ElasticLayout&,
                                                                        std::string_view label) {
  return wire::Error{Status(Errc::invalid_argument),
                     std::string(name()) + " backend, pool " + std::string(label) +
                         ": no elastic pools on this backend (host, cuda-vmm and fake-device "
                         "have them)"};
}

}  // namespace kvpool::daemon

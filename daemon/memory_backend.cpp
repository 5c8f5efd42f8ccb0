#include "daemon/memory_backend.h"

#include <unistd.h>

#include <utility>

#include "daemon/cuda_backends.h"
#include "daemon/host_backend.h"
#include "daemon/vmm_backend.h"

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

wire::Result<std::unique_ptr<MemoryBackend>> make_backend(std::string_view name, int device,
                                                          std::string& why) {
  if (name == "host") {
    why = "host backend: named in the config";
    return std::unique_ptr<MemoryBackend>(std::make_unique<HostBackend>());
  }
  if (name == "fake-device") {
    why =
        "fake-device backend (memfd memory through the cuda-vmm path, for tests): named in the "
        "config";
    return make_fake_device_backend();
  }
  if (name == "cuda-vmm" || name == "cuda-ipc") {
    auto b = name == "cuda-vmm" ? make_cuda_vmm_backend(device) : make_cuda_ipc_backend(device);
    if (b.ok())
      why = std::string(name) + " backend on device " + std::to_string(device) +
            ": named in the config";
    return b;
  }
  if (name != "auto") {
    return wire::Error{
        Status(Errc::invalid_argument),
        "unknown backend " + std::string(name) + " (auto, host, cuda-vmm, cuda-ipc, fake-device)"};
  }
  auto vmm = make_cuda_vmm_backend(device);
  if (vmm.ok()) {
    why = "cuda-vmm backend on device " + std::to_string(device) + ": auto, first choice";
    return vmm;
  }
  auto ipc = make_cuda_ipc_backend(device);
  if (ipc.ok()) {
    why = "cuda-ipc backend on device " + std::to_string(device) +
          ": auto, because cuda-vmm is not usable (" + vmm.error().message + ")";
    return ipc;
  }
  // Both messages read "<backend> on device N: <cause>"; when the device itself is unusable the
  // causes are the same and are said once.
  const std::string& v = vmm.error().message;
  const std::string& i = ipc.error().message;
  why = "host backend: auto, because " + v;
  if (v.substr(v.find(' ')) != i.substr(i.find(' '))) why += "; and " + i;
  return std::unique_ptr<MemoryBackend>(std::make_unique<HostBackend>());
}

}  // namespace kvpool::daemon

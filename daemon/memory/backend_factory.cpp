// make_backend: the one place that knows every memory backend (memory_backend.h declares it).
#include "daemon/memory/cuda_backends.h"
#include "daemon/memory/host_backend.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/memory/vmm_backend.h"

namespace kvpool::daemon {

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

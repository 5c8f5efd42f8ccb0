// CUDA devices for the pool backends: opening a device by ordinal (daemon) or by UUID (worker),
// the VmmApi over the driver's virtual-memory calls (cuda-vmm), and legacy IPC handles
// (cuda-ipc). Built only when nvcc is present (KVPOOL_WITH_CUDA).
//
// DESIGN §2: nothing here links libcuda. The runtime is linked statically and every driver call
// is reached through cudaGetDriverEntryPointByVersion, so a binary starts where no NVIDIA driver
// is installed and "no driver" comes back as an Error, never as a loader failure.
//
// Workers find the daemon's GPU by UUID, not ordinal: CUDA_VISIBLE_DEVICES may number the same
// GPU differently in each process.
//
// Error policy: every failure is an Error whose message names the cause in an operator's words
// (no driver, no device, handle type not supported, out of memory) and the CUDA error text.
// Thread-safety: open/find/make may be called from any thread; the IPC registry is locked.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/device/vmm.h"

namespace kvpool::device {

using DeviceUuid = std::array<uint8_t, 16>;

struct CudaDevice {
  int ordinal = -1;  // in this process
  DeviceUuid uuid{};
  std::string name;
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  int sm_count = 0;
};

// "what: cudaErrorName: description" for a CUDA runtime error code (a cudaError_t).
std::string cuda_error_text(const char* what, int error);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
std::string uuid_text(const DeviceUuid& uuid);

// Device `ordinal`, made current on the calling thread (its primary context).
wire::Result<CudaDevice> open_cuda_device(int ordinal);
// The visible device with `uuid`, made current.
wire::Result<CudaDevice> find_cuda_device(const DeviceUuid& uuid);

// cuda-vmm: fails where the driver or device lacks virtual memory management or POSIX-fd
// shareable handles.
wire::Result<std::shared_ptr<VmmApi>> make_cuda_vmm(const CudaDevice& device);

// cuda-ipc, daemon side: one cudaMalloc'd segment and its 64-byte IPC handle.
struct IpcSegment {
  void* ptr = nullptr;
  std::vector<uint8_t> handle;
};
wire::Result<IpcSegment> ipc_allocate(uint64_t bytes);
void ipc_free(void* ptr);

// cuda-ipc, worker side: a process opens each handle once (a second cudaIpcOpenMemHandle of the
// same handle is refused by CUDA), so opens are counted per handle and the last close unmaps.
wire::Result<void*> ipc_open(std::span<const uint8_t> handle);
void ipc_close(void* ptr);

}  // namespace kvpool::device

#include "common/device/cuda_device.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>

namespace kvpool::device {

namespace {

wire::Error fail(std::string message) {
  return wire::Error{Status(Errc::internal), std::move(message)};
}

std::string rt_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// The runtime's answer to "is there a usable GPU", in an operator's words.
wire::Error no_device_error(cudaError_t e) {
  switch (e) {
    case cudaErrorInsufficientDriver:
      return fail(
          "no usable NVIDIA driver: libcuda.so.1 is not installed or is older than this "
          "CUDA runtime (" +
          rt_text(e) + ")");
    case cudaErrorNoDevice:
      return fail(
          "no CUDA device is visible to this process (check the driver, /dev/nvidia* "
          "access and CUDA_VISIBLE_DEVICES) (" +
          rt_text(e) + ")");
    default:
      return fail("CUDA is not usable: " + rt_text(e));
  }
}

// Driver entry points, resolved once through the runtime (never a link to libcuda).
struct Driver {
  decltype(&::cuGetErrorString) getErrorString = nullptr;
  decltype(&::cuDeviceGet) deviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) deviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) memGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) memCreate = nullptr;
  decltype(&::cuMemRelease) memRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) memExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) memImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) memAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) memAddressFree = nullptr;
  decltype(&::cuMemMap) memMap = nullptr;
  decltype(&::cuMemUnmap) memUnmap = nullptr;
  decltype(&::cuMemSetAccess) memSetAccess = nullptr;
};

template <typename Fn>
bool resolve(const char* symbol, Fn& fn, std::string& missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  // 12000: the ABI of these calls as of CUDA 12, which every driver this build supports has.
  const cudaError_t e =
      cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &status);
  if (e != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    missing = symbol;
    return false;
  }
  fn = reinterpret_cast<Fn>(p);
  return true;
}

wire::Result<const Driver*> driver() {
  static std::once_flag once;
  static Driver d;
  static std::string missing;
  std::call_once(once, [] {
    resolve("cuGetErrorString", d.getErrorString, missing) &&
        resolve("cuDeviceGet", d.deviceGet, missing) &&
        resolve("cuDeviceGetAttribute", d.deviceGetAttribute, missing) &&
        resolve("cuMemGetAllocationGranularity", d.memGetAllocationGranularity, missing) &&
        resolve("cuMemCreate", d.memCreate, missing) &&
        resolve("cuMemRelease", d.memRelease, missing) &&
        resolve("cuMemExportToShareableHandle", d.memExportToShareableHandle, missing) &&
        resolve("cuMemImportFromShareableHandle", d.memImportFromShareableHandle, missing) &&
        resolve("cuMemAddressReserve", d.memAddressReserve, missing) &&
        resolve("cuMemAddressFree", d.memAddressFree, missing) &&
        resolve("cuMemMap", d.memMap, missing) && resolve("cuMemUnmap", d.memUnmap, missing) &&
        resolve("cuMemSetAccess", d.memSetAccess, missing);
  });
  if (!missing.empty()) {
    return fail("the NVIDIA driver does not provide " + missing +
                " (virtual memory management needs a CUDA 12 driver)");
  }
  return &d;
}

std::string drv_text(const Driver& d, CUresult r) {
  const char* s = nullptr;
  if (d.getErrorString == nullptr || d.getErrorString(r, &s) != CUDA_SUCCESS || s == nullptr)
    return "CUresult " + std::to_string(static_cast<int>(r));
  return s;
}

wire::Error drv_fail(const Driver& d, const std::string& what, CUresult r) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return fail("out of device memory: " + what + " (" + drv_text(d, r) + ")");
  }
  return fail(what + " failed: " + drv_text(d, r));
}

wire::Result<CudaDevice> describe(int ordinal) {
  CudaDevice dev;
  dev.ordinal = ordinal;
  cudaDeviceProp prop{};
  cudaError_t e = cudaGetDeviceProperties(&prop, ordinal);
  if (e != cudaSuccess)
    return fail("cudaGetDeviceProperties(" + std::to_string(ordinal) + "): " + rt_text(e));
  std::memcpy(dev.uuid.data(), prop.uuid.bytes, dev.uuid.size());
  dev.name = prop.name;
  dev.sm_count = prop.multiProcessorCount;
  if ((e = cudaSetDevice(ordinal)) != cudaSuccess) {
    return fail("cudaSetDevice(" + std::to_string(ordinal) + "): " + rt_text(e));
  }
  size_t free_b = 0;
  size_t total_b = 0;
  if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) {
    return fail("cudaMemGetInfo on device " + std::to_string(ordinal) + ": " + rt_text(e));
  }
  dev.free_bytes = free_b;
  dev.total_bytes = total_b;
  return dev;
}

int device_count(cudaError_t& e) {
  int n = 0;
  e = cudaGetDeviceCount(&n);
  return n;
}

class CudaVmm final : public VmmApi {
 public:
  CudaVmm(const Driver& d, int ordinal, uint64_t granularity)
      : d_(d), ordinal_(ordinal), granularity_(granularity) {}
  std::string_view name() const override { return "cuda-vmm"; }
  uint64_t granularity() const override { return granularity_; }

  wire::Result<VmmHandle> create(uint64_t bytes) override {
    // kvpoold makes segments on its copy thread too: that thread's current device must be ours.
    (void)cudaSetDevice(ordinal_);
    CUmemAllocationProp prop = properties();
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = d_.memCreate(&h, bytes, &prop, 0);
    if (r != CUDA_SUCCESS) {
      return drv_fail(d_,
                      "cuMemCreate of " + std::to_string(bytes) + " bytes on device " +
                          std::to_string(ordinal_),
                      r);
    }
    return VmmHandle{h};
  }
  wire::Result<int> export_fd(VmmHandle handle) override {
    int fd = -1;
    const CUresult r =
        d_.memExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) return drv_fail(d_, "cuMemExportToShareableHandle (POSIX fd)", r);
    return fd;
  }
  wire::Result<VmmHandle> import_fd(int fd, uint64_t bytes) override {
    (void)bytes;
    CUmemGenericAllocationHandle h = 0;
    // The driver reads the descriptor and does not keep it: the caller still owns fd.
    const CUresult r =
        d_.memImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) return drv_fail(d_, "cuMemImportFromShareableHandle", r);
    return VmmHandle{h};
  }
  void release(VmmHandle handle) override { d_.memRelease(handle); }
  wire::Result<uintptr_t> reserve(uint64_t bytes) override {
    CUdeviceptr va = 0;
    const CUresult r = d_.memAddressReserve(&va, bytes, granularity_, 0, 0);
    if (r != CUDA_SUCCESS) {
      return drv_fail(d_, "cuMemAddressReserve of " + std::to_string(bytes) + " bytes", r);
    }
    return static_cast<uintptr_t>(va);
  }
  wire::Result<bool> map(uintptr_t va, uint64_t bytes, VmmHandle handle) override {
    const CUresult r = d_.memMap(static_cast<CUdeviceptr>(va), bytes, 0, handle, 0);
    if (r != CUDA_SUCCESS)
      return drv_fail(d_, "cuMemMap of " + std::to_string(bytes) + " bytes", r);
    return true;
  }
  wire::Result<bool> set_access(uintptr_t va, uint64_t bytes) override {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = ordinal_;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    const CUresult r = d_.memSetAccess(static_cast<CUdeviceptr>(va), bytes, &access, 1);
    if (r != CUDA_SUCCESS) return drv_fail(d_, "cuMemSetAccess (read-write)", r);
    return true;
  }
  void unmap(uintptr_t va, uint64_t bytes) override {
    d_.memUnmap(static_cast<CUdeviceptr>(va), bytes);
  }
  void unreserve(uintptr_t va, uint64_t bytes) override {
    d_.memAddressFree(static_cast<CUdeviceptr>(va), bytes);
  }

  CUmemAllocationProp properties() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
  }

 private:
  const Driver& d_;
  int ordinal_;
  uint64_t granularity_;
};

struct IpcOpen {
  void* ptr = nullptr;
  int refs = 0;
};

std::mutex& ipc_mutex() {
  static std::mutex m;
  return m;
}
// Keyed by the handle's bytes.
std::map<std::string, IpcOpen>& ipc_opens() {
  static std::map<std::string, IpcOpen> opens;
  return opens;
}

}  // namespace

std::string cuda_error_text(const char* what, int error) {
  return std::string(what) + ": " + rt_text(static_cast<cudaError_t>(error));
}

std::string uuid_text(const DeviceUuid& u) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s = "GPU-";
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[u[i] >> 4];
    s += kHex[u[i] & 0xf];
  }
  return s;
}

wire::Result<CudaDevice> open_cuda_device(int ordinal) {
  cudaError_t e = cudaSuccess;
  const int n = device_count(e);
  if (e != cudaSuccess) return no_device_error(e);
  if (ordinal < 0 || ordinal >= n) {
    return fail("CUDA device " + std::to_string(ordinal) + " does not exist: " + std::to_string(n) +
                " visible (config key device)");
  }
  return describe(ordinal);
}

wire::Result<CudaDevice> find_cuda_device(const DeviceUuid& uuid) {
  cudaError_t e = cudaSuccess;
  const int n = device_count(e);
  if (e != cudaSuccess) return no_device_error(e);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    if (std::memcmp(prop.uuid.bytes, uuid.data(), uuid.size()) == 0) return describe(i);
  }
  return fail("the pool's GPU " + uuid_text(uuid) + " is not visible to this process (" +
              std::to_string(n) + " devices visible; check CUDA_VISIBLE_DEVICES)");
}

wire::Result<std::shared_ptr<VmmApi>> make_cuda_vmm(const CudaDevice& device) {
  auto d = driver();
  if (!d.ok()) return d.error();
  const Driver& drv = *d.value();
  CUdevice dev = 0;
  CUresult r = drv.deviceGet(&dev, device.ordinal);
  if (r != CUDA_SUCCESS) return drv_fail(drv, "cuDeviceGet", r);
  int vmm = 0;
  int posix_fd = 0;
  drv.deviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
  drv.deviceGetAttribute(&posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                         dev);
  if (vmm == 0) {
    return fail("device " + std::to_string(device.ordinal) +
                " does not support virtual memory management (cuMemCreate)");
  }
  if (posix_fd == 0) {
    return fail("handle type not supported: device " + std::to_string(device.ordinal) +
                " cannot export memory as POSIX file descriptors (try backend cuda-ipc)");
  }
  auto api = std::make_shared<CudaVmm>(drv, device.ordinal, 0);
  CUmemAllocationProp prop = api->properties();
  size_t granularity = 0;
  r = drv.memGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || granularity == 0) {
    return drv_fail(drv, "cuMemGetAllocationGranularity", r);
  }
  return std::shared_ptr<VmmApi>(std::make_shared<CudaVmm>(drv, device.ordinal, granularity));
}

wire::Result<IpcSegment> ipc_allocate(uint64_t bytes) {
  IpcSegment s;
  cudaError_t e = cudaMalloc(&s.ptr, bytes);
  if (e == cudaErrorMemoryAllocation) {
    return fail("out of device memory: cudaMalloc of " + std::to_string(bytes) + " bytes (" +
                rt_text(e) + ")");
  }
  if (e != cudaSuccess)
    return fail("cudaMalloc of " + std::to_string(bytes) + " bytes: " + rt_text(e));
  cudaIpcMemHandle_t h{};
  if ((e = cudaIpcGetMemHandle(&h, s.ptr)) != cudaSuccess) {
    cudaFree(s.ptr);
    return fail("handle type not supported: cudaIpcGetMemHandle: " + rt_text(e));
  }
  s.handle.assign(reinterpret_cast<const uint8_t*>(&h),
                  reinterpret_cast<const uint8_t*>(&h) + sizeof h);
  return s;
}

void ipc_free(void* ptr) {
  cudaFree(ptr);
}

wire::Result<void*> ipc_open(std::span<const uint8_t> handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return wire::Error{Status(Errc::invalid_argument),
                       "a CUDA IPC handle is " + std::to_string(sizeof(cudaIpcMemHandle_t)) +
                           " bytes, the daemon sent " + std::to_string(handle.size())};
  }
  std::lock_guard lock(ipc_mutex());
  const std::string key(reinterpret_cast<const char*>(handle.data()), handle.size());
  IpcOpen& o = ipc_opens()[key];
  if (o.refs == 0) {
    cudaIpcMemHandle_t h{};
    std::memcpy(&h, handle.data(), sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(&o.ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      ipc_opens().erase(key);
      return fail("cudaIpcOpenMemHandle: " + rt_text(e));
    }
  }
  ++o.refs;
  return o.ptr;
}

void ipc_close(void* ptr) {
  std::lock_guard lock(ipc_mutex());
  for (auto it = ipc_opens().begin(); it != ipc_opens().end(); ++it) {
    if (it->second.ptr != ptr) continue;
    if (--it->second.refs == 0) {
      cudaIpcCloseMemHandle(ptr);
      ipc_opens().erase(it);
    }
    return;
  }
}

}  // namespace kvpool::device

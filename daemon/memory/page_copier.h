// PageCopier: how the daemon copies pages inside a pool's memory (copy-on-write, moves), with the
// copy-pages kernel of kernels/, and converts them into another pool's precision (convert-pages):
// on the CPU for host memory, on the daemon's own CUDA stream for device memory. A copy is
// synchronous: the call returns when the bytes are in place, so the reply that follows tells the
// worker the destination is ready. Requests are bounded by wire::kMaxCopyBytes, which keeps a copy
// short next to the event loop's other work (1 GiB is about 0.3 ms of HBM bandwidth on an H200,
// longer on a CPU).
//
// Error policy: returns "" or the kernel's or CUDA's error text. Thread-safety: one caller at a
// time (the event loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/wire/protocol.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

class PageCopier {
 public:
  virtual ~PageCopier() = default;
  virtual std::string copy(const kernels::CopyPagesArgs& args, uint32_t num_pages) = 0;
  // convert_pages between two pools of the device (PoolMemory::convert_pages); ids on the host.
  virtual std::string convert(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                              uint32_t dst_num_pages) = 0;
};

std::unique_ptr<PageCopier> make_host_copier();
// On CUDA device `device` (made current), with its own stream and staging buffers for the page
// lists. Only in builds with CUDA.
wire::Result<std::unique_ptr<PageCopier>> make_cuda_copier(int device);

}  // namespace kvpool::daemon

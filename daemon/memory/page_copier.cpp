#include "daemon/memory/page_copier.h"

#include "kernels/cpu/kernels_cpu.h"

namespace kvpool::daemon {

namespace {

class HostCopier final : public PageCopier {
 public:
  std::string copy(const kernels::CopyPagesArgs& args, uint32_t num_pages) override {
    return kernels::cpu::copy_pages(args, num_pages);
  }
  std::string convert(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                      uint32_t dst_num_pages) override {
    return kernels::cpu::convert_pages(args, src_num_pages, dst_num_pages);
  }
};

}  // namespace

std::unique_ptr<PageCopier> make_host_copier() {
  return std::make_unique<HostCopier>();
}

#ifndef KVPOOL_WITH_CUDA
wire::Result<std::unique_ptr<PageCopier>> make_cuda_copier(int) {
  return wire::Error{Status(Errc::internal), "this kvpoold was built without CUDA"};
}
#endif

}  // namespace kvpool::daemon

// kvpool_gpu_check: the kernel check (tests/gpu/kernel_check.h) and the decode bandwidth table.
//
//   kvpool_gpu_check --tests [--verbose]     the CUDA kernels against the CPU kernels
//   kvpool_gpu_check --bench                 decode bandwidth next to device copy bandwidth
//   kvpool_gpu_check --tests --stand-in cpu [--inject-fault decode|extend|append|copy|convert]
//                                            the same matrix with the CPU kernels standing in
//                                            for the CUDA ones: no GPU needed (CI runs it)
// tests/gpu/run.sh runs --tests and --bench as separate processes, each under its own timeout.
//
// Exit status: 0 every comparison held; 1 a comparison failed or a CUDA call failed; 2 bad
// usage; 77 no GPU here: no NVIDIA device node (/dev/nvidiactl, /dev/nvidia0) and no usable CUDA
// device, or a build without CUDA. With a device node present, a CUDA runtime that cannot use the
// device (old driver, no permission) is a failure, never a skip.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/kernel_check.h"
#ifdef KVPOOL_GPU_CHECK_CUDA
#include "tests/gpu/cuda_target.h"
#endif

namespace {

constexpr const char* kUsage =
    "usage: kvpool_gpu_check [--tests] [--bench] [--verbose] [--dtype LIST] [--sample K]\n"
    "                        [--stand-in cpu] [--inject-fault decode|extend|append|copy|convert]\n"
    "                        [--version]\n"
    "  --tests          the kernel matrix: every kernel against the CPU kernels (default: both)\n"
    "  --dtype LIST     only these KV dtypes' cases (comma-separated: bf16,fp16,fp8_e4m3,int8)\n"
    "  --sample K       every K-th attention case only (append, copy and convert always run)\n"
    "  --bench          the decode bandwidth table (GPU only)\n"
    "  --verbose        a line per comparison (otherwise only FAILED lines and the verdict)\n"
    "  --stand-in cpu   run the matrix with the CPU kernels standing in for the CUDA ones\n"
    "  --inject-fault K with --stand-in: a deliberate off-by-one in kernel K, which must fail\n";

// A comma-separated list of dtype names.
bool parse_dtypes(const std::string& list, std::vector<kvpool::KvDtype>& out) {
  size_t from = 0;
  while (from <= list.size()) {
    const size_t to = std::min(list.find(',', from), list.size());
    const auto dt = kvpool::parse_dtype(list.substr(from, to - from));
    if (!dt) return false;
    out.push_back(*dt);
    from = to + 1;
  }
  return !out.empty();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvpool::gpu_check;
  bool tests = false;
  bool bench = false;
  bool verbose = false;
  bool stand_in = false;
  Fault fault = Fault::none;
  MatrixSelection selection;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tests") {
      tests = true;
    } else if (a == "--bench") {
      bench = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else if (a == "--stand-in" && i + 1 < argc && std::strcmp(argv[i + 1], "cpu") == 0) {
      stand_in = true;
      ++i;
    } else if (a == "--dtype" && i + 1 < argc) {
      if (!parse_dtypes(argv[++i], selection.dtypes)) {
        std::fprintf(stderr, "kvpool_gpu_check: --dtype takes bf16, fp16, fp8_e4m3, int8\n");
        return 2;
      }
    } else if (a == "--sample" && i + 1 < argc) {
      const long k = std::strtol(argv[++i], nullptr, 10);
      if (k < 1 || k > 1000) {
        std::fprintf(stderr, "kvpool_gpu_check: --sample takes 1 to 1000\n");
        return 2;
      }
      selection.sample = static_cast<uint32_t>(k);
    } else if (a == "--inject-fault" && i + 1 < argc && parse_fault(argv[i + 1], fault)) {
      ++i;
    } else if (a == "--version") {
      std::printf("kvpool_gpu_check (kvpool)%s\n",
#ifdef KVPOOL_GPU_CHECK_CUDA
                  " with CUDA"
#else
                  " without CUDA"
#endif
      );
      return 0;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "kvpool_gpu_check: unknown argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (!tests && !bench) tests = bench = true;
  if (stand_in && bench) {
    std::fprintf(stderr, "kvpool_gpu_check: --bench needs a GPU; the stand-in runs --tests\n");
    return 2;
  }
  if (fault != Fault::none && !stand_in) {
    std::fprintf(stderr, "kvpool_gpu_check: --inject-fault needs --stand-in cpu\n");
    return 2;
  }
  if (stand_in) {
    auto target = make_cpu_stand_in(fault);
    return run_kernel_matrix(*target, verbose, selection) == 0 ? 0 : 1;
  }
#ifdef KVPOOL_GPU_CHECK_CUDA
  std::string device;
  std::string err;
  auto target = make_cuda_target(device, err);
  if (target == nullptr) {
    if (!nvidia_device_node_present()) {
      std::printf("kvpool_gpu_check: no NVIDIA device node and %s: GPU checks skipped\n",
                  err.c_str());
      return 77;
    }
    std::printf("kvpool_gpu_check: FAILED: an NVIDIA device node is present but %s\n", err.c_str());
    return 1;
  }
  std::printf("device: %s\n", device.c_str());
  std::fflush(stdout);
  int rc = 0;
  if (tests && run_kernel_matrix(*target, verbose, selection) != 0) rc = 1;
  if (bench && run_cuda_bench() != 0) rc = 1;
  return rc;
#else
  if (nvidia_device_node_present()) {
    std::printf(
        "kvpool_gpu_check: FAILED: built without CUDA beside an NVIDIA GPU (build with "
        "scripts/build-gpu.sh)\n");
    return 1;
  }
  std::printf("kvpool_gpu_check: built without CUDA; only --stand-in cpu runs: skipped\n");
  return 77;
#endif
}

// The kernel check's matrix: every kernel of kvpool run on a target (the CUDA kernels on a GPU,
// or the CPU kernels standing in for them) and compared with the CPU kernels run on the host over
// the same pool. Cases cover every KV dtype, both layouts, head dims 64/128/256, query groups 1 to
// 8 (with the padded buckets 2, 3, 5), page sizes 8/16/32, ragged last pages, long contexts and
// forced split-KV chunks, for decode and extend (with and without a cached prefix); then append
// and copy-pages, byte for byte against the CPU's.
//
// Error policy: nothing here exits. An error from the target (an allocation, a copy back to the
// host, a launch, a synchronisation) fails the case it belongs to with the target's message, and
// the matrix goes on to the next case: a GPU fault is reported as FAILED lines, never as a pass,
// and never costs the cases before it. Results are compared only after the copy back succeeded,
// so two untouched buffers can never compare equal by accident (outputs start as NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/paged_kv.h"
#include "tests/gpu/gpu_presence.h"

namespace kvpool::gpu_check {

// Where the kernels under test run. Pointers it hands out are its own memory ("device" memory);
// every call returns "" or a message naming what failed. Not thread-safe; one check at a time.
class KernelTarget {
 public:
  virtual ~KernelTarget() = default;
  virtual std::string name() const = 0;

  virtual std::string alloc(void** ptr, size_t bytes) = 0;
  virtual void release(void* ptr) = 0;  // nullptr is ignored
  virtual std::string upload(void* dst, const void* src, size_t bytes) = 0;
  virtual std::string download(void* dst, const void* src, size_t bytes) = 0;
  virtual std::string fill(void* dst, int byte, size_t bytes) = 0;
  // Waits for every launch so far; their error, if any.
  virtual std::string synchronize() = 0;

  // num_pages: the pool's page count (the CPU kernels check page ids against it).
  virtual size_t decode_workspace_bytes(const kernels::DecodeArgs& a, uint32_t max_context) = 0;
  virtual std::string decode(const kernels::DecodeArgs& a, uint32_t max_context, uint32_t num_pages,
                             void* workspace, size_t workspace_bytes) = 0;
  virtual std::string extend(const kernels::ExtendArgs& a, uint32_t total_new_tokens,
                             uint32_t num_pages) = 0;
  virtual std::string append_kv(const kernels::AppendArgs& a, uint32_t num_pages) = 0;
  virtual std::string copy_pages(const kernels::CopyPagesArgs& a, uint32_t num_pages) = 0;
  virtual std::string convert_pages(const kernels::ConvertPagesArgs& a, uint32_t src_pages,
                                    uint32_t dst_pages) = 0;
};

// A deliberate bug in the CPU stand-in, to show that the matrix fails when a kernel is wrong:
// decode and extend read one token fewer of the longest context in each call, append writes
// each token one slot later, copy and convert write each page one page later.
enum class Fault : uint8_t { none, decode, extend, append, copy, convert };

// Parses "none", "decode", "extend", "append", "copy", "convert"; false for anything else.
bool parse_fault(const std::string& text, Fault& out);

// The CPU kernels as a target, over host memory. Decode runs the portable inner loops (the
// reference takes AVX2 where the CPU has it), so the stand-in matrix also compares the two.
std::unique_ptr<KernelTarget> make_cpu_stand_in(Fault fault);

// Which share of the matrix to run: every case, or those of `dtypes` when it is not empty, and of
// those every `sample`-th attention case (append and copy always run).
struct MatrixSelection {
  std::vector<KvDtype> dtypes;
  uint32_t sample = 1;
};

// Runs the matrix on `target`. Prints a FAILED line for every failed comparison or error, and
// with `verbose` one line per comparison; ends with "GPU TESTS PASSED: N comparisons" or "GPU
// TESTS FAILED: k of N comparisons". Returns the number of failures.
int run_kernel_matrix(KernelTarget& target, bool verbose, const MatrixSelection& selection = {});

}  // namespace kvpool::gpu_check

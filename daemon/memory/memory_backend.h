// Memory backends: where a pool's pages live, behind one narrow interface (after mimalloc's
// prim.h): create a pool's memory, say how a worker reaches it, copy pages inside it, release it.
//
// Backends (DESIGN §2):
//   host         POSIX shared memory (Boost.Interprocess), one segment, its fd sent over
//                SCM_RIGHTS. The default where no GPU is usable.
//   cuda-vmm     cuMemCreate segments with POSIX-fd handles (vmm_backend.h over CudaVmm).
//   cuda-ipc     one cudaMalloc segment per pool and its cudaIpcMemHandle (cuda_ipc_backend.h).
//   fake-device  the cuda-vmm sequence on memfd memory (vmm_backend.h over MemfdVmm), for tests:
//                never picked by auto.
// A pool's memory is [num_pages × page_stride bytes of pages][num_pages × page_scale_bytes of
// scales], in one or more segments that every process maps back to back, so a page's address is
// base + page · page_stride everywhere. The daemon maps it too, for its page copies.
//
// Elastic pools (create_elastic): the memory is a reserved virtual range laid out as
//   [pages region: from 0, mapped by whole segments back to back][scales region, mapped whole]
// Growing maps one more pages segment right after the mapped ones, shrinking unmaps the last;
// the base never moves, so `base + page · page_stride` stays valid for every page still there.
// Segments carry their offset (SegmentInfo::offset); a worker reserves reserved_bytes() and maps
// each at its offset. Backends with descriptors (host, cuda-vmm, fake-device) support it.
//
// The slow half of a resize is the memory itself (creating a 64 MiB segment zeroes it: ~16 ms on
// a CPU backend; giving it back takes about as long), so growth comes in steps that let it leave
// the event loop: plan_growth() (the loop: where the next segment goes), make_growth() (any
// thread: creates and exports it), commit_growth() (the loop: maps it, cheap). shrink_segment()
// can likewise hand the segment's memory to the caller as a LooseSegment, released off the loop.
//
// Error policy: create() returns an Error naming the cause (the failing call, sizes and the
// system's or CUDA's text); nothing throws out of a backend. Thread-safety: the event loop owns
// the backend and its pools' memory.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "common/device/vmm.h"
#include "common/wire/protocol.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

// Where an elastic pool's memory goes inside its reservation. Every size and offset is a
// multiple of the backend's granularity.
struct ElasticLayout {
  uint64_t reserve_bytes = 0;        // the whole virtual range
  uint64_t pages_region_bytes = 0;   // [0, this): pages, mapped by segments from offset 0
  uint64_t scales_offset = 0;        // ≥ pages_region_bytes
  uint64_t scales_bytes = 0;         // 0: no scales region
  uint64_t segment_bytes = 0;        // the growth unit (the last segment of the region may be less)
  uint64_t initial_pages_bytes = 0;  // a multiple of segment_bytes (or the whole region), > 0
};

// A segment's memory outside any mapping: a VmmApi handle and the descriptor exported for it.
// Destroying it gives the memory back (VmmApi::discard first, so that workers still mapping a
// segment the pool let go of keep nothing). Move-only; any thread.
class LooseSegment {
 public:
  LooseSegment() = default;
  LooseSegment(std::shared_ptr<device::VmmApi> api, device::VmmHandle handle, int fd,
               uint64_t offset, uint64_t bytes)
      : api_(std::move(api)), handle_(handle), fd_(fd), offset_(offset), bytes_(bytes) {}
  LooseSegment(LooseSegment&& o) noexcept { *this = std::move(o); }
  LooseSegment& operator=(LooseSegment&& o) noexcept;
  ~LooseSegment() { reset(); }

  bool empty() const { return api_ == nullptr; }
  uint64_t offset() const { return offset_; }
  uint64_t bytes() const { return bytes_; }
  // Hands the handle and descriptor over (the object is empty afterwards).
  std::pair<device::VmmHandle, int> take();
  void reset();

 private:
  std::shared_ptr<device::VmmApi> api_;
  device::VmmHandle handle_ = 0;
  int fd_ = -1;
  uint64_t offset_ = 0;
  uint64_t bytes_ = 0;
};

// One step of growth (see above): where the next pages segment goes and, once made, its memory.
struct Growth {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  LooseSegment memory;  // set by make_growth()
  std::string error;    // make_growth()'s failure, named
};

class PoolMemory {
 public:
  virtual ~PoolMemory() = default;
  // Bytes mapped in all (the segments' sum).
  virtual uint64_t bytes() const = 0;
  // The daemon's own mapping of the memory (a device pointer for the CUDA backends).
  virtual std::byte* base() const = 0;
  // What a worker needs to map the memory, in mapping order (PoolInfo::segments).
  virtual const std::vector<wire::SegmentInfo>& segments() const = 0;
  // One descriptor per segment, sent with the hello reply; empty when the backend hands memory
  // over another way. Owned by this object.
  virtual const std::vector<int>& fds() const = 0;
  // Copies pages (all layers, K and V or a latent pool's vectors, and their scales) src[i] → dst[i]
  // on the daemon's own stream and waits for the copy; `args.kv` is filled in by the caller from
  // base(). Returns "" or the error text.
  virtual std::string copy_pages(const kernels::CopyPagesArgs& args, uint32_t num_pages) = 0;
  // Re-encodes whole pages of `args.src` (this memory) into pages of `args.dst` (another pool's
  // memory on the same device, usually 8-bit) with the convert-pages kernel, on the same stream,
  // and waits; the ids are host arrays, bounded by src_num_pages / dst_num_pages. "" or the error.
  virtual std::string convert_pages(const kernels::ConvertPagesArgs& args, uint32_t src_num_pages,
                                    uint32_t dst_num_pages) = 0;

  // Elastic pools (see above); a fixed pool answers false, its bytes, and refuses to resize.
  virtual bool elastic() const { return false; }
  // The virtual range a worker reserves: bytes() for a fixed pool.
  virtual uint64_t reserved_bytes() const { return bytes(); }
  // Bytes of the pages region mapped now, from offset 0: bytes() for a fixed pool (its scales
  // follow its pages inside bytes()).
  virtual uint64_t pages_bytes_mapped() const { return bytes(); }
  // Creates, exports and maps one more pages segment right after the mapped ones (segments()
  // and fds() gain it, in offset order). invalid_argument when the pages region is full or the
  // memory is not there (VmmApi::why_no_room is asked first); nothing changes on failure. The
  // three growth steps below, in one call.
  wire::Result<bool> grow_segment();
  // Unmaps and releases the last pages segment and closes its descriptor. The scales segment
  // and the first pages segment always stay: invalid_argument when only one pages segment is
  // left. With `loose`, the memory goes there instead, for the caller to release off the loop;
  // either way workers that still map it keep nothing once it is released (host memory; on
  // CUDA they keep it until they unmap it).
  virtual wire::Result<bool> shrink_segment(LooseSegment* loose = nullptr);
  // Growth in steps (see above). plan_growth: the next segment's place, or why there is none
  // (the errors of grow_segment; `check_room`: whether the memory is there now, which the
  // caller may leave to make_growth when memory is being given back meanwhile); `after`: bytes
  // already planned past the end (several segments made in one go). make_growth: any thread,
  // touches nothing of this object but its backend's stateless primitives. commit_growth: maps
  // it at the pool's end, which may have moved since the plan as long as a segment there has
  // the same size; else invalid_argument, and g.memory stays the caller's to release.
  virtual wire::Result<Growth> plan_growth(uint64_t after = 0, bool check_room = true) const;
  virtual void make_growth(Growth& g) const;
  virtual wire::Result<bool> commit_growth(Growth& g);
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual std::string_view name() const = 0;
  // Bytes a new pool could take now (for capacities given as a fraction).
  virtual uint64_t available_bytes() const = 0;
  // Segment sizes are rounded up to this.
  virtual uint64_t granularity() const = 0;
  // The CUDA device (ordinal and UUID) the memory is on; −1 and zeros for host memory.
  virtual int device() const { return -1; }
  virtual std::array<uint8_t, 16> device_uuid() const { return {}; }
  // A pool's memory of at least `bytes`, in segments of at most `max_segment_bytes` (0: one).
  virtual wire::Result<std::unique_ptr<PoolMemory>> create(uint64_t bytes,
                                                           uint64_t max_segment_bytes,
                                                           std::string_view label) = 0;
  // An elastic pool's memory: the reservation, the scales region and initial_pages_bytes of
  // pages. invalid_argument for a layout that does not fit together or a backend without
  // elastic pools (cuda-ipc).
  virtual wire::Result<std::unique_ptr<PoolMemory>> create_elastic(const ElasticLayout& layout,
                                                                   std::string_view label);
};

// Picks a backend by config name ("auto", "host", "cuda-vmm", "cuda-ipc", "fake-device") for
// CUDA device `device`. auto tries cuda-vmm, then cuda-ipc, then host; `why` receives a line for
// the log saying what was chosen and why (what each refused candidate answered). A named CUDA
// backend that cannot be used is an Error naming the cause.
wire::Result<std::unique_ptr<MemoryBackend>> make_backend(std::string_view name, int device,
                                                          std::string& why);

// `bytes` rounded up to a multiple of `granularity` (> 0).
constexpr uint64_t round_up(uint64_t bytes, uint64_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}

// What an elastic layer_major pool's segments are whole multiples of (kernels/paged_kv.h,
// segmented): the backend's granularity and one plane block (tokens_per_page · kv_heads ·
// head_dim elements), so that engines can view each layer's planes as one tensor of blocks.
inline uint64_t layer_major_segment_unit(const Geometry& g, uint64_t granularity) {
  const uint64_t block = page_data_bytes(g) / (uint64_t{kv_planes(g)} * g.layers);
  return std::lcm(granularity, block);
}

// Segment sizes for `bytes` of pool: each a multiple of `granularity`, at most
// `max_segment_bytes` (rounded down to the granularity, 0 = unlimited), covering `bytes`.
std::vector<uint64_t> plan_segments(uint64_t bytes, uint64_t granularity,
                                    uint64_t max_segment_bytes);

}  // namespace kvpool::daemon

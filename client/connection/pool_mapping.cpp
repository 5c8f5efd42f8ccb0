#include "client/connection/pool_mapping.h"

#include <sys/stat.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/device/memfd_vmm.h"
#include "common/device/vmm.h"
#include "kernels/pool_view.h"
#ifdef KVPOOL_WITH_CUDA
#include "common/device/cuda_device.h"
#endif

namespace kvpool::client {

namespace {

wire::Error fail(const wire::PoolInfo& pool, std::string why) {
  return wire::Error{Status(Errc::internal), "cannot map pool " + pool.pool_name + " (backend " +
                                                 pool.backend + "): " + std::move(why)};
}

bool is_memfd_backend(const std::string& backend) {
  return backend == "host" || backend == "fake-device";
}

// "" when the segment list is one a worker can map, else why not.
std::string why_unmappable(const wire::PoolInfo& pool, size_t fd_count, bool needs_fds) {
  const auto& segs = pool.segments;
  if (segs.empty()) return "the pool has no segments";
  if (needs_fds && fd_count != segs.size()) {
    return "received " + std::to_string(fd_count) + " segment descriptors for " +
           std::to_string(segs.size()) + " segments";
  }
  std::vector<const wire::SegmentInfo*> by_offset;
  uint64_t total = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const wire::SegmentInfo& s = segs[i];
    const std::string name = "segment " + std::to_string(i) + " (offset " +
                             std::to_string(s.offset) + ", " + std::to_string(s.bytes) + " bytes)";
    if (s.bytes == 0) return name + " is empty";
    if (s.offset > pool.reserved_bytes || s.bytes > pool.reserved_bytes - s.offset) {
      return name + " lies outside the reservation of " + std::to_string(pool.reserved_bytes) +
             " bytes";
    }
    total += s.bytes;  // cannot wrap: each segment lies inside the reservation without overlap
    by_offset.push_back(&s);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    if (by_offset[i]->offset < prev->offset + prev->bytes) {
      return "the segments at offsets " + std::to_string(prev->offset) + " and " +
             std::to_string(by_offset[i]->offset) + " overlap";
    }
  }
  if (total != pool.segment_bytes) {
    return std::to_string(segs.size()) + " segments of " + std::to_string(total) +
           " bytes for a pool of " + std::to_string(pool.segment_bytes);
  }
  // Whether [lo, hi) is mapped: covered by segments, back to back.
  auto covered = [&](uint64_t lo, uint64_t hi) {
    for (const auto* s : by_offset) {
      if (lo >= hi) break;
      if (s->offset > lo) return false;
      if (s->offset + s->bytes > lo) lo = s->offset + s->bytes;
    }
    return lo >= hi;
  };
  if (!kernels::segments_fit(kernels::paged_kv_of(pool, nullptr))) {
    return "segments of " + std::to_string(pool.segment_pages) + " pages " +
           std::to_string(pool.segment_stride) +
           " bytes apart do not hold every layer's planes in whole blocks";
  }
  const uint64_t pages_end = kernels::pages_extent(pool);
  if (!covered(0, pages_end)) {
    return std::to_string(pool.num_pages) + " pages of " + std::to_string(pool.page_stride) +
           " bytes are not all inside the mapped segments";
  }
  const uint64_t scale_bytes = page_scale_bytes(pool.geometry);
  if (scale_bytes > 0 && pool.num_pages > 0) {
    const uint64_t scales_end = pool.scales_offset + uint64_t{pool.num_pages} * scale_bytes;
    if (pool.scales_offset < pages_end || !covered(pool.scales_offset, scales_end)) {
      return "the scales of " + std::to_string(pool.num_pages) + " pages at offset " +
             std::to_string(pool.scales_offset) +
             " are not inside the mapped segments, after "
             "the pages";
    }
  }
  return {};
}

// What tells one segment's memory from another's, beyond its offset and size: the file a memfd
// descriptor names (a segment shrunk away and grown back at the same offset is another file).
struct FileId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  friend bool operator==(const FileId&, const FileId&) = default;
};

FileId file_id(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  return FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

class VmmPoolMapping final : public PoolMapping {
 public:
  VmmPoolMapping(std::unique_ptr<device::VmmMapping> m, int device, bool memfd)
      : m_(std::move(m)), device_(device), memfd_(memfd) {}
  std::byte* base() const override { return m_->base(); }
  uint64_t bytes() const override { return m_->bytes(); }
  int device() const override { return device_; }

  // Records what identifies each mapped segment (after map()).
  void remember(const wire::PoolInfo& pool, std::span<const int> fds) {
    known_.clear();
    for (size_t i = 0; i < pool.segments.size(); ++i)
      known_.push_back(Known{pool.segments[i], memfd_ ? file_id(fds[i]) : FileId{}});
  }

  wire::Result<bool> update(const wire::PoolInfo& pool, std::span<const int> fds) override {
    if (std::string why = why_unmappable(pool, fds.size(), true); !why.empty()) {
      return fail(pool, std::move(why));
    }
    if (pool.reserved_bytes != m_->bytes()) {
      return fail(pool, "the reservation changed from " + std::to_string(m_->bytes()) + " to " +
                            std::to_string(pool.reserved_bytes) + " bytes");
    }
    std::vector<Known> now;
    for (size_t i = 0; i < pool.segments.size(); ++i)
      now.push_back(Known{pool.segments[i], memfd_ ? file_id(fds[i]) : FileId{}});
    auto contains = [](const std::vector<Known>& list, const Known& k) {
      return std::find(list.begin(), list.end(), k) != list.end();
    };
    bool changed = false;
    // Gone first: a new segment may take the place of one that left.
    std::vector<Known> kept;
    for (const Known& k : known_) {
      if (contains(now, k)) {
        kept.push_back(k);
        continue;
      }
      auto u = m_->unmap_at(k.segment.offset);
      if (!u.ok()) return fail(pool, u.error().message);
      changed = true;
    }
    known_ = std::move(kept);
    for (size_t i = 0; i < now.size(); ++i) {
      if (contains(known_, now[i])) continue;
      auto mapped = m_->import_at(fds[i], now[i].segment.offset, now[i].segment.bytes);
      if (!mapped.ok()) return fail(pool, mapped.error().message);
      known_.push_back(now[i]);
      changed = true;
    }
    return changed;
  }

 private:
  struct Known {
    wire::SegmentInfo segment;
    FileId file;
    friend bool operator==(const Known&, const Known&) = default;
  };
  std::unique_ptr<device::VmmMapping> m_;
  int device_;
  bool memfd_;
  std::vector<Known> known_;  // the segments mapped now
};

// Reserves the pool's range and maps each descriptor at its segment's offset.
wire::Result<std::unique_ptr<PoolMapping>> map_vmm(const wire::PoolInfo& pool,
                                                   std::span<const int> fds,
                                                   std::shared_ptr<device::VmmApi> api,
                                                   int device) {
  std::vector<uint64_t> sizes;
  std::vector<uint64_t> offsets;
  for (const wire::SegmentInfo& s : pool.segments) {
    sizes.push_back(s.bytes);
    offsets.push_back(s.offset);
  }
  auto m = device::import_and_map_at(std::move(api), pool.reserved_bytes, fds, sizes, offsets);
  if (!m.ok()) return fail(pool, m.error().message);
  const bool memfd = is_memfd_backend(pool.backend);
  auto out = std::make_unique<VmmPoolMapping>(std::move(m.value()), device, memfd);
  out->remember(pool, fds);
  return std::unique_ptr<PoolMapping>(std::move(out));
}

#ifdef KVPOOL_WITH_CUDA
class IpcPoolMapping final : public PoolMapping {
 public:
  IpcPoolMapping(void* ptr, const wire::PoolInfo& pool, int device)
      : ptr_(ptr), bytes_(pool.segment_bytes), segments_(pool.segments), device_(device) {}
  ~IpcPoolMapping() override { device::ipc_close(ptr_); }
  std::byte* base() const override { return static_cast<std::byte*>(ptr_); }
  uint64_t bytes() const override { return bytes_; }
  int device() const override { return device_; }
  wire::Result<bool> update(const wire::PoolInfo& pool, std::span<const int>) override {
    if (pool.segments == segments_) return false;
    return fail(pool, "a cuda-ipc pool cannot grow or shrink, but its segments changed");
  }

 private:
  void* ptr_;
  uint64_t bytes_;
  std::vector<wire::SegmentInfo> segments_;
  int device_;
};
#endif

}  // namespace

wire::Result<std::unique_ptr<PoolMapping>> PoolMapping::map(const wire::PoolInfo& pool,
                                                            std::span<const int> fds) {
  const bool needs_fds = pool.backend != "cuda-ipc";
  if (std::string why = why_unmappable(pool, fds.size(), needs_fds); !why.empty()) {
    return fail(pool, std::move(why));
  }
  if (is_memfd_backend(pool.backend)) {
    // Host memory: any granularity that divides the segments works; the page size always does.
    return map_vmm(pool, fds,
                   std::make_shared<device::MemfdVmm>(device::MemfdVmm::system_page_size()), -1);
  }
#ifdef KVPOOL_WITH_CUDA
  if (pool.backend == "cuda-vmm" || pool.backend == "cuda-ipc") {
    auto dev = device::find_cuda_device(pool.device_uuid);
    if (!dev.ok()) return fail(pool, dev.error().message);
    if (pool.backend == "cuda-vmm") {
      auto api = device::make_cuda_vmm(dev.value());
      if (!api.ok()) return fail(pool, api.error().message);
      return map_vmm(pool, fds, api.value(), dev.value().ordinal);
    }
    if (pool.segments.size() != 1 || pool.segments[0].offset != 0) {
      return fail(pool, "cuda-ipc pools have one segment, at offset 0");
    }
    auto p = device::ipc_open(pool.segments[0].handle);
    if (!p.ok()) return fail(pool, p.error().message);
    return std::unique_ptr<PoolMapping>(
        std::make_unique<IpcPoolMapping>(p.value(), pool, dev.value().ordinal));
  }
#else
  if (pool.backend == "cuda-vmm" || pool.backend == "cuda-ipc") {
    return fail(pool, "this libkvpool was built without CUDA");
  }
#endif
  return fail(pool, "unknown backend");
}

}  // namespace kvpool::client

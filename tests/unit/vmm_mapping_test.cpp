// VmmMapping with a reservation, over MemfdVmm at a GPU-like 2 MiB granularity: segments mapped
// and unmapped at explicit offsets, the same bytes seen through a second mapping that imports the
// descriptors as a worker does, a segment remapped where one was unmapped, and the errors for
// ranges that cannot take a segment.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/device/memfd_vmm.h"
#include "common/device/vmm.h"

namespace kvpool::device {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kSeg = 2 * kMiB;

// A fresh segment and a descriptor for it (the caller closes the descriptor).
struct Made {
  VmmHandle handle = 0;
  int fd = -1;
};
Made make_segment(VmmApi& api, uint64_t bytes) {
  auto h = api.create(bytes);
  EXPECT_TRUE(h.ok()) << h.error().message;
  auto fd = api.export_fd(h.value());
  EXPECT_TRUE(fd.ok()) << fd.error().message;
  return {h.value(), fd.value()};
}

void fill(std::byte* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 4096)
    p[i] = std::byte(static_cast<uint8_t>(seed + i / 4096));
}
bool holds(const std::byte* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 4096) {
    if (p[i] != std::byte(static_cast<uint8_t>(seed + i / 4096))) return false;
  }
  return true;
}

TEST(VmmMapping, SegmentsAtOffsetsAreSharedWithAnImportingMapping) {
  auto api = std::make_shared<MemfdVmm>(kSeg);
  auto m = VmmMapping::reserve(api, 8 * kMiB);
  ASSERT_TRUE(m.ok()) << m.error().message;
  VmmMapping& daemon = *m.value();
  EXPECT_EQ(daemon.bytes(), 8 * kMiB);
  EXPECT_EQ(daemon.mapped_bytes(), 0u);

  const Made a = make_segment(*api, kSeg);
  const Made b = make_segment(*api, kSeg);
  ASSERT_TRUE(daemon.map_at(0, kSeg, a.handle).ok());
  ASSERT_TRUE(daemon.map_at(kSeg, kSeg, b.handle).ok());
  EXPECT_EQ(daemon.mapped_bytes(), 2 * kSeg);
  ASSERT_EQ(daemon.segments().size(), 2u);
  EXPECT_EQ(daemon.segments()[1].offset, kSeg);
  fill(daemon.base(), 2 * kSeg, 7);

  // A worker: its own reservation of the same size, the descriptors at the same offsets.
  const int fds[] = {a.fd, b.fd};
  const uint64_t sizes[] = {kSeg, kSeg};
  const uint64_t offsets[] = {0, kSeg};
  auto w = import_and_map_at(api, 8 * kMiB, fds, sizes, offsets);
  ASSERT_TRUE(w.ok()) << w.error().message;
  VmmMapping& worker = *w.value();
  EXPECT_TRUE(holds(worker.base(), 2 * kSeg, 7));
  worker.base()[kSeg + 5] = std::byte{0x5A};
  EXPECT_EQ(daemon.base()[kSeg + 5], std::byte{0x5A});

  // The last segment goes and a new one takes its place; the worker keeps the old memory.
  ASSERT_TRUE(daemon.unmap_at(kSeg).ok());
  EXPECT_EQ(daemon.mapped_bytes(), kSeg);
  EXPECT_EQ(worker.base()[kSeg + 5], std::byte{0x5A});
  const Made c = make_segment(*api, kSeg);
  ASSERT_TRUE(daemon.map_at(kSeg, kSeg, c.handle).ok());
  EXPECT_EQ(daemon.base()[kSeg + 5], std::byte{0});  // fresh memory
  EXPECT_EQ(daemon.base()[2 * kSeg - 1], std::byte{0});
  fill(daemon.base() + kSeg, kSeg, 9);
  ASSERT_TRUE(worker.unmap_at(kSeg).ok());
  ASSERT_TRUE(worker.import_at(c.fd, kSeg, kSeg).ok());
  EXPECT_TRUE(holds(worker.base() + kSeg, kSeg, 9));
  EXPECT_TRUE(holds(worker.base(), kSeg, 7));

  // A segment past a gap, then the gap filled.
  const Made d = make_segment(*api, 2 * kSeg);
  ASSERT_TRUE(daemon.map_at(2 * kSeg, 2 * kSeg, d.handle).ok());
  EXPECT_EQ(daemon.mapped_bytes(), 8 * kMiB);
  fill(daemon.base() + 2 * kSeg, 2 * kSeg, 11);
  EXPECT_TRUE(holds(daemon.base(), kSeg, 7));
  for (const Made& x : {a, b, c, d})
    ::close(x.fd);
}

TEST(VmmMapping, RangesThatCannotTakeASegmentAreRefusedAndChangeNothing) {
  auto api = std::make_shared<MemfdVmm>(kSeg);
  EXPECT_FALSE(VmmMapping::reserve(api, 0).ok());
  auto r = VmmMapping::reserve(api, 3 * kMiB);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("granularity"), std::string::npos) << r.error().message;

  auto m = VmmMapping::reserve(api, 8 * kMiB);
  ASSERT_TRUE(m.ok());
  VmmMapping& map = *m.value();
  ASSERT_TRUE(map.map_at(kSeg, 2 * kSeg, make_segment(*api, 2 * kSeg).handle).ok());

  struct Case {
    uint64_t offset, bytes;
    const char* says;
  };
  for (const Case& c : {Case{0, 2 * kSeg,
                             "overlaps the mapped segment of 4194304 bytes at "
                             "offset 2097152"},
                        Case{2 * kSeg, kSeg, "overlaps"},
                        Case{3 * kSeg, 2 * kSeg, "ends past the reservation of 8388608 bytes"},
                        Case{8 * kMiB, kSeg, "ends past"}, Case{kMiB, kSeg, "not aligned"},
                        Case{0, kMiB, "not aligned"}}) {
    SCOPED_TRACE(std::to_string(c.offset) + " +" + std::to_string(c.bytes));
    const Made s = make_segment(*api, kSeg);
    ::close(s.fd);
    auto mapped = map.map_at(c.offset, c.bytes, s.handle);  // released on failure
    ASSERT_FALSE(mapped.ok());
    EXPECT_EQ(mapped.error().status.code(), Errc::invalid_argument);
    EXPECT_NE(mapped.error().message.find(c.says), std::string::npos) << mapped.error().message;
    EXPECT_EQ(map.mapped_bytes(), 2 * kSeg);
    ASSERT_EQ(map.segments().size(), 1u);
  }
  auto gone = map.unmap_at(0);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.error().message.find("no mapped segment starts at offset 0"), std::string::npos);
  // Next to the mapped one on both sides is fine.
  EXPECT_TRUE(map.map_at(0, kSeg, make_segment(*api, kSeg).handle).ok());
  EXPECT_TRUE(map.map_at(3 * kSeg, kSeg, make_segment(*api, kSeg).handle).ok());
  EXPECT_EQ(map.mapped_bytes(), 8 * kMiB);
}

TEST(VmmMapping, MapBackToBackStillWorks) {
  auto api = std::make_shared<MemfdVmm>(kSeg);
  const Made a = make_segment(*api, kSeg);
  const Made b = make_segment(*api, 2 * kSeg);
  const uint64_t sizes[] = {kSeg, 2 * kSeg};
  auto m = VmmMapping::map(api, {a.handle, b.handle}, sizes);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m.value()->bytes(), 3 * kSeg);
  EXPECT_EQ(m.value()->mapped_bytes(), 3 * kSeg);
  fill(m.value()->base(), 3 * kSeg, 3);
  const int fds[] = {a.fd, b.fd};
  auto w = import_and_map(api, fds, sizes);
  ASSERT_TRUE(w.ok()) << w.error().message;
  EXPECT_TRUE(holds(w.value()->base(), 3 * kSeg, 3));
  ::close(a.fd);
  ::close(b.fd);
}

}  // namespace
}  // namespace kvpool::device

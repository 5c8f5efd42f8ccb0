// PoolMapping over memfd segments ("fake-device"): a pool mapped into its reservation at the
// segments' offsets, then updated as an elastic pool grows and shrinks (the base never moves,
// unchanged segments keep their bytes, a segment grown back at an offset is new memory), and the
// segment lists it refuses.

#include "client/connection/pool_mapping.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "common/device/memfd_vmm.h"

namespace kvpool::client {
namespace {

constexpr uint64_t kStride = 4096;  // bytes per page
constexpr uint64_t kSegPages = 4;   // pages per segment
constexpr uint64_t kSeg = kSegPages * kStride;
constexpr uint32_t kMaxPages = 16;  // the reservation's pages region
constexpr uint64_t kReserved = kMaxPages * kStride;

// Segments the "daemon" made: a memfd each, and a descriptor to pass (closed by the destructor).
struct Segment {
  int fd = -1;
  uint64_t offset = 0;
};

class Daemon {
 public:
  Daemon() : api_(std::make_shared<device::MemfdVmm>(device::MemfdVmm::system_page_size())) {}
  ~Daemon() {
    for (const Segment& s : segments_)
      ::close(s.fd);
  }
  // A new segment at `offset` (replacing one there, as a shrink and a grow would).
  void add(uint64_t offset) {
    remove(offset);
    auto h = api_->create(kSeg);
    ASSERT_TRUE(h.ok()) << h.error().message;
    auto fd = api_->export_fd(h.value());
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    api_->release(h.value());  // the exported descriptor keeps the memory
    segments_.push_back(Segment{fd.value(), offset});
  }
  void remove(uint64_t offset) {
    for (auto it = segments_.begin(); it != segments_.end(); ++it) {
      if (it->offset == offset) {
        ::close(it->fd);
        segments_.erase(it);
        return;
      }
    }
  }
  wire::PoolInfo pool() const {
    wire::PoolInfo p;
    p.geometry = Geometry{1, 1, 8, 4, KvDtype::fp16};
    p.pool_name = "elastic";
    p.backend = "fake-device";
    p.page_stride = kStride;
    p.reserved_bytes = kReserved;
    p.scales_offset = kReserved;
    p.max_pages = kMaxPages;
    p.epoch = epoch;
    for (const Segment& s : segments_) {
      p.segments.push_back(wire::SegmentInfo{kSeg, {}, s.offset});
      p.segment_bytes += kSeg;
    }
    p.num_pages = static_cast<uint32_t>(p.segment_bytes / kStride);
    return p;
  }
  std::vector<int> fds() const {
    std::vector<int> out;
    for (const Segment& s : segments_)
      out.push_back(s.fd);
    return out;
  }
  uint32_t epoch = 0;

 private:
  std::shared_ptr<device::MemfdVmm> api_;
  std::vector<Segment> segments_;
};

void fill(std::byte* p, uint8_t seed) {
  for (uint64_t i = 0; i < kSeg; i += 512)
    p[i] = std::byte(static_cast<uint8_t>(seed + i / 512));
}
bool holds(const std::byte* p, uint8_t seed) {
  for (uint64_t i = 0; i < kSeg; i += 512) {
    if (p[i] != std::byte(static_cast<uint8_t>(seed + i / 512))) return false;
  }
  return true;
}

TEST(PoolMapping, GrowsAndShrinksInPlace) {
  Daemon d;
  d.add(0);
  d.add(kSeg);
  auto m = PoolMapping::map(d.pool(), d.fds());
  ASSERT_TRUE(m.ok()) << m.error().message;
  PoolMapping& map = *m.value();
  std::byte* const base = map.base();
  EXPECT_EQ(map.bytes(), kReserved);
  EXPECT_EQ(map.device(), -1);
  fill(base, 1);
  fill(base + kSeg, 2);

  // Grow by one segment: the old ones keep their bytes, the new one is writable.
  d.add(2 * kSeg);
  d.epoch = 1;
  auto u = map.update(d.pool(), d.fds());
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_TRUE(u.value());
  EXPECT_EQ(map.base(), base);
  EXPECT_TRUE(holds(base, 1));
  EXPECT_TRUE(holds(base + kSeg, 2));
  fill(base + 2 * kSeg, 3);
  EXPECT_TRUE(holds(base + 2 * kSeg, 3));

  // The same list again changes nothing.
  u = map.update(d.pool(), d.fds());
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_FALSE(u.value());
  EXPECT_TRUE(holds(base + 2 * kSeg, 3));

  // Shrink by one: the rest is untouched.
  d.remove(2 * kSeg);
  d.epoch = 2;
  u = map.update(d.pool(), d.fds());
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_TRUE(u.value());
  EXPECT_EQ(map.base(), base);
  EXPECT_TRUE(holds(base, 1));
  EXPECT_TRUE(holds(base + kSeg, 2));

  // A segment shrunk away and grown back at the same offset between two updates is new memory
  // (another memfd): its fresh zeros show, not the bytes of the one it replaced.
  fill(base + kSeg, 4);
  d.add(kSeg);
  d.epoch = 4;
  u = map.update(d.pool(), d.fds());
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_TRUE(u.value());
  EXPECT_EQ(base[kSeg], std::byte{0});
  EXPECT_TRUE(holds(base, 1));
}

TEST(PoolMapping, SegmentsMapAtTheirOffsetsNotBackToBack) {
  Daemon d;
  d.add(0);
  d.add(3 * kSeg);  // a hole between them stays reserved
  auto m = PoolMapping::map(d.pool(), d.fds());
  // The pages region is not covered: pages 4..7 lie in the hole.
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("not all inside the mapped segments"), std::string::npos)
      << m.error().message;

  wire::PoolInfo p = d.pool();
  p.num_pages = kSegPages;  // only the first segment's pages are in use
  auto ok = PoolMapping::map(p, d.fds());
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  std::byte* base = ok.value()->base();
  fill(base + 3 * kSeg, 9);
  EXPECT_TRUE(holds(base + 3 * kSeg, 9));
}

TEST(PoolMapping, RefusesBadSegmentLists) {
  Daemon d;
  d.add(0);
  d.add(kSeg);
  const wire::PoolInfo good = d.pool();
  const std::vector<int> fds = d.fds();
  auto expect_refused = [&](const wire::PoolInfo& p, std::span<const int> f, const char* why) {
    auto m = PoolMapping::map(p, f);
    ASSERT_FALSE(m.ok()) << why;
    EXPECT_NE(m.error().message.find(why), std::string::npos) << m.error().message;
    EXPECT_NE(m.error().message.find("fake-device"), std::string::npos) << m.error().message;
  };
  expect_refused(good, std::span(fds).first(1), "received 1 segment descriptors for 2");
  wire::PoolInfo outside = good;
  outside.segments[1].offset = kReserved - kSeg / 2;
  expect_refused(outside, fds, "outside the reservation");
  wire::PoolInfo overlap = good;
  overlap.segments[1].offset = kSeg / 2;
  expect_refused(overlap, fds, "overlap");
  wire::PoolInfo sum = good;
  sum.segment_bytes += 1;
  expect_refused(sum, fds, "for a pool of");
  wire::PoolInfo ragged = good;  // a segmented layer_major pool whose stride splits a block
  ragged.layout = KvLayout::layer_major;
  ragged.segment_pages = 4;
  ragged.segment_stride = 4 * 128 + 2;
  expect_refused(ragged, fds, "whole blocks");

  // update() refuses the same, and a changed reservation, and leaves the mapping as it was.
  auto m = PoolMapping::map(good, fds);
  ASSERT_TRUE(m.ok()) << m.error().message;
  fill(m.value()->base() + kSeg, 5);
  auto u = m.value()->update(overlap, fds);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.error().message.find("overlap"), std::string::npos) << u.error().message;
  wire::PoolInfo bigger = good;
  bigger.reserved_bytes *= 2;
  u = m.value()->update(bigger, fds);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.error().message.find("reservation changed"), std::string::npos) << u.error().message;
  u = m.value()->update(good, std::span(fds).first(1));
  ASSERT_FALSE(u.ok());
  EXPECT_TRUE(holds(m.value()->base() + kSeg, 5));
}

}  // namespace
}  // namespace kvpool::client

// Elastic pool memory (MemoryBackend::create_elastic) on the fake-device backend (MemfdVmm at
// 2 MiB, the cuda-vmm code) and the host backend (memfd at the system page size): growth adds
// pages segments at the right offsets with descriptors, a worker that imports the descriptors at
// their offsets sees the daemon's bytes, a shrink takes the last segment and its descriptor, and
// layouts that do not fit together are refused with the cause.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/device/memfd_vmm.h"
#include "common/device/vmm.h"
#include "daemon/memory/host_backend.h"
#include "daemon/memory/vmm_backend.h"

namespace kvpool::daemon {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

bool fd_open(int fd) {
  return ::fcntl(fd, F_GETFD) != -1;
}

// Bytes of memory behind a memfd (its blocks, not its size).
uint64_t allocated_bytes(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

struct Backend {
  std::string name;
  std::unique_ptr<MemoryBackend> backend;
};

std::vector<Backend> backends() {
  std::vector<Backend> out;
  out.push_back({"fake-device", make_fake_device_backend()});
  out.push_back({"host", std::make_unique<HostBackend>()});
  return out;
}

// Pages region of 5 segments, a scales region of one granule after a gap of one granule.
ElasticLayout layout_for(uint64_t g) {
  ElasticLayout l;
  l.segment_bytes = 2 * g;
  l.pages_region_bytes = 5 * l.segment_bytes;
  l.scales_offset = l.pages_region_bytes + g;
  l.scales_bytes = g;
  l.reserve_bytes = l.scales_offset + l.scales_bytes;
  l.initial_pages_bytes = l.segment_bytes;
  return l;
}

// No scales; segments of two granules in a region of three: the second segment is one granule.
ElasticLayout short_last_layout(uint64_t g) {
  ElasticLayout l;
  l.segment_bytes = 2 * g;
  l.pages_region_bytes = 3 * g;
  l.reserve_bytes = 3 * g;
  l.initial_pages_bytes = 2 * g;
  return l;
}

void write_pattern(std::byte* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 512)
    p[i] = std::byte(static_cast<uint8_t>(seed ^ (i >> 9)));
}
bool has_pattern(const std::byte* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 512) {
    if (p[i] != std::byte(static_cast<uint8_t>(seed ^ (i >> 9)))) return false;
  }
  return true;
}

TEST(ElasticMemory, GrowsMapsSharesAndShrinks) {
  for (Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    const uint64_t g = b.backend->granularity();
    const ElasticLayout l = layout_for(g);
    auto created = b.backend->create_elastic(l, "elastic");
    ASSERT_TRUE(created.ok()) << created.error().message;
    PoolMemory& mem = *created.value();
    EXPECT_TRUE(mem.elastic());
    EXPECT_EQ(mem.reserved_bytes(), l.reserve_bytes);
    EXPECT_EQ(mem.pages_bytes_mapped(), l.segment_bytes);
    ASSERT_EQ(mem.segments().size(), 2u);  // one pages segment, the scales
    EXPECT_EQ(mem.segments()[1].offset, l.scales_offset);
    EXPECT_EQ(mem.segments()[1].bytes, l.scales_bytes);

    for (int i = 0; i < 3; ++i) {
      auto grown = mem.grow_segment();
      ASSERT_TRUE(grown.ok()) << grown.error().message;
    }
    EXPECT_EQ(mem.pages_bytes_mapped(), 4 * l.segment_bytes);
    EXPECT_EQ(mem.bytes(), 4 * l.segment_bytes + l.scales_bytes);
    ASSERT_EQ(mem.segments().size(), 5u);
    ASSERT_EQ(mem.fds().size(), 5u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(mem.segments()[i].offset, i * l.segment_bytes);
      EXPECT_EQ(mem.segments()[i].bytes, l.segment_bytes);
    }
    EXPECT_EQ(mem.segments()[4].offset, l.scales_offset);

    write_pattern(mem.base(), mem.pages_bytes_mapped(), 0x21);
    write_pattern(mem.base() + l.scales_offset, l.scales_bytes, 0x42);

    // A worker: a reservation of reserved_bytes(), each descriptor at its offset.
    std::vector<uint64_t> sizes, offsets;
    for (const wire::SegmentInfo& s : mem.segments()) {
      sizes.push_back(s.bytes);
      offsets.push_back(s.offset);
    }
    auto api = std::make_shared<device::MemfdVmm>(g);
    auto w = device::import_and_map_at(api, mem.reserved_bytes(), mem.fds(), sizes, offsets);
    ASSERT_TRUE(w.ok()) << w.error().message;
    const std::byte* seen = w.value()->base();
    EXPECT_TRUE(has_pattern(seen, mem.pages_bytes_mapped(), 0x21));
    EXPECT_TRUE(has_pattern(seen + l.scales_offset, l.scales_bytes, 0x42));

    // Shrink: the last pages segment and its descriptor go; the scales stay.
    const int last_fd = mem.fds()[3];
    const int kept = ::dup(last_fd);  // a worker's descriptor of the segment, say
    ASSERT_GE(kept, 0);
    EXPECT_GT(allocated_bytes(kept), 0u);
    ASSERT_TRUE(mem.shrink_segment().ok());
    EXPECT_FALSE(fd_open(last_fd));
    EXPECT_EQ(mem.pages_bytes_mapped(), 3 * l.segment_bytes);
    ASSERT_EQ(mem.segments().size(), 4u);
    EXPECT_EQ(mem.segments()[3].offset, l.scales_offset);
    EXPECT_TRUE(has_pattern(mem.base() + l.scales_offset, l.scales_bytes, 0x42));
    // Its memory went back although the worker still maps it and holds a descriptor (an idle
    // worker must not keep a segment the pool gave up); the worker reads zeros there now.
    EXPECT_EQ(allocated_bytes(kept), 0u);
    ::close(kept);
    EXPECT_TRUE(has_pattern(seen, 3 * l.segment_bytes, 0x21));
    EXPECT_EQ(seen[3 * l.segment_bytes], std::byte{0});
    EXPECT_EQ(seen[4 * l.segment_bytes - 1], std::byte{0});

    // Growing again maps fresh memory at the same offset.
    ASSERT_TRUE(mem.grow_segment().ok());
    EXPECT_EQ(mem.segments()[3].offset, 3 * l.segment_bytes);
    EXPECT_EQ(mem.base()[3 * l.segment_bytes], std::byte{0});
    EXPECT_TRUE(has_pattern(mem.base(), 3 * l.segment_bytes, 0x21));

    // Up to the region's end, then refused; down to one segment, then refused.
    ASSERT_TRUE(mem.grow_segment().ok());
    auto full = mem.grow_segment();
    ASSERT_FALSE(full.ok());
    EXPECT_NE(full.error().message.find("maximum size"), std::string::npos) << full.error().message;
    EXPECT_NE(full.error().message.find(b.name + " backend, pool elastic: "), std::string::npos)
        << full.error().message;
    for (int i = 0; i < 4; ++i)
      ASSERT_TRUE(mem.shrink_segment().ok());
    auto last = mem.shrink_segment();
    ASSERT_FALSE(last.ok());
    EXPECT_NE(last.error().message.find("first pages segment stays"), std::string::npos);
    EXPECT_EQ(mem.segments().size(), 2u);
    EXPECT_TRUE(has_pattern(mem.base(), l.segment_bytes, 0x21));
  }
}

TEST(ElasticMemory, GrowsInStepsAndASegmentMadeForAMovedEndGoesToTheNewOne) {
  for (Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    const ElasticLayout l = layout_for(b.backend->granularity());
    auto created = b.backend->create_elastic(l, "steps");
    ASSERT_TRUE(created.ok()) << created.error().message;
    PoolMemory& mem = *created.value();
    // Planned and made (as on the copy thread); nothing is mapped until the commit.
    auto planned = mem.plan_growth();
    ASSERT_TRUE(planned.ok()) << planned.error().message;
    Growth g = std::move(planned.value());
    EXPECT_EQ(g.offset, l.segment_bytes);
    mem.make_growth(g);
    ASSERT_TRUE(g.error.empty()) << g.error;
    EXPECT_EQ(mem.pages_bytes_mapped(), l.segment_bytes);
    // Meanwhile the pool grows on demand: the end moves by a segment of the same size.
    ASSERT_TRUE(mem.grow_segment().ok());
    ASSERT_TRUE(mem.commit_growth(g).ok());
    EXPECT_EQ(g.offset, 2 * l.segment_bytes);
    EXPECT_EQ(mem.pages_bytes_mapped(), 3 * l.segment_bytes);
    write_pattern(mem.base() + 2 * l.segment_bytes, l.segment_bytes, 0x33);
    EXPECT_TRUE(has_pattern(mem.base() + 2 * l.segment_bytes, l.segment_bytes, 0x33));
    // Two planned at once sit back to back.
    auto third = mem.plan_growth();
    auto fourth = mem.plan_growth(l.segment_bytes);
    ASSERT_TRUE(third.ok() && fourth.ok());
    EXPECT_EQ(fourth.value().offset, third.value().offset + l.segment_bytes);
    // A growth whose make failed commits nothing and says why.
    Growth failed;
    failed.offset = mem.pages_bytes_mapped();
    failed.bytes = l.segment_bytes;
    failed.error = "made of nothing";
    auto refused = mem.commit_growth(failed);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("made of nothing"), std::string::npos);
    EXPECT_EQ(mem.pages_bytes_mapped(), 3 * l.segment_bytes);
  }
}

TEST(ElasticMemory, ASegmentOfTheWrongSizeForTheNewEndStaysTheCallers) {
  for (Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    const uint64_t gran = b.backend->granularity();
    auto created = b.backend->create_elastic(short_last_layout(gran), "short");
    ASSERT_TRUE(created.ok()) << created.error().message;
    PoolMemory& mem = *created.value();
    ASSERT_TRUE(mem.grow_segment().ok());  // the short last one
    ASSERT_TRUE(mem.shrink_segment().ok());
    auto planned = mem.plan_growth();
    ASSERT_TRUE(planned.ok());
    Growth g = std::move(planned.value());
    EXPECT_EQ(g.bytes, gran);
    mem.make_growth(g);
    ASSERT_TRUE(g.error.empty()) << g.error;
    // Meanwhile the pool grows on demand to the region's end: no place is left for g.
    ASSERT_TRUE(mem.grow_segment().ok());
    auto late = mem.commit_growth(g);
    ASSERT_FALSE(late.ok());
    EXPECT_NE(late.error().message.find("end moved"), std::string::npos) << late.error().message;
    EXPECT_FALSE(g.memory.empty());  // the caller's, to release where it likes
    g.memory.reset();
    EXPECT_EQ(mem.pages_bytes_mapped(), 3 * gran);
  }
}

TEST(ElasticMemory, NoScalesAndAShortLastSegment) {
  for (Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    const uint64_t g = b.backend->granularity();
    auto created = b.backend->create_elastic(short_last_layout(g), "p");
    ASSERT_TRUE(created.ok()) << created.error().message;
    PoolMemory& mem = *created.value();
    ASSERT_EQ(mem.segments().size(), 1u);
    ASSERT_TRUE(mem.grow_segment().ok());
    ASSERT_EQ(mem.segments().size(), 2u);
    EXPECT_EQ(mem.segments()[1].offset, 2 * g);
    EXPECT_EQ(mem.segments()[1].bytes, g);
    EXPECT_EQ(mem.pages_bytes_mapped(), 3 * g);
    mem.base()[3 * g - 1] = std::byte{1};
  }
}

TEST(ElasticMemory, LayoutsThatDoNotFitAreRefused) {
  for (Backend& b : backends()) {
    SCOPED_TRACE(b.name);
    const uint64_t g = b.backend->granularity();
    struct Case {
      ElasticLayout l;
      const char* says;
    };
    const ElasticLayout good = layout_for(g);
    std::vector<Case> cases;
    ElasticLayout l = good;
    l.segment_bytes = g + 1;
    cases.push_back({l, "granularity"});
    l = good;
    l.initial_pages_bytes = 3 * g;
    cases.push_back({l, "not whole segments"});
    l = good;
    l.scales_offset = good.pages_region_bytes - g;
    cases.push_back({l, "scales region"});
    l = good;
    l.reserve_bytes = good.scales_offset;
    cases.push_back({l, "scales region"});
    l = good;
    l.segment_bytes = 0;
    cases.push_back({l, "positive"});
    l = good;
    l.segment_bytes = g;
    l.pages_region_bytes = 300 * g;
    l.scales_offset = l.pages_region_bytes;
    l.reserve_bytes = l.scales_offset + l.scales_bytes;
    cases.push_back({l, "exceed the limit of 253"});
    for (const Case& c : cases) {
      auto created = b.backend->create_elastic(c.l, "bad");
      ASSERT_FALSE(created.ok()) << c.says;
      EXPECT_EQ(created.error().status.code(), Errc::invalid_argument);
      EXPECT_NE(created.error().message.find(c.says), std::string::npos) << created.error().message;
      EXPECT_NE(created.error().message.find(b.name + " backend, pool bad: "), std::string::npos)
          << created.error().message;
    }
  }
}

TEST(ElasticMemory, FixedPoolsListTheirSegmentOffsetsAndDoNotResize) {
  auto b = make_fake_device_backend();
  auto created = b->create(5 * kMiB, 2 * kMiB, "fixed");
  ASSERT_TRUE(created.ok()) << created.error().message;
  PoolMemory& mem = *created.value();
  EXPECT_FALSE(mem.elastic());
  ASSERT_EQ(mem.segments().size(), 3u);
  EXPECT_EQ(mem.segments()[0].offset, 0u);
  EXPECT_EQ(mem.segments()[1].offset, 2 * kMiB);
  EXPECT_EQ(mem.segments()[2].offset, 4 * kMiB);
  EXPECT_EQ(mem.reserved_bytes(), 6 * kMiB);
  EXPECT_FALSE(mem.grow_segment().ok());
  EXPECT_FALSE(mem.shrink_segment().ok());
}

}  // namespace
}  // namespace kvpool::daemon

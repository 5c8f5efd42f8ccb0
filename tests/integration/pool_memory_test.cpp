// Integration tests of pool memory reservation (issue: SIGBUS on pools larger than /dev/shm or
// memory): a real kvpoold reserves a pool's memory whole at start, refuses at once, with the
// cause and without touching memory, a pool that /dev/shm or memory cannot back, and
// `kvpoold --check-config` warns about such a pool. No test here reserves more than 64 MiB: the
// pools too large are refused before anything is allocated.

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "common/system_memory.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// 2 layers × 2 KV heads × 16 tokens × head dim 64 × fp16 × (K, V) = 16 KiB pages (+ 32 bytes of
// scales), so even 100 GiB is a few million pages and the daemon's bookkeeping stays small.
std::string pool_config(const std::string& backend, const std::string& capacity,
                        const std::string& extra = "") {
  return "backend: " + backend + "\n" + extra +
         "pools:\n"
         "  - name: big\n"
         "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}\n"
         "    capacity: " +
         capacity + "\n";
}

// What this machine has, as the daemon reads it (common/system_memory.h); 0 when unreadable.
uint64_t shm_free() {
  return kvpool::shm_free_bytes().value_or(0);
}

uint64_t mem_available() {
  return kvpool::mem_available_bytes().value_or(0);
}

// `bytes` rounded up to whole GiB, plus `more` GiB, as a capacity string.
std::string gib_above(uint64_t bytes, uint64_t more) {
  return std::to_string((bytes + kGiB - 1) / kGiB + more) + "GiB";
}

// The pool segments kvpoold holds (its descriptors to /dev/shm/kvpool-* or memfd:kvpool-segment,
// each counted once however many descriptors reach it): their sizes and the bytes actually
// allocated to them, read through the daemon's /proc/PID/fd.
struct Held {
  int segments = 0;
  uint64_t size = 0;
  uint64_t allocated = 0;
};
Held segments_held_by(pid_t pid) {
  Held held;
  std::set<std::pair<dev_t, ino_t>> seen;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || (target.rfind("/dev/shm/kvpool-", 0) != 0 &&
               target.rfind("/memfd:kvpool-segment", 0) != 0)) {
      continue;
    }
    struct stat st {};
    if (::stat(e.path().c_str(), &st) != 0 || !seen.insert({st.st_dev, st.st_ino}).second) {
      continue;
    }
    ++held.segments;
    held.size += static_cast<uint64_t>(st.st_size);
    held.allocated += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return held;
}

// A start that must fail: it did, exited 1 (not a signal, not an uncaught exception), left
// nothing in /dev/shm and said `cause`.
void expect_refused(Daemon& d, const std::string& cause) {
  EXPECT_FALSE(d.start()) << d.log();
  const std::string log = d.log();
  EXPECT_EQ(d.exit_status(), 1) << log;
  EXPECT_NE(log.find("event=pool_failed"), std::string::npos) << log;
  EXPECT_NE(log.find("pool big"), std::string::npos) << log;
  EXPECT_NE(log.find(cause), std::string::npos) << log;
  EXPECT_EQ(log.find("fatal"), std::string::npos) << log;
  EXPECT_EQ(log.find("bad_alloc"), std::string::npos) << log;
  EXPECT_EQ(shm_segments_of(d.last_pid()), 0);
}

TEST(PoolMemory, HostPoolLargerThanDevShmIsRefusedAtStartWithTheCause) {
  const uint64_t free = shm_free();
  ASSERT_GT(free, 0u);
  const std::string capacity = gib_above(free, 8);
  Daemon d(pool_config("host", capacity));
  expect_refused(d, "/dev/shm has ");
  const std::string log = d.log();
  EXPECT_NE(log.find("host backend, pool big: cannot reserve "), std::string::npos) << log;
  EXPECT_NE(log.find(" GiB ("), std::string::npos) << log;  // the size asked
  EXPECT_NE(log.find("bytes) of shared memory: /dev/shm has "), std::string::npos) << log;
  EXPECT_NE(log.find(" free (tmpfs size; see `df -h /dev/shm`)"), std::string::npos) << log;
  // Refused before reserving: a failed fallocate would have filled /dev/shm first.
  EXPECT_EQ(log.find("posix_fallocate"), std::string::npos) << log;
}

TEST(PoolMemory, FakeDevicePoolLargerThanMemAvailableIsRefusedBeforeAnySegment) {
  const uint64_t avail = mem_available();
  ASSERT_GT(avail, 0u);
  // In 1 GiB segments: the whole pool is checked before the first segment is created.
  Daemon d(pool_config("fake-device", gib_above(avail, 8), "max_segment_bytes: 1GiB\n"));
  expect_refused(d, "of memory is available (MemAvailable");
  const std::string log = d.log();
  EXPECT_NE(log.find("fake-device backend, pool big: cannot reserve"), std::string::npos) << log;
  EXPECT_EQ(log.find("fallocate"), std::string::npos) << log;
}

TEST(PoolMemory, BookkeepingLargerThanMemoryIsRefusedBeforeAnyReservation) {
  // The smallest pages there are (10 bytes with their scales) and the most a pool may hold:
  // 20 GiB of pool memory, but ~192 GiB of the daemon's own per-page bookkeeping.
  constexpr uint64_t kPages = (uint64_t{1} << 31) - 1;
  if (kPages * 96 <= mem_available()) GTEST_SKIP() << "this machine has the memory for it";
  Daemon d(
      "backend: host\npools:\n  - name: big\n    geometry: {layers: 1, kv_heads: 1, "
      "head_dim: 1, tokens_per_page: 1, dtype: int8}\n    capacity: " +
      std::to_string(kPages) + " pages\n");
  expect_refused(d, "of daemon memory for their bookkeeping");
}

TEST(PoolMemory, APoolIsReservedWholeAtStart) {
  for (const std::string backend : {"host", "fake-device"}) {
    SCOPED_TRACE(backend);
    Daemon d(pool_config(backend, "64MiB", "max_segment_bytes: 16MiB\n"));
    ASSERT_TRUE(d.start()) << d.log();
    const Held held = segments_held_by(d.pid());
    EXPECT_EQ(held.segments, backend == "host" ? 1 : 4);
    EXPECT_GE(held.size, 64u << 20);
    // Every byte backed now, not on first touch (a sparse segment has next to no blocks).
    EXPECT_GE(held.allocated, held.size);
    EXPECT_EQ(d.stop(), 0) << d.log();
  }
}

TEST(PoolMemory, CheckConfigWarnsAboutAPoolThisMachineCannotBack) {
  TempDir dir;
  const std::string huge = dir.file("huge.yaml");
  const std::string capacity = gib_above(std::max(shm_free(), mem_available()), 64);
  std::ofstream(huge) << pool_config("host", capacity);  // capacity on line 5
  std::string out;
  EXPECT_EQ(run_command(kvpoold_binary() + " --check-config " + huge, out), 0) << out;
  EXPECT_NE(out.find("kvpoold: warning: " + huge + ":5: pools[0].capacity: "), std::string::npos)
      << out;
  EXPECT_NE(out.find(" GiB is more than the "), std::string::npos) << out;
  EXPECT_NE(out.find(" GiB of memory available here ("), std::string::npos) << out;
  EXPECT_NE(out.find(huge + ": valid (1 pool(s), 0 tenant(s), 1 warning(s))"), std::string::npos)
      << out;

  const std::string normal = dir.file("normal.yaml");
  std::ofstream(normal) << pool_config("host", "64MiB");
  EXPECT_EQ(run_command(kvpoold_binary() + " --check-config " + normal, out), 0) << out;
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  EXPECT_NE(out.find(normal + ": valid (1 pool(s), 0 tenant(s))"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing

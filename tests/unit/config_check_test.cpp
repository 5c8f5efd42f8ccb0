// kvpoold --check-config's memory warnings (daemon/config/config_check.h), against made-up figures
// of available memory: one line per pool that cannot be backed, naming FILE:LINE: KEY, and nothing
// for pools that fit or take a fraction. Also: a pool's location in the file is not part of what
// it means (a reload compares pools with ==).

#include "daemon/config/config_check.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvpool::daemon {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// 22.1 GiB, as a machine might report it.
const AvailableMemory kAvailable{static_cast<uint64_t>(22.1 * static_cast<double>(kGiB)),
                                 "made up"};

// A pool of the default model geometry (2 MiB pages at bf16; 1 MiB + 2 KiB of scales at int8)
// with `capacity` on its third line, or no capacity key when it is empty.
std::string pool(std::string_view name, std::string_view capacity,
                 std::string_view dtype = "bf16") {
  std::string y = "  - name: " + std::string(name) + "\n";
  y += "    geometry: {layers: 32, kv_heads: 8, head_dim: 128, tokens_per_page: 16, dtype: " +
       std::string(dtype) + "}\n";
  if (!capacity.empty()) y += "    capacity: " + std::string(capacity) + "\n";
  return y;
}

Config parse_ok(const std::string& yaml) {
  auto r = parse_config(yaml, "test.yaml");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : Config{};
}

TEST(ConfigCheck, APoolLargerThanTheMemoryAvailableIsOneWarningNamingFileLineAndKey) {
  const Config c = parse_ok("backend: host\npools:\n" + pool("big", "96GiB"));
  const std::vector<std::string> w = capacity_warnings(c, kAvailable);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0],
            "test.yaml:5: pools[0].capacity: 96.0 GiB is more than the 22.1 GiB of memory "
            "available here (made up); kvpoold reserves pool memory at start and would refuse to "
            "start with it");
}

TEST(ConfigCheck, PagesAreCountedWithTheirScales) {
  // 8192 pages of 1 MiB + 2 KiB: 8 GiB and 16 MiB.
  const Config c = parse_ok("pools:\n" + pool("p", "8192 pages", "int8"));
  const std::vector<std::string> w =
      capacity_warnings(c, AvailableMemory{8 * kGiB, "exactly 8 GiB"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(
      w[0].starts_with("test.yaml:4: pools[0].capacity: 8192 pages of 1.0 MiB (8.0 GiB) "
                       "is more than the 8.0 GiB of memory available here (exactly 8 GiB)"))
      << w[0];
  EXPECT_TRUE(capacity_warnings(c, AvailableMemory{8 * kGiB + 16 * kMiB, "enough"}).empty());
}

TEST(ConfigCheck, PoolsThatFitOrTakeAFractionSayNothing) {
  const Config c = parse_ok("pools:\n" + pool("a", "8GiB") + pool("b", "90%") + pool("c", "1GiB"));
  EXPECT_TRUE(capacity_warnings(c, kAvailable).empty());
}

TEST(ConfigCheck, APoolThatFitsAloneIsWarnedAboutWithThePoolsBeforeIt) {
  const Config c =
      parse_ok("pools:\n" + pool("a", "15GiB") + pool("b", "50%") + pool("c", "15GiB"));
  const std::vector<std::string> w = capacity_warnings(c, kAvailable);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(
      w[0].starts_with("test.yaml:10: pools[2].capacity: 15.0 GiB, with the 15.0 GiB of "
                       "the pools before it, is more than the 22.1 GiB"))
      << w[0];
}

TEST(ConfigCheck, AnAbsentCapacityIsNamedAtItsPoolWithTheDefault) {
  const Config c = parse_ok("pools:\n" + pool("a", ""));
  const std::vector<std::string> w = capacity_warnings(c, AvailableMemory{100 * kMiB, "small"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(
      w[0].starts_with("test.yaml:2: pools[0].capacity (default 256MiB): 256.0 MiB is "
                       "more than the 100.0 MiB"))
      << w[0];
}

TEST(ConfigCheck, TheBuiltInConfigIsNamedByKeyAlone) {
  const std::vector<std::string> w =
      capacity_warnings(default_config(), AvailableMemory{100 * kMiB, "small"});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_TRUE(w[0].starts_with("pools[0].capacity: 256.0 MiB is more than")) << w[0];
}

TEST(ConfigCheck, APoolThatOnlyMovedLinesIsTheSamePool) {
  const Config before = parse_ok("pools:\n" + pool("a", "1GiB"));
  const Config after = parse_ok("# a comment\n\npools:\n" + pool("a", "1GiB"));
  EXPECT_NE(before.pools[0].capacity_at.text, after.pools[0].capacity_at.text);
  EXPECT_EQ(before.pools, after.pools);
  const Config other = parse_ok("pools:\n" + pool("a", "2GiB"));
  EXPECT_NE(before.pools, other.pools);
}

TEST(ConfigCheck, WhatIsAvailableDependsOnTheBackend) {
  Config c = default_config();
  c.backend = "cuda-vmm";
  EXPECT_FALSE(available_memory_for(c).has_value());
  c.backend = "cuda-ipc";
  EXPECT_FALSE(available_memory_for(c).has_value());
  c.backend = "host";
  const auto host = available_memory_for(c);
  ASSERT_TRUE(host.has_value());
  EXPECT_NE(host->what.find("host backend"), std::string::npos) << host->what;
  c.backend = "fake-device";
  const auto fake = available_memory_for(c);
  ASSERT_TRUE(fake.has_value());
  EXPECT_NE(fake->what.find("MemAvailable"), std::string::npos) << fake->what;
}

}  // namespace
}  // namespace kvpool::daemon

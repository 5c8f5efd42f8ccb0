// cgroup_memory_free_bytes over a fake cgroup v2 tree: the tightest limit from the process's own
// cgroup up to the root, "max" meaning none, v1-only systems giving nothing.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/system_memory.h"

namespace kvpool {
namespace {

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("kvpool-cgroup-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(root_ / "system.slice" / "kvpoold.service");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void write(const std::string& dir, const std::string& file, const std::string& text) {
    std::ofstream(root_ / dir / file) << text << "\n";
  }
  std::optional<uint64_t> free_for(const std::string& proc_self_cgroup) {
    return cgroup_memory_free_bytes(root_.string(), proc_self_cgroup);
  }
  std::filesystem::path root_;
};

TEST_F(CgroupTree, NoLimitAnywhereIsNothingToCheck) {
  write("system.slice/kvpoold.service", "memory.max", "max");
  write("system.slice/kvpoold.service", "memory.current", "1000");
  EXPECT_EQ(free_for("0::/system.slice/kvpoold.service\n"), std::nullopt);
}

TEST_F(CgroupTree, TheOwnLimitLessWhatIsCharged) {
  write("system.slice/kvpoold.service", "memory.max", "1048576");
  write("system.slice/kvpoold.service", "memory.current", "24576");
  EXPECT_EQ(free_for("0::/system.slice/kvpoold.service\n"), 1048576u - 24576u);
}

TEST_F(CgroupTree, AParentsTighterLimitWins) {
  write("system.slice/kvpoold.service", "memory.max", "8000000");
  write("system.slice/kvpoold.service", "memory.current", "1000000");
  write("system.slice", "memory.max", "3000000");
  write("system.slice", "memory.current", "2500000");
  EXPECT_EQ(free_for("0::/system.slice/kvpoold.service\n"), 500000u);
}

TEST_F(CgroupTree, InactiveFileCacheCountsAsFree) {
  write("system.slice/kvpoold.service", "memory.max", "1000000");
  write("system.slice/kvpoold.service", "memory.current", "900000");
  write("system.slice/kvpoold.service", "memory.stat",
        "anon 100000\nfile 800000\nactive_file 200000\ninactive_file 600000\n");
  EXPECT_EQ(free_for("0::/system.slice/kvpoold.service\n"), 700000u);
}

TEST_F(CgroupTree, APathLeavingTheRootIsNotRead) {
  write("", "memory.max", "4096");
  EXPECT_EQ(free_for("0::/system.slice/../../etc\n"), std::nullopt);
}

TEST_F(CgroupTree, OverTheLimitLeavesNothing) {
  write("system.slice/kvpoold.service", "memory.max", "100");
  write("system.slice/kvpoold.service", "memory.current", "200");
  EXPECT_EQ(free_for("0::/system.slice/kvpoold.service\n"), 0u);
}

TEST_F(CgroupTree, TheRootCgroupAndV1OnlySystems) {
  write("", "memory.max", "4096");  // a root with a limit (a container's namespace root)
  EXPECT_EQ(free_for("0::/\n"), 4096u);
  EXPECT_EQ(free_for("4:memory:/docker/abc\n1:cpu:/\n"), std::nullopt);  // cgroup v1 only
  EXPECT_EQ(free_for(""), std::nullopt);
}

}  // namespace
}  // namespace kvpool

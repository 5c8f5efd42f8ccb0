// kvpool-replay --daemon: worker processes replaying a trace through a real kvpoold reach the
// same hit rate as the in-process replay of the same capacity.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

// 300 pages of 512 tokens (the trace's block size); the geometry only sizes the memory.
constexpr char kReplayPool[] = R"(
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 512, dtype: fp16}
    capacity: 300 pages
)";

nlohmann::json replay_json(const Daemon& d, const std::string& args) {
  std::string out;
  const int code = run_command(
      std::string(KVPOOL_REPLAY_BIN) + " --daemon " + d.socket() + " --json " + args, out);
  EXPECT_EQ(code, 0) << out;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << out;
    return {};
  }
}

TEST(DaemonReplay, OrderedWorkersMatchTheInProcessHitRate) {
  if (!std::filesystem::exists(KVPOOL_TRACE_FILE)) {
    GTEST_SKIP() << "trace not found at " << KVPOOL_TRACE_FILE;
  }
  Daemon d(kReplayPool);
  ASSERT_TRUE(d.start()) << d.log();
  const auto j =
      replay_json(d, std::string("--trace ") + KVPOOL_TRACE_FILE + " --workers 3 --limit 400");
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["capacity"], 300);
  EXPECT_EQ(j["requests"], 400);
  EXPECT_GT(j["hit_rate"].get<double>(), 0.0);
  EXPECT_EQ(j["hit_rate"], j["in_process_hit_rate"]);
  EXPECT_GT(j["alloc_p50_us"].get<double>(), 0.0);
}

TEST(DaemonReplay, RefusesAPoolThatIsNotEmpty) {
  Daemon d(kReplayPool);
  ASSERT_TRUE(d.start()) << d.log();
  std::string out;
  const std::string cmd = std::string(KVPOOL_REPLAY_BIN) + " --daemon " + d.socket() + " --trace " +
                          KVPOOL_TEST_DATA + "/tiny_trace.jsonl --workers 2";
  ASSERT_EQ(run_command(cmd, out), 0) << out;
  EXPECT_NE(out.find("(equal)"), std::string::npos) << out;
  // The first replay left pages cached: a second one would not be comparable.
  EXPECT_EQ(run_command(cmd, out), 1);
  EXPECT_NE(out.find("pool is not empty"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing

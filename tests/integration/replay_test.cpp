// Trace replay through the pool core: hand-checked figures on a tiny trace, the reference LRU
// figures of ../shared/data/README.md on the Mooncake trace, and the kvpool-replay command line.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/replay/replay.h"
#include "bench/replay/trace.h"

namespace kvpool::bench {
namespace {

const std::string kTiny = std::string(KVPOOL_TEST_DATA) + "/tiny_trace.jsonl";

ReplayResult run(const Trace& t, uint32_t capacity, const std::string& policy,
                 uint32_t page_tokens = 512, bool expensive_checks = true) {
  ReplayOptions o;
  o.capacity_blocks = capacity;
  o.policy = policy;
  o.page_tokens = page_tokens;
  o.expensive_checks = expensive_checks;
  return replay(t, o);
}

TEST(TraceLoad, ReadsRequestsAndCountsBlocks) {
  const Trace t = load_trace(kTiny);
  ASSERT_EQ(t.requests.size(), 5u);  // the blank line is skipped
  EXPECT_EQ(t.total_blocks, 10u);
  EXPECT_EQ(t.distinct_blocks, 5u);
  EXPECT_EQ(t.requests[3].input_length, 1536u);
  EXPECT_EQ(t.requests[3].hash_ids, (std::vector<uint64_t>{1, 2, 5}));
}

TEST(TraceLoad, BadInputNamesFileAndLine) {
  const auto dir = std::filesystem::temp_directory_path();
  const auto path = (dir / "kvpool_bad_trace.jsonl").string();
  auto expect_error = [&](const std::string& body, const std::string& what) {
    std::ofstream(path) << body;
    try {
      load_trace(path);
      ADD_FAILURE() << "no error for " << body;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error("{\"hash_ids\": [1]}\n{\"hash_ids\": [1,\n", "not valid JSON");
  expect_error("{\"hash_ids\": [1]}\n{\"timestamp\": 3}\n", "hash_ids");
  expect_error("{\"hash_ids\": [1]}\n{\"hash_ids\": [-1]}\n", "non-negative");
  expect_error("{\"hash_ids\": [1]}\n[1, 2]\n", "JSON object");
  std::filesystem::remove(path);
  EXPECT_THROW(load_trace((dir / "kvpool_no_such_trace.jsonl").string()), std::runtime_error);
}

TEST(Replay, TinyTraceByHand) {
  const Trace t = load_trace(kTiny);
  // Capacity 3, LRU queue written oldest first.
  //   r0 [1,2]  misses; 2 pages allocated; released 2 then 1        queue [2 1]
  //   r1 [1,2]  2 hits; released 2 then 1                           queue [2 1]
  //   r2 [3,4]  misses; 3 takes the free page, 4 evicts 2           queue [1 4 3]
  //   r3 [1,2,5] prefix hit 1, then 2 misses (evicts 4), 5 evicts 3 queue [5 2 1]
  //   r4 [3]    miss, evicts 5
  // hits 3 of 10, 7 pages allocated, 4 evictions.
  const ReplayResult r = run(t, 3, "lru");
  EXPECT_EQ(r.requests, 5u);
  EXPECT_EQ(r.pages, 10u);
  EXPECT_EQ(r.hit_pages, 3u);
  EXPECT_EQ(r.allocated_pages, 7u);
  EXPECT_EQ(r.evicted_pages, 4u);
  EXPECT_EQ(r.alloc_failures, 0u);
  EXPECT_DOUBLE_EQ(r.hit_rate(), 0.3);

  // Unbounded capacity: every repeat hits: r1 2, r3 2, r4 1.
  EXPECT_EQ(run(t, 100, "lru").hit_pages, 5u);
  // Belady knows the future, so it never does worse than LRU.
  EXPECT_GE(run(t, 3, "belady").hit_pages, r.hit_pages);
}

TEST(Replay, SmallerPagesSplitBlocksWithTheSameHitRate) {
  const Trace t = load_trace(kTiny);
  const ReplayResult big = run(t, 100, "lru");
  const ReplayResult small = run(t, 100, "lru", 128);
  EXPECT_EQ(small.capacity_pages, 400u);
  EXPECT_EQ(small.pages, 4 * big.pages);
  EXPECT_EQ(small.hit_pages, 4 * big.hit_pages);
}

TEST(Replay, RejectsBadOptions) {
  const Trace t = load_trace(kTiny);
  EXPECT_THROW(run(t, 0, "lru"), std::invalid_argument);
  EXPECT_THROW(run(t, 10, "mru"), std::invalid_argument);
  EXPECT_THROW(run(t, 10, "lru", 100), std::invalid_argument);
  EXPECT_THROW(run(t, 10, "lru", 0), std::invalid_argument);
}

TEST(Replay, CapacityBelowARequestCountsFailedAllocations) {
  const Trace t = load_trace(kTiny);
  const ReplayResult r = run(t, 2, "lru");  // r3 needs 3 pages at once
  EXPECT_EQ(r.alloc_failures, 1u);
}

// A sliding-window model (window 4096 tokens = 8 blocks): request A (20 blocks) lets go of
// blocks 0..11 first, tail first, so B's 16 new blocks evict 11..4 under LRU. A's prompt again:
// the prefix lookup finds blocks 0..3; the window lookup finds the window 12..19 at hit point 20
// and skips 0..11 (held: 8 pages).
TEST(Replay, AWindowLookupHitsPastAnEvictedHead) {
  Trace t;
  auto add = [&t](uint64_t from, uint64_t n) {
    TraceRequest r;
    for (uint64_t i = 0; i < n; ++i)
      r.hash_ids.push_back(from + i);
    t.total_blocks += n;
    t.requests.push_back(r);
  };
  add(0, 20);
  add(100, 16);
  add(0, 20);
  ReplayOptions o;
  o.capacity_blocks = 28;
  o.window_tokens = 4096;
  const ReplayResult window = replay(t, o);
  EXPECT_EQ(window.hit_pages, 20u);
  EXPECT_EQ(window.window_skipped_pages, 12u);
  EXPECT_EQ(window.allocated_pages, 36u);
  o.window_lookup = false;
  const ReplayResult prefix = replay(t, o);
  EXPECT_EQ(prefix.hit_pages, 4u);
  EXPECT_EQ(prefix.window_skipped_pages, 0u);
  EXPECT_EQ(prefix.allocated_pages, 36u + 16u);  // blocks 4..19 again
}

// The reference figures of ../shared/data/README.md (LRU, one page per block).
TEST(Replay, MooncakeTraceMatchesReferenceLruFigures) {
  if (!std::filesystem::exists(KVPOOL_TRACE_FILE)) {
    GTEST_SKIP() << "trace not found at " << KVPOOL_TRACE_FILE;
  }
  const Trace t = load_trace(KVPOOL_TRACE_FILE);
  EXPECT_EQ(t.requests.size(), 3993u);
  EXPECT_EQ(t.total_blocks, 121877u);
  EXPECT_EQ(t.distinct_blocks, 43924u);
  const std::array<std::pair<uint32_t, double>, 4> reference{
      {{1000, 0.0841}, {4000, 0.2345}, {8000, 0.3733}, {16000, 0.5299}}};
  // 1.2M pool operations on pools of up to 16,000 pages: the sanitizer tree's check of every
  // invariant after each (O(pages)) would take ~20 minutes. The tiny traces and the randomized
  // pool test keep the checks.
  constexpr bool kChecks = false;
  for (const auto& [capacity, expected] : reference) {
    const ReplayResult r = run(t, capacity, "lru", 512, kChecks);
    EXPECT_NEAR(r.hit_rate(), expected, 0.005) << "capacity " << capacity;
    EXPECT_EQ(r.pages, 121877u);
    // Belady bounds any online policy from above.
    EXPECT_GE(run(t, capacity, "belady", 512, kChecks).hit_rate(), r.hit_rate())
        << "capacity " << capacity;
  }
}

std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0)
    out.append(buf.data(), n);
  *status = pclose(p);
  return out;
}

TEST(ReplayCli, JsonLinesCarryTheDocumentedFields) {
  int status = -1;
  const std::string out = run_command(std::string(KVPOOL_REPLAY_BIN) + " --trace " + kTiny +
                                          " --capacities 3,100 --policy lru,belady --json",
                                      &status);
  ASSERT_EQ(status, 0) << out;
  std::istringstream lines(out);
  std::string line;
  int objects = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    for (const char* key :
         {"capacity", "policy", "hit_rate", "requests", "blocks", "seconds", "page_tokens"}) {
      EXPECT_TRUE(j.contains(key)) << key << " missing in " << line;
    }
    EXPECT_EQ(j["requests"], 5);
    ++objects;
  }
  EXPECT_EQ(objects, 4);
}

TEST(ReplayCli, BadArgumentsExitWithUsageErrors) {
  int status = -1;
  std::string out = run_command(std::string(KVPOOL_REPLAY_BIN) + " --capacities 10,x", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(out.find("\"x\" is not a positive block count"), std::string::npos) << out;
  out = run_command(std::string(KVPOOL_REPLAY_BIN) + " --trace /nonexistent/t.jsonl", &status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(out.find("cannot open trace file"), std::string::npos) << out;
  out =
      run_command(std::string(KVPOOL_REPLAY_BIN) + " --trace " + kTiny + " --policy mru", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(out.find("unknown policy"), std::string::npos) << out;
  out = run_command(std::string(KVPOOL_REPLAY_BIN) + " --help", &status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_NE(out.find("--page-tokens"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::bench

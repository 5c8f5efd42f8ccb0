// kvpoolctl prefixes, reload and events, and the latency histograms, against a real kvpoold and
// real worker connections (issue 6).

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "client/connection/connection.h"
#include "common/block_hash.h"
#include "tests/integration/ctl_helpers.h"

namespace kvpool::testing {
namespace {

using client::Connection;

constexpr char kPool[] = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)";

BlockHash H(uint64_t i) {
  return BlockHash{0x1000 + i, 0xabcdef00ull + i};
}

std::unique_ptr<Connection> attach(const Daemon& d, const std::string& name = "worker") {
  auto c = Connection::attach(d.socket(), name);
  if (!c.ok()) {
    ADD_FAILURE() << c.error().message;
    return nullptr;
  }
  return std::move(c.value());
}

// As uid 4242 (in `gid`): runs kvpoolctl `args`; the exit code, or 91 when `expect` is not in
// its output. Needs root.
int as_other_user(const Daemon& d, gid_t gid, const std::string& args, const std::string& expect) {
  return run_worker([&] {
    if (::setgid(gid) != 0 || ::setuid(4242) != 0) return 90;
    std::string out;
    const int code = ctl(d, args, out);
    if (out.find(expect) == std::string::npos) {
      std::fprintf(stderr, "output of %s: %s\n", args.c_str(), out.c_str());
      return 91;
    }
    return code;
  });
}

void open_socket_to_everyone(const Daemon& d) {
  std::filesystem::permissions(
      std::filesystem::path(d.socket()).parent_path(),
      std::filesystem::perms::owner_all | std::filesystem::perms::others_exec);
}

TEST(OpsCtl, PrefixesCountTheHitsAWorkerMade) {
  Daemon d(std::string(kPool) +
           "socket: {mode: \"0666\"}\ntenants:\n  - name: other\n    uids: [4242]\n"
           "    pools: [default]\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d);
  ASSERT_NE(w, nullptr);
  auto pages = w->alloc(3);
  ASSERT_TRUE(pages.ok());
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < 3; ++i)
    items.push_back({pages.value()[i], H(i)});
  ASSERT_TRUE(w->publish(items).ok());
  // Hits: block 0 four times, block 1 three times, block 2 twice.
  auto lookup = [&](std::vector<BlockHash> chain, size_t expect_hits) {
    auto r = w->lookup(chain);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r.value().size(), expect_hits);
    ASSERT_TRUE(w->release(r.value()).ok());
  };
  lookup({H(0), H(1), H(2)}, 3);
  lookup({H(0), H(1), H(2)}, 3);
  lookup({H(0), H(1)}, 2);
  lookup({H(0), H(9), H(2)}, 1);

  auto j = ctl_json(d, "prefixes");
  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["indexed"], 3);
  EXPECT_EQ(j["tokens_per_page"], 16);
  ASSERT_EQ(j["prefixes"].size(), 3u) << j.dump();
  const uint64_t hits[] = {4, 3, 2};
  for (size_t i = 0; i < 3; ++i) {
    const auto& e = j["prefixes"][i];
    EXPECT_EQ(e["hash"], to_hex(H(i)));  // docs/BLOCK_HASH.md's rendering
    EXPECT_EQ(e["page"], pages.value()[i]);
    EXPECT_EQ(e["hits"], hits[i]);
    EXPECT_EQ(e["hit_tokens"], hits[i] * 16);
    EXPECT_EQ(e["depth"], i);
    EXPECT_EQ(e["prefix_blocks"], i + 1);
    EXPECT_EQ(e["prefix_tokens"], (i + 1) * 16);
    EXPECT_EQ(e["state"], "in_use");  // the worker still holds its pages
    EXPECT_EQ(e["tenant"], "default");
    EXPECT_TRUE(e["idle_s"].is_number());
  }
  EXPECT_EQ(ctl_json(d, "prefixes --limit 1")["prefixes"].size(), 1u);

  std::string out;
  ASSERT_EQ(ctl(d, "prefixes", out), 0) << out;
  EXPECT_NE(out.find("3 block(s) indexed"), std::string::npos) << out;
  EXPECT_NE(out.find(to_hex(H(0)).substr(0, 16)), std::string::npos) << out;
  EXPECT_EQ(ctl(d, "prefixes --limit 0", out), 2);

  // Another tenant sees none of these blocks (read-only: no admin rights needed, none given).
  if (::geteuid() == 0) {
    open_socket_to_everyone(d);
    EXPECT_EQ(as_other_user(d, 4242, "prefixes --json", "\"indexed\":0"), 0);
  }
}

TEST(OpsCtl, ReloadIsAppliedRefusedWithItsErrorOrNamesRestarts) {
  Daemon d(std::string(kPool) + "socket: {mode: \"0666\"}\nlimits: {max_pages_per_session: 4}\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->alloc(5).error().status.code(), Errc::quota_exceeded);

  std::ofstream(d.config_path()) << kPool << "socket: {mode: \"0666\"}\n"
                                 << "limits: {max_pages_per_session: 10}\n";
  auto j = ctl_json(d, "reload");
  EXPECT_EQ(j["outcome"], "applied");
  EXPECT_EQ(j["message"], d.config_path());
  EXPECT_TRUE(j["restart"].empty());
  EXPECT_TRUE(w->alloc(5).ok());  // the new limit applies at once

  // A bad key: refused with FILE:LINE: KEY, nothing changes, exit 1.
  std::ofstream(d.config_path()) << kPool << "limits: {max_pages_per_sesion: 1}\n";
  std::string out;
  EXPECT_EQ(ctl(d, "reload --json", out), 1);
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["outcome"], "refused");
  const std::string where = d.config_path() + ":6: limits.max_pages_per_sesion";
  EXPECT_EQ(j["message"].get<std::string>().rfind(where, 0), 0u) << j.dump();
  EXPECT_EQ(ctl(d, "reload", out), 1);
  EXPECT_NE(out.find("reload refused, the running configuration stays: " + where),
            std::string::npos)
      << out;
  EXPECT_TRUE(w->alloc(5).ok());  // still 10
  EXPECT_EQ(w->alloc(1).error().status.code(), Errc::quota_exceeded);

  // Pools cannot change live: applied, and named as needing a restart.
  std::ofstream(d.config_path()) << R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 128 pages
socket: {mode: "0666"}
limits: {max_pages_per_session: 20}
metrics: {latency_histograms: false}
)";
  ASSERT_EQ(ctl(d, "reload", out), 0) << out;
  EXPECT_NE(out.find("reloaded " + d.config_path()), std::string::npos) << out;
  EXPECT_NE(out.find("waiting for a restart (running values kept): pools, metrics"),
            std::string::npos)
      << out;
  EXPECT_TRUE(w->alloc(10).ok());
  EXPECT_EQ(w->stats().value().total, 64u);
  EXPECT_TRUE(log_has_line(d, "event=reload_needs_restart keys=pools,metrics"));
  const auto st = ctl_json(d, "stats --no-shm");
  EXPECT_EQ(st["reloads"]["applied"], 2);
  EXPECT_EQ(st["reloads"]["refused"], 2);  // the JSON and the text run
  EXPECT_EQ(st["latency_timed"], true);    // metrics.* waits for the restart

  // The segment size and the memory budget also wait for a restart, and say so.
  std::ofstream(d.config_path()) << kPool << "socket: {mode: \"0666\"}\n"
                                 << "limits: {max_pages_per_session: 20}\n"
                                 << "max_segment_bytes: 64MiB\nmemory_budget: 1GiB\n";
  ASSERT_EQ(ctl(d, "reload", out), 0) << out;
  EXPECT_NE(out.find("waiting for a restart (running values kept): max_segment_bytes, "
                     "memory_budget"),
            std::string::npos)
      << out;

  // Only root and the admin group may reload.
  if (::geteuid() == 0) {
    open_socket_to_everyone(d);
    EXPECT_EQ(as_other_user(d, 4242, "reload", "reload needs root or membership of the admin"), 1);
  }
}

TEST(OpsCtl, AWordThatIsNoCommandIsNamed) {
  std::string out;
  EXPECT_EQ(run_command(kCtlBin + " bogus", out), 2);
  EXPECT_NE(out.find("unknown command 'bogus'"), std::string::npos) << out;
  EXPECT_NE(out.find("status, stats"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtlBin + " --socket /nonexistent bogus --json", out), 2);
  EXPECT_NE(out.find("unknown command 'bogus'"), std::string::npos) << out;
  // The evict help describes the pool's policy order, not LRU.
  EXPECT_EQ(run_command(kCtlBin + " evict --help", out), 0);
  EXPECT_NE(out.find("eviction order"), std::string::npos) << out;
  EXPECT_EQ(out.find("least recently"), std::string::npos) << out;
}

TEST(OpsCtl, ReloadWithoutAConfigFileSaysSo) {
  Daemon d("");
  ASSERT_TRUE(d.start()) << d.log();
  std::string out;
  EXPECT_EQ(ctl(d, "reload --json", out), 1);
  EXPECT_EQ(nlohmann::json::parse(out)["outcome"], "no_config_file");
  EXPECT_EQ(ctl(d, "reload", out), 1);
  EXPECT_NE(out.find("built-in default config"), std::string::npos) << out;
}

// Lines of a kvpoolctl events run in the background.
struct Follower {
  pid_t pid = -1;
  std::string file;
  std::vector<nlohmann::json> lines() const {
    std::ifstream in(file);
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(in, line))
      out.push_back(nlohmann::json::parse(line));
    return out;
  }
};

Follower follow(const Daemon& d, const TempDir& dir, const std::string& args) {
  Follower f;
  f.file = dir.file("events.out");
  f.pid = spawn_worker([&d, args, file = f.file] {
    std::string out;
    return run_command(kCtlBin + " --socket " + d.socket() + " events " + args + " > " + file, out);
  });
  return f;
}

TEST(OpsCtl, EventsFollowStoresEvictionsAndFlushesInSequence) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  TempDir dir;
  Follower f = follow(d, dir, "--json --count 6");
  ASSERT_TRUE(wait_until([&] { return ctl_json(d, "stats")["events"]["subscribers"] == 1; }));

  auto w = attach(d);
  ASSERT_NE(w, nullptr);
  auto pages = w->alloc(3);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(
      w->publish(std::vector<PublishItem>{
                     {pages.value()[0], H(0)}, {pages.value()[1], H(1)}, {pages.value()[2], H(2)}})
          .ok());
  ASSERT_TRUE(
      w->release(std::vector<PageId>{pages.value()[2], pages.value()[1], pages.value()[0]}).ok());
  ASSERT_TRUE(w->evict(1).ok());  // root: the tail, H(2)
  ASSERT_TRUE(w->flush().ok());   // nothing in use: the index empties, one cleared event
  auto one = w->alloc(1);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(w->publish(std::vector<PublishItem>{{one.value()[0], H(7)}}).ok());
  EXPECT_EQ(wait_worker(f.pid), 0);

  const auto lines = f.lines();
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0]["type"], "subscribed");
  EXPECT_EQ(lines[0]["next_seq"], 1);
  const char* types[] = {"stored", "stored", "stored", "removed", "cleared", "stored"};
  uint64_t last = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["schema"], 1);
    EXPECT_EQ(lines[i]["type"], types[i - 1]) << lines[i].dump();
    EXPECT_EQ(lines[i]["pool"], "default");
    EXPECT_GT(lines[i]["seq"].get<uint64_t>(), last);
    last = lines[i]["seq"].get<uint64_t>();
  }
  EXPECT_EQ(lines[3]["page"], pages.value()[2]);
  EXPECT_EQ(lines[4]["cause"], "evicted");
  EXPECT_EQ(lines[5]["blocks"], 2);
  EXPECT_EQ(lines[6]["tenant"], "default");

  // The ring still holds them: a reader may start from the first, in text too.
  std::string out;
  ASSERT_EQ(ctl(d, "events --from 1 --count 6", out), 0) << out;
  EXPECT_NE(out.find("following pool default"), std::string::npos) << out;
  EXPECT_NE(out.find("seq 1        stored"), std::string::npos) << out;
  EXPECT_NE(out.find("removed  block"), std::string::npos) << out;
  EXPECT_NE(out.find("(evicted)"), std::string::npos) << out;
  EXPECT_NE(out.find("seq 5        cleared"), std::string::npos) << out;
  EXPECT_EQ(ctl(d, "events --from 99999 --count 1", out), 1);
  EXPECT_NE(out.find("beyond the next sequence"), std::string::npos) << out;
  EXPECT_EQ(ctl(d, "events --from 0", out), 2);  // sequences start at 1
}

TEST(OpsCtl, LatencyHistogramsCountEveryOperation) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d);
  ASSERT_NE(w, nullptr);
  auto before = ctl_json(d, "stats --no-shm");
  EXPECT_EQ(before["latency_timed"], true);
  EXPECT_EQ(before["latency"]["hello"]["count"], 2);  // the worker and this query
  for (int i = 0; i < 50; ++i) {
    auto p = w->alloc(1);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(w->release(p.value()).ok());
  }
  // The stats segment carries the histograms too (once it caught up with the last call).
  nlohmann::json after;
  ASSERT_TRUE(wait_until([&] {
    after = ctl_json(d, "stats");
    return after["latency"]["release"]["count"] == 50;
  }));
  EXPECT_EQ(after["source"], "segment");
  const auto& alloc = after["latency"]["alloc"];
  EXPECT_EQ(alloc["count"], 50);
  EXPECT_EQ(after["latency"]["release"]["count"], 50);
  EXPECT_GT(alloc["p50_us"].get<double>(), 0.0);
  EXPECT_LE(alloc["p50_us"].get<double>(), alloc["p99_us"].get<double>());
  EXPECT_LE(alloc["p99_us"].get<double>(), alloc["max_us"].get<double>() + 1e-9);
  EXPECT_GE(alloc["request_p99_us"].get<double>(), 0.0);
  std::string out;
  ASSERT_EQ(ctl(d, "stats", out), 0);
  EXPECT_NE(out.find("latency      op"), std::string::npos) << out;
  EXPECT_NE(out.find("alloc"), std::string::npos) << out;

  // Off by config: nothing is timed, and stats says so.
  Daemon off(std::string(kPool) + "metrics: {latency_histograms: false}\n");
  ASSERT_TRUE(off.start()) << off.log();
  const auto j = ctl_json(off, "stats --no-shm");
  EXPECT_EQ(j["latency_timed"], false);
  EXPECT_TRUE(j["latency"].empty()) << j.dump();
}

}  // namespace
}  // namespace kvpool::testing

// kvpoolctl against a real kvpoold: every verb in text and JSON, Prometheus output, plan figures.

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "client/connection/connection.h"
#include "common/text.h"
#include "tests/common/prom_parser.h"
#include "tests/integration/ctl_helpers.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

const std::string kCtl = KVPOOLCTL_BIN;

constexpr char kPool[] = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)";

nlohmann::json json_of(const std::string& args) {
  std::string out;
  EXPECT_EQ(run_command(kCtl + " " + args, out), 0) << out;
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON: " << out;
    return {};
  }
}

TEST(Kvpoolctl, PlanReproducesTheTextbookFigures) {
  auto j =
      json_of("plan --layers 80 --kv-heads 64 --head-dim 128 --tokens 4096 --dtype fp16 --json");
  EXPECT_EQ(j["schema"], 1);
  EXPECT_EQ(j["bytes_per_sequence"], 10737418240ull);  // ≈ 10.7 GB
  EXPECT_EQ(j["bytes_per_token"], 2ull * 80 * 64 * 128 * 2);
  j = json_of(
      "plan --layers 32 --kv-heads 8 --head-dim 128 --tokens 8192 --dtype bf16 "
      "--capacity 80GiB --json");
  EXPECT_EQ(j["bytes_per_sequence"], 1ull << 30);
  EXPECT_EQ(j["pages_per_sequence"], 512);
  EXPECT_EQ(j["sequences_that_fit"], 80);
  // GQA: 8 KV heads instead of 64 is 8 times less, whatever the query heads.
  j = json_of("plan --layers 80 --kv-heads 8 --head-dim 128 --tokens 4096 --json");
  EXPECT_EQ(j["bytes_per_sequence"], 10737418240ull / 8);
  // fp8 halves it again and adds one scale per (layer, head, K|V) per page.
  j = json_of("plan --layers 32 --kv-heads 8 --head-dim 128 --tokens 8192 --dtype fp8 --json");
  EXPECT_EQ(j["bytes_per_sequence"], 1ull << 29);
  EXPECT_EQ(j["page_bytes"], (1ull << 20) + 2 * 32 * 8 * 4);
  std::string out;
  EXPECT_EQ(run_command(kCtl + " plan --layers 80 --kv-heads 64 --head-dim 128 --tokens 4096", out),
            0);
  EXPECT_NE(out.find("10737418240"), std::string::npos) << out;  // raw off a terminal
}

TEST(Kvpoolctl, PlanReadsAModelFileOfEveryAttentionKind) {
  const std::string models = std::string(KVPOOL_TEST_DATA) + "/models.yaml";
  auto j = json_of("plan --models " + models + " --tokens 32768 --dtype bf16 --json");
  ASSERT_EQ(j["models"].size(), 12u) << j.dump();
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& m : j["models"])
    by_name[m["name"].get<std::string>()] = m;
  // A full model agrees with the flag form.
  const auto flags =
      json_of("plan --layers 32 --kv-heads 8 --head-dim 128 --tokens 32768 --dtype bf16 --json");
  EXPECT_EQ(by_name["Llama-3.1-8B"]["bytes_per_sequence"], flags["pool_bytes_per_sequence"]);
  EXPECT_EQ(by_name["Llama-3.1-8B"]["full_kv_bytes_per_sequence"], flags["bytes_per_sequence"]);
  // Mistral-7B's 4096-token window: 257 pages of 16 tokens per layer, not 2048.
  EXPECT_EQ(by_name["Mistral-7B-v0.1"]["bytes_per_sequence"], 32ull * 257 * 16 * 4096);
  EXPECT_EQ(by_name["Mistral-7B-v0.1"]["kinds"], "sliding");
  EXPECT_EQ(by_name["Gemma-3-27B"]["kinds"], "sliding+full");
  // DeepSeek-V3's latent: 576 values a token and layer.
  EXPECT_EQ(by_name["DeepSeek-V3"]["bytes_per_token"], 61u * 576 * 2);
  EXPECT_EQ(by_name["DeepSeek-V3"]["bytes_per_sequence"], 61ull * 32768 * 576 * 2);
  j = json_of("plan --models " + models +
              " --model Falcon-7B --tokens 4096 --capacity 1GiB --json");
  ASSERT_EQ(j["models"].size(), 1u);
  EXPECT_EQ(j["models"][0]["bytes_per_sequence"], 32ull * 4096 * 2 * 64 * 2);
  EXPECT_EQ(j["models"][0]["sequences_that_fit"], 32);

  // Bad files and flags: the file, the line and the field are named; exit 2.
  TempDir dir;
  std::string out;
  const auto write = [&](const std::string& text) {
    std::ofstream(dir.file("m.yaml")) << text;
    return dir.file("m.yaml");
  };
  std::string f = write(
      "models:\n  - name: x\n    layers: 2\n    groups:\n"
      "      - {kind: sliding, layers: 2, kv_heads: 1, head_dim: 8, windw: 4}\n");
  EXPECT_EQ(run_command(kCtl + " plan --models " + f + " --tokens 9", out), 2);
  EXPECT_NE(out.find(f + ":5: models[0].groups[0]: unknown key 'windw'"), std::string::npos) << out;
  f = write(
      "models:\n  - name: x\n    layers: 3\n    groups:\n"
      "      - {kind: sliding, layers: 2, kv_heads: 1, head_dim: 8, window: 4}\n");
  EXPECT_EQ(run_command(kCtl + " plan --models " + f + " --tokens 9", out), 2);
  EXPECT_NE(out.find("its groups have 2 layers, not the model's 3"), std::string::npos) << out;
  f = write(
      "models:\n  - name: x\n    layers: 2\n    groups:\n"
      "      - {kind: sliding, layers: 2, kv_heads: 1, head_dim: 8}\n");
  EXPECT_EQ(run_command(kCtl + " plan --models " + f + " --tokens 9", out), 2);
  EXPECT_NE(out.find("window: a sliding group needs a window"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " plan --models " + models + " --model Nope --tokens 9", out), 2);
  EXPECT_NE(out.find("no model named Nope"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " plan --models " + models + " --layers 2 --tokens 9", out), 2);
  EXPECT_EQ(run_command(kCtl + " plan --models " + dir.file("absent.yaml") + " --tokens 9", out),
            2);
  EXPECT_NE(out.find(dir.file("absent.yaml") + ": cannot read the file"), std::string::npos) << out;
  f = write(
      "models:\n  - name: [x]\n    layers: 1\n    groups: [{kind: full, layers: 1, "
      "kv_heads: 1, head_dim: 8}]\n");
  EXPECT_EQ(run_command(kCtl + " plan --models " + f + " --tokens 9", out), 2);
  EXPECT_NE(out.find(":2: models[0].name: expected a non-empty string"), std::string::npos) << out;
}

TEST(Kvpoolctl, StatusAndStatsAgainstARealDaemon) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto w = client::Connection::attach(d.socket(), "worker");
  ASSERT_TRUE(w.ok());
  auto pages = w.value()->alloc(5);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(
      w.value()->publish(std::vector<PublishItem>{{pages.value()[0], BlockHash{1, 2}}}).ok());
  ASSERT_TRUE(w.value()->lookup(std::vector<BlockHash>{BlockHash{1, 2}, BlockHash{3, 4}}).ok());

  const std::string sock = " --socket " + d.socket();
  // status and stats read the daemon's stats segment, which trails the pools by up to 10 ms:
  // wait until it shows the worker's calls.
  for (int i = 0; i < 500 && json_of("stats --json" + sock)["lookups"] != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto s = json_of("status --json" + sock);
  EXPECT_EQ(s["schema"], 1);
  EXPECT_EQ(s["pool"], "default");
  EXPECT_EQ(s["backend"], "host");
  EXPECT_EQ(s["pages"]["total"], 64);
  EXPECT_EQ(s["pages"]["in_use"], 5);
  EXPECT_EQ(s["pages"]["free"], 59);
  EXPECT_EQ(s["sessions"], 1);  // the worker; kvpoolctl does not count itself
  EXPECT_EQ(s["page_bytes"], 2 * 2 * 2 * 16 * 64 * 2);
  EXPECT_EQ(s["layout"], "page_major");

  auto st = json_of("stats --json" + sock);
  EXPECT_EQ(st["lookups"], 1);
  EXPECT_EQ(st["query_tokens"], 2 * 16);
  EXPECT_EQ(st["hit_tokens"], 16);
  EXPECT_EQ(st["published"], 1);
  EXPECT_EQ(st["allocated"], 5);

  auto map = json_of("pages --json" + sock);
  EXPECT_EQ(map["pages"], 64);
  EXPECT_EQ(map["in_use"], 5);
  EXPECT_EQ(map["free"], 59);
  uint64_t covered = 0;
  uint64_t in_use_runs = 0;
  for (const auto& run : map["runs"]) {
    covered += run[1].get<uint64_t>();
    if (run[0] == 1) in_use_runs += run[1].get<uint64_t>();
  }
  EXPECT_EQ(covered, 64u);
  EXPECT_EQ(in_use_runs, 5u);

  std::string out;
  ASSERT_EQ(run_command(kCtl + sock + " pages --width 16", out), 0) << out;
  EXPECT_NE(out.find("#####"), std::string::npos) << out;  // pages 0..4, one per character
  EXPECT_NE(out.find("      48  ................"), std::string::npos) << out;
  ASSERT_EQ(run_command(kCtl + sock + " status", out), 0) << out;
  EXPECT_NE(out.find("5 in use"), std::string::npos) << out;
  EXPECT_NE(out.find("tokens/page, fp16, page_major"), std::string::npos) << out;
  ASSERT_EQ(run_command(kCtl + sock + " stats", out), 0) << out;
  EXPECT_NE(out.find("16 of 32 tokens hit (50.0%)"), std::string::npos) << out;
}

TEST(Kvpoolctl, PrometheusOutputParses) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  std::string out;
  ASSERT_EQ(run_command(kCtl + " --socket " + d.socket() + " stats --format prom", out), 0) << out;
  const PromParse p = parse_prometheus(out);
  ASSERT_EQ(p.error, "") << out;
  EXPECT_GE(p.samples.size(), 10u);
  EXPECT_EQ(p.types.at("kvpool_pages"), "gauge");
  EXPECT_EQ(p.types.at("kvpool_prefix_hit_tokens_total"), "counter");
  EXPECT_NE(out.find("kvpool_pages{pool=\"default\",state=\"free\"} 64"), std::string::npos);
}

TEST(Kvpoolctl, SessionsEvictFlushAndAdminRights) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run kvpoolctl under other uids";
  Daemon d(std::string(kPool) + "socket: {mode: \"0666\"}\nadmin_group: daemon\n");
  ASSERT_TRUE(d.start()) << d.log();
  std::filesystem::permissions(
      std::filesystem::path(d.socket()).parent_path(),
      std::filesystem::perms::owner_all | std::filesystem::perms::others_exec);
  const std::string sock = " --socket " + d.socket();
  // Three cached pages, and a worker holding two more.
  {
    auto w = client::Connection::attach(d.socket(), "publisher");
    ASSERT_TRUE(w.ok());
    auto p = w.value()->alloc(3);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(w.value()
                    ->publish(std::vector<PublishItem>{{p.value()[0], BlockHash{1, 1}},
                                                       {p.value()[1], BlockHash{2, 2}},
                                                       {p.value()[2], BlockHash{3, 3}}})
                    .ok());
  }
  auto holder = client::Connection::attach(d.socket(), "holder");
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE(holder.value()->alloc(2).ok());
  for (int i = 0; i < 100 && json_of("status --json" + sock)["pages"]["cached"] != 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  const auto sessions = json_of("sessions --json" + sock);
  ASSERT_EQ(sessions["sessions"].size(), 1u) << sessions.dump();
  EXPECT_EQ(sessions["sessions"][0]["worker"], "holder");
  EXPECT_EQ(sessions["sessions"][0]["held_pages"], 2);

  // A uid that is neither root nor in the admin group is refused, with the reason.
  auto as = [&](gid_t gid, const std::string& args, const std::string& expect) {
    return run_worker([&] {
      if (::setgid(gid) != 0 || ::setuid(4242) != 0) return 90;
      std::string out;
      const int code = run_command(kCtl + sock + " " + args, out);
      return out.find(expect) == std::string::npos ? 91 : code;
    });
  };
  EXPECT_EQ(as(4242, "flush", "needs root or membership of the admin group daemon"), 1);
  EXPECT_EQ(as(4242, "evict 1", "uid 4242 is neither"), 1);
  EXPECT_EQ(json_of("status --json" + sock)["pages"]["cached"], 3);  // nothing changed
  // The admin group (gid 1, "daemon") may; evict takes the least recently released first.
  EXPECT_EQ(as(1, "evict 1", "evicted 1 cached page(s)"), 0);
  // Root may too; flush leaves pages in use alone.
  const auto flushed = json_of("flush --json" + sock);
  EXPECT_EQ(flushed["flushed"], 2);
  const auto st = json_of("status --json" + sock);
  EXPECT_EQ(st["pages"]["cached"], 0);
  EXPECT_EQ(st["pages"]["in_use"], 2);
  EXPECT_EQ(json_of("stats --json" + sock)["flushed"], 2);
}

// A worker name is whatever bytes the client sent: kvpoolctl shows it escaped on a terminal,
// keeps its JSON valid UTF-8, and kvpoold's log escapes it too.
TEST(Kvpoolctl, HostileWorkerNamesAreEscaped) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  const std::string name =
      "evil\x1b[2J\r\xff"
      "caf\xc3\xa9";
  auto w = client::Connection::attach(d.socket(), name);
  ASSERT_TRUE(w.ok()) << w.error().message;
  const std::string sock = " --socket " + d.socket();

  std::string out;
  ASSERT_EQ(run_command(kCtl + sock + " sessions", out), 0) << display_text(out);
  for (const char raw : {'\x1b', '\r', '\xff'}) {
    EXPECT_EQ(out.find(raw), std::string::npos)
        << "raw byte " << int(raw) << " in: " << display_text(out);
  }
  EXPECT_NE(out.find("evil\\x1b[2J\\r\\xffcaf\xc3\xa9"), std::string::npos) << display_text(out);

  ASSERT_EQ(run_command(kCtl + sock + " sessions --json", out), 0) << display_text(out);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(out))
      << display_text(out);  // strict: throws on invalid UTF-8
  ASSERT_EQ(j["sessions"].size(), 1u) << j.dump();
  EXPECT_EQ(j["sessions"][0]["worker"],
            "evil\x1b[2J\r\xef\xbf\xbd"
            "caf\xc3\xa9");
  EXPECT_NO_THROW((void)j.dump());

  EXPECT_TRUE(log_has_line(d, "worker=evil\\x1b[2J\\r\\xffcaf\xc3\xa9")) << display_text(d.log());
  const std::string log = d.log();
  EXPECT_EQ(log.find('\x1b'), std::string::npos);
  EXPECT_EQ(log.find('\xff'), std::string::npos);
}

TEST(Kvpoolctl, ErrorsAndUsage) {
  TempDir dir;
  std::string out;
  EXPECT_EQ(run_command(kCtl + " --socket " + dir.file("none.sock") + " status", out), 1);
  EXPECT_NE(out.find("kvpoold is not running"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " frobnicate", out), 2);
  EXPECT_EQ(run_command(kCtl, out), 2);                       // a verb is required
  EXPECT_EQ(run_command(kCtl + " plan --layers 2", out), 2);  // required options missing
  EXPECT_EQ(run_command(kCtl + " plan --layers 2 --kv-heads 2 --head-dim 0 --tokens 5", out), 2);
  EXPECT_NE(out.find("head_dim"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " stats --format xml", out), 2);
  EXPECT_EQ(run_command(kCtl + " plan --layers 2 --kv-heads 2 --head-dim 8 --tokens 0", out), 2);
  EXPECT_EQ(run_command(kCtl + " plan --layers 2 --kv-heads 2 --head-dim 8 --tokens 9 "
                               "--capacity -1GiB",
                        out),
            2);
  EXPECT_NE(out.find("not a positive size"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " plan --help", out), 0);
  EXPECT_NE(out.find("--kv-heads"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " status --help", out), 0);
  EXPECT_NE(out.find("--watch"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " prefixes --help", out), 0);
  EXPECT_NE(out.find("--limit"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " events --help", out), 0);
  EXPECT_NE(out.find("--from"), std::string::npos) << out;
  EXPECT_NE(out.find("--count"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " reload --help", out), 0);
  EXPECT_NE(out.find("SIGHUP"), std::string::npos) << out;
  EXPECT_EQ(run_command(kCtl + " prefixes --limit 0", out), 2);
  EXPECT_EQ(run_command(kCtl + " events --count 0", out), 2);
  EXPECT_EQ(run_command(kCtl + " reload extra", out), 2);
  for (const char* verb : {"prefixes", "reload", "events --count 1", "stats --no-shm"}) {
    EXPECT_EQ(run_command(kCtl + " --socket " + dir.file("none.sock") + " " + verb, out), 1)
        << verb;
    EXPECT_NE(out.find("kvpoold is not running"), std::string::npos) << verb << ": " << out;
  }
}

TEST(Kvpoolctl, StatusShowsTheLayout) {
  Daemon d(R"(
pools:
  - name: planes
    layout: layer_major
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16}
    capacity: 8 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  const std::string sock = " --socket " + d.socket();
  EXPECT_EQ(json_of("status --json" + sock)["layout"], "layer_major");
  EXPECT_EQ(json_of("status --json --no-shm" + sock)["layout"], "layer_major");  // the op
  std::string out;
  ASSERT_EQ(run_command(kCtl + sock + " status", out), 0) << out;
  EXPECT_NE(out.find("tokens/page, bf16, layer_major"), std::string::npos) << out;
  EXPECT_EQ(json_of("status --json" + sock)["attention"], "full");
  EXPECT_EQ(json_of("status --json" + sock)["window"], 0);
}

TEST(Kvpoolctl, StatusShowsTheAttentionKind) {
  Daemon d(R"(
pools:
  - name: local
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16,
               kind: sliding, window: 4096}
    capacity: 8 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  const std::string sock = " --socket " + d.socket();
  for (const char* source : {"", " --no-shm"}) {
    const auto j = json_of(std::string("status --json") + source + sock);
    EXPECT_EQ(j["attention"], "sliding") << source;
    EXPECT_EQ(j["window"], 4096) << source;
  }
  std::string out;
  ASSERT_EQ(run_command(kCtl + sock + " status", out), 0) << out;
  EXPECT_NE(out.find("page_major, sliding window 4096"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvpool::testing

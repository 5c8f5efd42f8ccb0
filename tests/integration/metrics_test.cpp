// kvpoold's metrics: Prometheus text from kvpoolctl and from the HTTP endpoint (strictly
// parsed), the endpoint's error handling and limits, the shared-memory stats segment against
// the stats op, and a subscriber that never reads (issue 6).

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "client/connection/event_stream.h"
#include "client/connection/stats_reader.h"
#include "tests/common/prom_parser.h"
#include "tests/integration/ctl_helpers.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

constexpr char kPool[] = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)";
constexpr char kWithHttp[] = "metrics: {listen: \"127.0.0.1:0\"}\n";

// Some traffic: allocations, a publish, a hit and a miss.
void traffic(Connection& w) {
  auto p = w.alloc(4);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(w.publish(std::vector<PublishItem>{{p.value()[0], BlockHash{1, 2}}}).ok());
  auto hit = w.lookup(std::vector<BlockHash>{BlockHash{1, 2}, BlockHash{3, 4}});
  ASSERT_TRUE(hit.ok());
  ASSERT_TRUE(w.release(p.value()).ok());
}

// Waits until the stats segment shows traffic()'s last op (its release of the 4 pages): the
// segment trails the pools by up to 10 ms (more on a loaded machine), and waiting for an earlier
// op's effect (the alloc) could read it before the lookup's hit tokens were counted.
void settled(const Daemon& d) {
  stats::Snapshot s;
  ASSERT_TRUE(wait_until([&] {
    return client::read_stats_segment(d.socket(), s).empty() && s.pools[0].allocated == 4 &&
           s.pools[0].released == 4;
  }));
}

void expect_valid_exposition(const std::string& text, const std::string& where) {
  const PromParse p = parse_prometheus(text);
  ASSERT_EQ(p.error, "") << where << ":\n" << text;
  EXPECT_EQ(p.types.at("kvpool_pages"), "gauge") << where;
  EXPECT_EQ(p.types.at("kvpool_op_duration_seconds"), "histogram") << where;
  EXPECT_EQ(p.types.at("kvpool_request_duration_seconds"), "histogram") << where;
  EXPECT_EQ(p.value("kvpool_pages_allocated_total", {{"pool", "default"}}), 4) << where;
  EXPECT_EQ(p.value("kvpool_prefix_hit_tokens_total", {{"pool", "default"}}), 16) << where;
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_count", {{"op", "alloc"}}), 1) << where;
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_bucket", {{"op", "alloc"}, {"le", "+Inf"}}), 1)
      << where;
  EXPECT_GT(p.value("kvpool_op_duration_seconds_sum", {{"op", "alloc"}}), 0) << where;
}

TEST(Metrics, PrometheusTextFromKvpoolctlAndHttpParsesStrictly) {
  Daemon d(std::string(kPool) + kWithHttp);
  ASSERT_TRUE(d.start()) << d.log();
  const int port = metrics_port(d);
  ASSERT_GT(port, 0) << d.log();
  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  traffic(*w);
  settled(d);
  std::string out;
  ASSERT_EQ(ctl(d, "stats --format prom", out), 0) << out;
  expect_valid_exposition(out, "kvpoolctl (segment)");
  ASSERT_EQ(ctl(d, "stats --format prom --no-shm", out), 0) << out;
  expect_valid_exposition(out, "kvpoolctl (op)");
  ASSERT_EQ(ctl(d, "stats --format prom --pool default", out), 0) << out;
  EXPECT_EQ(parse_prometheus(out).error, "");
  EXPECT_EQ(ctl(d, "stats --format prom --pool nope", out), 1);
  EXPECT_NE(out.find("no pool named nope"), std::string::npos) << out;

  const std::string r = http_get(port, "/metrics");
  ASSERT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  expect_valid_exposition(http_body(r), "HTTP");
  // HEAD: the headers only.
  const std::string head =
      http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_EQ(http_body(head), "");
}

TEST(Metrics, HttpEndpointAnswersErrorsAndStaysBounded) {
  Daemon d(std::string(kPool) + kWithHttp);
  ASSERT_TRUE(d.start()) << d.log();
  const int port = metrics_port(d);
  ASSERT_GT(port, 0) << d.log();
  EXPECT_EQ(http_get(port, "/").rfind("HTTP/1.1 404 Not Found", 0), 0u);
  EXPECT_EQ(http_get(port, "/metricsx").rfind("HTTP/1.1 404", 0), 0u);
  const std::string post =
      http(port, "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET, HEAD"), std::string::npos) << post;
  EXPECT_EQ(http(port, "BLAH\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(http(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
                .rfind("HTTP/1.1 400", 0),
            0u);
  const std::string big = "GET /metrics HTTP/1.1\r\nX: " + std::string(10000, 'a') + "\r\n\r\n";
  EXPECT_EQ(http(port, big).rfind("HTTP/1.1 431", 0), 0u);

  // Keep-alive: two requests on one connection.
  {
    const int fd = tcp_connect(port);
    ASSERT_GE(fd, 0);
    const std::string two =
        "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n"
        "Connection: close\r\n\r\n";
    ::send(fd, two.data(), two.size(), MSG_NOSIGNAL);
    const std::string both = read_all(fd);
    ::close(fd);
    size_t n = 0;
    for (size_t at = both.find("HTTP/1.1 200 OK"); at != std::string::npos;
         at = both.find("HTTP/1.1 200 OK", at + 1))
      ++n;
    EXPECT_EQ(n, 2u);
  }

  // 64 slow clients (a request that never completes, as slowloris sends it) plus 8 more take
  // every slot and more: a scrape still gets in, closing the connection that waited longest,
  // and is answered well within a second; the workers do not notice.
  std::vector<int> slow;
  constexpr int kEndpointConnections = 64;  // MetricsHttp::kMaxConnections
  for (int i = 0; i < kEndpointConnections + 8; ++i) {
    slow.push_back(tcp_connect(port));
    ASSERT_GE(slow.back(), 0);
    ::send(slow.back(), "GET /met", 8, MSG_NOSIGNAL);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  const std::string scraped = http_get(port, "/metrics");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(scraped.rfind("HTTP/1.1 200 OK", 0), 0u) << scraped.substr(0, 200);
  EXPECT_LT(took, std::chrono::seconds(1));
  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  traffic(*w);  // the pool is served meanwhile
  std::string out;
  EXPECT_EQ(ctl(d, "status --no-shm", out), 0) << out;
  for (const int fd : slow)
    ::close(fd);

  // Keep-alive clients that ask once and then sit idle are closed after the idle timeout (2 s),
  // not the 5 s a first request may take: eight of them cannot hold the endpoint.
  std::vector<int> kept;
  const std::string keep = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 8; ++i) {
    kept.push_back(tcp_connect(port, 4500));
    ASSERT_GE(kept.back(), 0);
    ::send(kept.back(), keep.data(), keep.size(), MSG_NOSIGNAL);
  }
  const auto idle_from = std::chrono::steady_clock::now();
  for (const int fd : kept) {
    const std::string answer = read_all(fd);  // the response, then the server's close
    EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK", 0), 0u);
    ::close(fd);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - idle_from, std::chrono::milliseconds(4000));
  EXPECT_TRUE(d.running());
}

TEST(Metrics, StatsSegmentAgreesWithTheStatsOp) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  const std::string segment = d.socket() + ".stats";
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(segment); }));
  struct stat st {};
  ASSERT_EQ(::stat(segment.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);  // the socket is 0660: its group may read, not write

  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  traffic(*w);
  auto held = w->alloc(3);
  ASSERT_TRUE(held.ok());
  auto op = w->stats();
  ASSERT_TRUE(op.ok());
  // Quiescent now: the segment catches up within its publishing interval.
  stats::Snapshot s;
  ASSERT_TRUE(wait_until([&] {
    return client::read_stats_segment(d.socket(), s).empty() && s.pools.size() == 1 &&
           s.pools[0].allocated == op.value().counter("allocated");
  }));
  const stats::PoolStats& p = s.pools[0];
  EXPECT_EQ(p.total, op.value().total);
  EXPECT_EQ(p.free, op.value().free);
  EXPECT_EQ(p.in_use, op.value().in_use);
  EXPECT_EQ(p.cached, op.value().cached);
  EXPECT_EQ(p.lookups, op.value().counter("lookups"));
  EXPECT_EQ(p.lookup_blocks, op.value().counter("lookup_blocks"));
  EXPECT_EQ(p.hit_blocks, op.value().counter("hit_blocks"));
  EXPECT_EQ(p.released, op.value().counter("released"));
  EXPECT_EQ(p.published, op.value().counter("published"));
  EXPECT_EQ(p.evicted, op.value().counter("evicted"));
  EXPECT_EQ(s.daemon.sessions, op.value().sessions);
  EXPECT_EQ(p.sessions, 1u);
  EXPECT_EQ(s.daemon.pid, static_cast<uint64_t>(d.pid()));
  EXPECT_EQ(s.pool_name(0), "default");

  // kvpoolctl reads the segment by default and the op with --no-shm: the same figures.
  auto a = ctl_json(d, "stats");
  auto b = ctl_json(d, "stats --no-shm");
  EXPECT_EQ(a["source"], "segment");
  EXPECT_EQ(b["source"], "op");
  for (const char* key : {"pages", "sessions", "lookups", "hit_tokens", "allocated", "released",
                          "published", "evicted", "flushed", "indexed_blocks"}) {
    EXPECT_EQ(a[key], b[key]) << key;
  }
  EXPECT_EQ(ctl_json(d, "status")["pages"], ctl_json(d, "status --no-shm")["pages"]);
  EXPECT_EQ(ctl_json(d, "status --no-shm")["tenant"], "default");

  // Stopped: the segment goes with the socket.
  EXPECT_EQ(d.stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(segment));
}

TEST(Metrics, AStaleOrMissingSegmentFallsBackToTheDaemon) {
  {
    Daemon d(std::string(kPool) + "metrics: {stats_segment: false}\n");
    ASSERT_TRUE(d.start()) << d.log();
    EXPECT_FALSE(std::filesystem::exists(d.socket() + ".stats"));
    EXPECT_EQ(ctl_json(d, "status")["source"], "op");
  }
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_TRUE(wait_until([&] { return std::filesystem::exists(d.socket() + ".stats"); }));
  d.kill9();  // leaves the segment behind
  ASSERT_TRUE(std::filesystem::exists(d.socket() + ".stats"));
  stats::Snapshot s;
  EXPECT_NE(client::read_stats_segment(d.socket(), s).find("is gone"), std::string::npos);
  std::string out;
  EXPECT_EQ(ctl(d, "status", out), 1);
  EXPECT_NE(out.find("kvpoold is not running"), std::string::npos) << out;
  // A new daemon on the same socket replaces it.
  ASSERT_TRUE(d.start()) << d.log();
  EXPECT_EQ(ctl_json(d, "status")["source"], "segment");
}

TEST(Metrics, ASubscriberThatNeverReadsLosesEventsNotTheDaemon) {
  Daemon d(std::string(kPool) + "events: {ring_events: 256}\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto sub = client::EventStream::open(d.socket(), "", 0);
  ASSERT_TRUE(sub.ok()) << sub.error().message;
  // 128 events a round (64 stored, 64 removed when they are evicted for the next round): far
  // more than the subscriber's socket buffer and backlog hold.
  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  const auto started = std::chrono::steady_clock::now();
  uint64_t hash = 1;
  for (int round = 0; round < 300; ++round) {
    auto p = w->alloc(64);
    ASSERT_TRUE(p.ok()) << p.error().message;
    std::vector<PublishItem> items;
    for (const PageId page : p.value())
      items.push_back({page, BlockHash{hash++, 7}});
    ASSERT_TRUE(w->publish(items).ok());
    ASSERT_TRUE(w->release(p.value()).ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_LT(seconds, 30.0);  // never blocked on the subscriber
  const auto st = ctl_json(d, "stats --no-shm");
  EXPECT_EQ(st["events"]["subscribers"], 1);
  EXPECT_GT(st["events"]["next_seq"].get<uint64_t>(), 299u * 128);

  // Now it reads: what was queued for it, then a gap, then the events the ring still held.
  uint64_t last = 0, gaps = 0, after_gap = 0, lost = 0;
  for (;;) {
    auto batch = sub.value()->next(1000);
    ASSERT_TRUE(batch.ok()) << batch.error().message;
    if (batch.value().events.empty()) break;
    for (const wire::Event& e : batch.value().events) {
      if (e.kind == wire::Event::kGap) {
        ++gaps;
        lost += e.count;
        EXPECT_GT(e.seq, last);
        last = e.seq - 1;  // the next event carries e.seq
        continue;
      }
      EXPECT_GT(e.seq, last);
      if (gaps > 0) ++after_gap;
      last = e.seq;
    }
  }
  EXPECT_GE(gaps, 1u);
  EXPECT_GT(lost, 0u);
  EXPECT_GT(after_gap, 0u);
  EXPECT_EQ(last, st["events"]["next_seq"].get<uint64_t>() - 1);  // caught up to the end
  EXPECT_GT(ctl_json(d, "stats --no-shm")["events"]["lost"].get<uint64_t>(), 0u);
  EXPECT_TRUE(d.running());
}

TEST(Metrics, ConfigErrorsNameTheKeyAndABusyPortStopsTheStart) {
  TempDir dir;
  std::ofstream(dir.file("bad.yaml")) << kPool << "metrics:\n  listen: \"0.0.0.0:9464\"\n";
  std::string out;
  EXPECT_EQ(run_command(std::string(KVPOOLD_BIN) + " --check-config " + dir.file("bad.yaml"), out),
            1);
  EXPECT_NE(out.find(dir.file("bad.yaml") + ":7: metrics.listen: \"0.0.0.0:9464\" is not a "
                                            "loopback address"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("metrics.allow_non_loopback: true"), std::string::npos) << out;

  Daemon first(std::string(kPool) + kWithHttp);
  ASSERT_TRUE(first.start()) << first.log();
  const int port = metrics_port(first);
  ASSERT_GT(port, 0);
  Daemon second(std::string(kPool) + "metrics: {listen: \"127.0.0.1:" + std::to_string(port) +
                "\"}\n");
  EXPECT_FALSE(second.start());
  EXPECT_NE(second.log().find("metrics.listen 127.0.0.1:" + std::to_string(port) + ": bind"),
            std::string::npos)
      << second.log();
}

}  // namespace
}  // namespace kvpool::testing

// kvpool-ipc-bench: round-trip latency of kvpoold calls next to a bare Unix-socket ping-pong of
// the same request and reply sizes, measured in the same run.
//
// The baseline is the least any daemon could do: a process that blocks in recv() on a Unix
// stream socket and answers with one send() of the reply's size. kvpoold adds its event loop,
// frame decoding, the pool operation and reply encoding; the ratio says what that costs.

#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/ipc/ping_pong.h"
#include "client/connection/connection.h"
#include "common/main_guard.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvpool::client::Connection;

using kvpool::bench::Percentiles;
using kvpool::bench::percentiles;
using kvpool::bench::PingPong;

uint32_t frame_size(const kvpool::wire::Request& r) {
  std::vector<std::byte> b;
  kvpool::wire::encode_request(1, r, b);
  return static_cast<uint32_t>(b.size());
}
uint32_t frame_size(const kvpool::wire::Reply& r) {
  std::vector<std::byte> b;
  kvpool::wire::encode_reply(1, r, b);
  return static_cast<uint32_t>(b.size());
}

template <typename Fn>
double timed(Fn&& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

struct Row {
  std::string op;
  uint32_t req = 0, reply = 0;
  std::vector<double> daemon, baseline;
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvpool-ipc-bench: %s failed\n", what);
    std::exit(1);
  }
}

int run(int argc, char** argv) {
  CLI::App app{"kvpool-ipc-bench: kvpoold round trips next to a bare Unix-socket ping-pong"};
  std::string socket = kvpool::client::default_socket_path();
  int iterations = 20000;
  bool json = false;
  app.add_option("--socket", socket, "kvpoold's socket")->capture_default_str();
  app.add_option("--iterations", iterations, "Round trips per operation")
      ->capture_default_str()
      ->check(CLI::Range(100, 10000000));
  app.add_flag("--json", json, "One JSON object per operation");
  CLI11_PARSE(app, argc, argv);

  auto conn = Connection::attach(socket, "ipc-bench");
  if (!conn.ok()) {
    std::fprintf(stderr, "kvpool-ipc-bench: %s\n", conn.error().message.c_str());
    return 1;
  }
  Connection& c = *conn.value();
  PingPong pp("/tmp/kvpool-ipc-bench-" + std::to_string(::getpid()) + ".sock");
  constexpr size_t kBlock = 100;
  const auto n = (static_cast<size_t>(iterations) + kBlock - 1) / kBlock * kBlock;

  std::vector<Row> rows;
  for (const uint32_t pages : {1u, 256u}) {
    if (pages > c.pool().num_pages) continue;
    Row a{"alloc " + std::to_string(pages),
          frame_size(kvpool::wire::AllocRequest{pages}),
          frame_size(kvpool::wire::AllocReply{std::vector<kvpool::PageId>(pages)}),
          {},
          {}};
    Row r{"release " + std::to_string(pages),
          frame_size(kvpool::wire::ReleaseRequest{std::vector<kvpool::PageId>(pages)}),
          frame_size(kvpool::wire::ReleaseReply{}),
          {},
          {}};
    // Blocks of kBlock round trips, alternating daemon and baseline, so both peers are
    // measured equally warm (a peer that slept longer wakes slower).
    for (size_t done = 0; done < n; done += kBlock) {
      for (size_t i = 0; i < kBlock; ++i) {
        kvpool::client::Result<std::vector<kvpool::PageId>> got = std::vector<kvpool::PageId>{};
        a.daemon.push_back(timed([&] { got = c.alloc(pages); }));
        check(got.ok(), "alloc");
        kvpool::client::Result<kvpool::client::Ok> rel = kvpool::client::Ok{};
        r.daemon.push_back(timed([&] { rel = c.release(got.value()); }));
        check(rel.ok(), "release");
      }
      for (size_t i = 0; i < kBlock; ++i) {
        a.baseline.push_back(pp.round_trip(a.req, a.reply));
        r.baseline.push_back(pp.round_trip(r.req, r.reply));
      }
    }
    rows.push_back(std::move(a));
    rows.push_back(std::move(r));
  }
  {  // lookup of a cached 16-block chain (all hits), then its release
    constexpr uint32_t kLen = 16;
    auto pages = c.alloc(kLen);
    check(pages.ok(), "alloc for lookup");
    std::vector<kvpool::PublishItem> items;
    std::vector<kvpool::BlockHash> chain;
    for (uint32_t i = 0; i < kLen; ++i) {
      chain.push_back({0xabc0 + i, 0x1234 + i});
      items.push_back({pages.value()[i], chain.back()});
    }
    check(c.publish(items).ok(), "publish");
    check(c.release(pages.value()).ok(), "release");
    const Row r_small{"",
                      frame_size(kvpool::wire::ReleaseRequest{std::vector<kvpool::PageId>(kLen)}),
                      frame_size(kvpool::wire::ReleaseReply{}),
                      {},
                      {}};
    Row l{"lookup 16 (hits)",
          frame_size(kvpool::wire::LookupRequest{chain}),
          frame_size(kvpool::wire::LookupReply{std::vector<kvpool::PageId>(kLen),
                                               std::vector<uint8_t>(kLen)}),
          {},
          {}};
    for (size_t done = 0; done < n; done += kBlock) {
      for (size_t i = 0; i < kBlock; ++i) {
        kvpool::client::Result<std::vector<kvpool::PageId>> hit = std::vector<kvpool::PageId>{};
        l.daemon.push_back(timed([&] { hit = c.lookup(chain); }));
        check(hit.ok() && hit.value().size() == kLen, "lookup");
        check(c.release(hit.value()).ok(), "release");
      }
      for (size_t i = 0; i < kBlock; ++i) {
        l.baseline.push_back(pp.round_trip(l.req, l.reply));
        pp.round_trip(r_small.req, r_small.reply);  // the release that follows each lookup
      }
    }
    rows.push_back(std::move(l));
  }

  if (!json) {
    std::printf("%d round trips each; microseconds\n", iterations);
    std::printf("%-18s %7s %7s %9s %9s %9s %9s %8s %8s\n", "operation", "req B", "reply B",
                "kvpoold", "p99", "pingpong", "p99", "p50 x", "p99 x");
  }
  for (Row& row : rows) {
    const Percentiles d = percentiles(row.daemon);
    const Percentiles b = percentiles(row.baseline);
    if (json) {
      std::printf(
          "{\"op\":\"%s\",\"request_bytes\":%u,\"reply_bytes\":%u,\"iterations\":%d,"
          "\"daemon_p50_us\":%.2f,\"daemon_p99_us\":%.2f,\"pingpong_p50_us\":%.2f,"
          "\"pingpong_p99_us\":%.2f,\"ratio_p50\":%.3f,\"ratio_p99\":%.3f}\n",
          row.op.c_str(), row.req, row.reply, iterations, d.p50, d.p99, b.p50, b.p99, d.p50 / b.p50,
          d.p99 / b.p99);
    } else {
      std::printf("%-18s %7u %7u %9.2f %9.2f %9.2f %9.2f %8.2f %8.2f\n", row.op.c_str(), row.req,
                  row.reply, d.p50, d.p99, b.p50, b.p99, d.p50 / b.p50, d.p99 / b.p99);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kvpool::guarded_main("kvpool-ipc-bench", [&] { return run(argc, argv); });
}

// kvpool-remote-bench: the remote tier's figures against a running Redis Cluster.
//
//   client   the ClusterClient kvpoold uses (daemon/remote/cluster_client.h), on kvpoold's
//            values (header + XXH3 checksum written, checked on read): batches of --batch
//            pages SET then GET, for each --sizes value size; bandwidth, and batch and page
//            latency. bench/remote/remote_figures.sh runs redis-benchmark GET/SET with the same
//            value sizes on the same cluster beside it, for the ratio.
//   promote  two kvpoold sharing the cluster (--socket-a, --socket-b, one pool each of the same
//            geometry): blocks published on A, then looked up on B, which fetches them and copies
//            them into its pool before it answers; the lookup's latency for chains of 1 and
//            --batch blocks, against B's lookup of blocks it holds (device hits), same run.
//
//   slow     one kvpoold with a remote tier (--socket): --clients workers each alloc a page,
//            publish it (a write for the tier) and release it, in a loop, while one more looks
//            up chains no one holds (a fetch each); for --seconds quiet, then again after
//            --make-slow (a shell command, e.g. redis-cli CLIENT PAUSE on one master). The
//            workers' alloc p50/p99 in both phases and the ratio: the network waits are off
//            the event loop, so a slow node must not reach the allocs.
//
//   kvpool-remote-bench client --cluster 127.0.0.1:7100 --sizes 65536,524288,2097152
//   kvpool-remote-bench promote --socket-a /tmp/a.sock --socket-b /tmp/b.sock
//   kvpool-remote-bench slow --socket /tmp/a.sock --make-slow "redis-cli -p 7100 CLIENT PAUSE 9000"
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "common/main_guard.h"
#include "daemon/config/node_address.h"
#include "daemon/remote/cluster_client.h"
#include "daemon/remote/remote_value.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvpool::BlockHash;
namespace remote = kvpool::daemon::remote;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Latencies {
  std::vector<double> us;
  double pct(double q) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size())))];
  }
};

int client_bench(const std::vector<std::string>& seeds, const std::vector<uint64_t>& sizes,
                 uint32_t batch, uint32_t pages, uint32_t keys, uint32_t timeout_ms) {
  remote::ClusterOptions o;
  for (const std::string& s : seeds) {
    auto a = kvpool::daemon::parse_node_address(s);
    if (!a) {
      std::fprintf(stderr, "kvpool-remote-bench: %s is not HOST:PORT\n", s.c_str());
      return 2;
    }
    o.seeds.push_back(*a);
  }
  o.timeout_ms = timeout_ms;
  remote::ClusterClient client(o);
  if (!client.refresh()) {
    std::fprintf(stderr, "kvpool-remote-bench: no node answered: %s\n",
                 client.view().last_error.c_str());
    return 1;
  }
  const kvpool::Geometry g{1, 1, 64, 16, kvpool::KvDtype::bf16};
  const uint64_t fp = remote::remote_fingerprint(g, kvpool::KvLayout::page_major, "bench");
  std::printf(
      "| value | op | pages | MB/s | batch of %u p50 / p99 (ms) | per page (us) | failed |\n",
      batch);
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const uint64_t size : sizes) {
    const uint64_t payload = size - remote::kValueHeaderBytes;
    std::vector<std::vector<std::byte>> values(batch, std::vector<std::byte>(size));
    for (uint32_t i = 0; i < batch; ++i) {
      for (uint64_t b = remote::kValueHeaderBytes; b < size; ++b)
        values[i][b] = static_cast<std::byte>((b * 7 + i) & 0xFF);
    }
    const uint32_t rounds = std::max(1u, pages / batch);
    {
      // One batch each way first, untimed: connections made, allocator warm.
      std::vector<std::span<const std::byte>> spans(values.begin(), values.end());
      std::vector<std::string> warm;
      for (uint32_t i = 0; i < batch; ++i)
        warm.push_back("bench:warm:" + std::to_string(i));
      (void)client.set(warm, spans, 60);
      (void)client.get(warm, [](size_t, std::span<const std::byte>) {});
    }
    // A key set of --keys values, written over and over as redis-benchmark -r does, so that
    // neither tool pays for the cluster's memory growing: key k of round r is slot
    // (r * batch + k) mod keys, its block hash the slot's.
    auto slot_of = [&](uint32_t round, uint32_t i) { return (round * batch + i) % keys; };
    auto keys_of = [&](uint32_t round) {
      std::vector<std::string> out;
      for (uint32_t i = 0; i < batch; ++i)
        out.push_back("bench:" + std::to_string(size) + ":" + std::to_string(slot_of(round, i)));
      return out;
    };
    auto hash_of = [&](uint32_t round, uint32_t i) { return BlockHash{slot_of(round, i), size}; };
    // SET: headers and checksums written per batch, as the store worker does.
    Latencies set_lat;
    uint64_t set_failed = 0;
    const auto t_set = Clock::now();
    for (uint32_t r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      std::vector<std::span<const std::byte>> spans;
      for (uint32_t i = 0; i < batch; ++i) {
        remote::write_value_header(values[i], fp, g, kvpool::KvLayout::page_major, hash_of(r, i));
        spans.emplace_back(values[i]);
      }
      set_failed += client.set(keys_of(r), spans, 600).failed;
      set_lat.us.push_back(seconds_since(t0) * 1e6);
    }
    const double set_s = seconds_since(t_set);
    // GET: every value checked, and copied out, as the fetch worker does.
    Latencies get_lat;
    uint64_t get_failed = 0, bad = 0;
    std::vector<std::byte> staging(size * batch);
    const auto t_get = Clock::now();
    for (uint32_t r = 0; r < rounds; ++r) {
      const auto t0 = Clock::now();
      const auto res = client.get(keys_of(r), [&](size_t i, std::span<const std::byte> v) {
        if (remote::check_value(v, fp, payload, hash_of(r, static_cast<uint32_t>(i))) !=
            remote::ValueFault::none) {
          ++bad;
          return;
        }
        std::memcpy(staging.data() + i * size, v.data(), v.size());
      });
      get_failed += res.failed;
      get_lat.us.push_back(seconds_since(t0) * 1e6);
    }
    const double get_s = seconds_since(t_get);
    const double mb = static_cast<double>(size) * rounds * batch / 1e6;
    std::printf("| %llu | SET | %u | %.0f | %.2f / %.2f | %.1f | %llu |\n",
                static_cast<unsigned long long>(size), rounds * batch, mb / set_s,
                set_lat.pct(0.5) / 1e3, set_lat.pct(0.99) / 1e3, set_s * 1e6 / (rounds * batch),
                static_cast<unsigned long long>(set_failed));
    std::printf("| %llu | GET | %u | %.0f | %.2f / %.2f | %.1f | %llu |\n",
                static_cast<unsigned long long>(size), rounds * batch, mb / get_s,
                get_lat.pct(0.5) / 1e3, get_lat.pct(0.99) / 1e3, get_s * 1e6 / (rounds * batch),
                static_cast<unsigned long long>(get_failed + bad));
  }
  return 0;
}

// Publishes `n` fresh blocks (ids from `first`) on c; false on an error.
bool publish(kvpool::client::Connection& c, uint64_t first, uint32_t n) {
  auto pages = c.alloc(n);
  if (!pages.ok()) return false;
  std::vector<kvpool::PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], BlockHash{first + i, 0xB0B}});
  return c.publish(items).ok() && c.release(pages.value()).ok();
}

int promote_bench(const std::string& socket_a, const std::string& socket_b, uint32_t batch,
                  uint32_t rounds) {
  auto a = kvpool::client::Connection::attach(socket_a, "bench-writer");
  auto b = kvpool::client::Connection::attach(socket_b, "bench-reader");
  if (!a.ok() || !b.ok()) {
    std::fprintf(stderr, "kvpool-remote-bench: attach: %s\n",
                 (!a.ok() ? a.error() : b.error()).message.c_str());
    return 1;
  }
  uint64_t next = uint64_t{1} << 40;
  std::printf("| chain | tier | lookups | p50 (us) | p99 (us) | per block p50 (us) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const uint32_t n : {1u, batch}) {
    Latencies remote_lat, device_lat;
    for (uint32_t r = 0; r < rounds; ++r) {
      const uint64_t first = next;
      next += n;
      if (!publish(*a.value(), first, n)) return 1;
      std::vector<BlockHash> chain;
      for (uint32_t i = 0; i < n; ++i)
        chain.push_back({first + i, 0xB0B});
      // Wait until A's write is in the cluster: B's lookups until one hits it all remotely.
      bool timed = false;
      for (int tries = 0; tries < 1000 && !timed; ++tries) {
        const auto t0 = Clock::now();
        auto l = b.value()->lookup_with_tiers(chain, {});
        const double us = seconds_since(t0) * 1e6;
        if (!l.ok()) return 1;
        if (l.value().pages.size() == n) {
          remote_lat.us.push_back(us);
          timed = true;
        }
        (void)b.value()->release(l.value().pages);
        if (!timed) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      // The same chain again: device hits, the baseline.
      const auto t0 = Clock::now();
      auto l = b.value()->lookup(chain);
      device_lat.us.push_back(seconds_since(t0) * 1e6);
      if (l.ok()) (void)b.value()->release(l.value());
    }
    const double p50r = remote_lat.pct(0.5);
    std::printf("| %u | remote | %zu | %.0f | %.0f | %.1f |\n", n, remote_lat.us.size(), p50r,
                remote_lat.pct(0.99), p50r / n);
    std::printf("| %u | device | %zu | %.0f | %.0f | %.1f |\n", n, device_lat.us.size(),
                device_lat.pct(0.5), device_lat.pct(0.99), device_lat.pct(0.5) / n);
  }
  return 0;
}

// One phase of the slow bench: the workers' alloc latencies, the looker's lookup latencies.
struct SlowPhase {
  Latencies alloc, lookup;
  uint64_t errors = 0;
};

bool slow_phase(const std::string& socket, uint32_t clients, double seconds,
                std::atomic<uint64_t>& next_block, SlowPhase& out) {
  std::vector<std::unique_ptr<kvpool::client::Connection>> conns;
  for (uint32_t i = 0; i <= clients; ++i) {
    auto c = kvpool::client::Connection::attach(socket, "bench-" + std::to_string(i));
    if (!c.ok()) {
      std::fprintf(stderr, "kvpool-remote-bench: attach: %s\n", c.error().message.c_str());
      return false;
    }
    conns.push_back(std::move(c.value()));
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> errors{0};
  std::vector<SlowPhase> per(clients + 1);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      kvpool::client::Connection& c = *conns[i];
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clock::now();
        auto pages = c.alloc(1);
        per[i].alloc.us.push_back(seconds_since(t0) * 1e6);
        if (!pages.ok()) {
          errors.fetch_add(1);
          continue;
        }
        const BlockHash h{next_block.fetch_add(1), 0x510};
        const kvpool::PublishItem item{pages.value()[0], h};
        if (!c.publish(std::span(&item, 1)).ok()) errors.fetch_add(1);
        if (!c.release(pages.value()).ok()) errors.fetch_add(1);
      }
    });
  }
  threads.emplace_back([&] {
    kvpool::client::Connection& c = *conns[clients];
    while (!stop.load(std::memory_order_relaxed)) {
      std::vector<BlockHash> chain;
      const uint64_t first = next_block.fetch_add(16);
      for (uint64_t k = 0; k < 16; ++k)
        chain.push_back({first + k, 0x10C});
      const auto t0 = Clock::now();
      auto l = c.lookup(chain);
      per[clients].lookup.us.push_back(seconds_since(t0) * 1e6);
      if (!l.ok() || !c.release(l.value()).ok()) errors.fetch_add(1);
    }
  });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (std::thread& t : threads)
    t.join();
  for (SlowPhase& p : per) {
    out.alloc.us.insert(out.alloc.us.end(), p.alloc.us.begin(), p.alloc.us.end());
    out.lookup.us.insert(out.lookup.us.end(), p.lookup.us.begin(), p.lookup.us.end());
  }
  out.errors = errors.load();
  return true;
}

int slow_bench(const std::string& socket, uint32_t clients, double seconds,
               const std::string& make_slow) {
  std::atomic<uint64_t> next_block{uint64_t{3} << 40};
  SlowPhase quiet, slow;
  if (!slow_phase(socket, clients, seconds, next_block, quiet)) return 1;
  if (int rc = std::system(make_slow.c_str()); rc != 0) {
    std::fprintf(stderr, "kvpool-remote-bench: --make-slow exited with %d\n", rc);
    return 1;
  }
  if (!slow_phase(socket, clients, seconds, next_block, slow)) return 1;
  std::printf(
      "| phase | allocs | alloc p50 (us) | alloc p99 (us) | lookups | lookup p50 (ms) | "
      "lookup p99 (ms) | errors |\n|---|---|---|---|---|---|---|---|\n");
  for (auto* p : {&quiet, &slow}) {
    const size_t allocs = p->alloc.us.size(), lookups = p->lookup.us.size();
    std::printf("| %s | %zu | %.0f | %.0f | %zu | %.2f | %.2f | %llu |\n",
                p == &quiet ? "quiet" : "one node slow", allocs, p->alloc.pct(0.5),
                p->alloc.pct(0.99), lookups, p->lookup.pct(0.5) / 1e3, p->lookup.pct(0.99) / 1e3,
                static_cast<unsigned long long>(p->errors));
  }
  const double q99 = quiet.alloc.pct(0.99);
  std::printf("\nalloc p99, one node slow / quiet: %.2f\n",
              q99 > 0 ? slow.alloc.pct(0.99) / q99 : 0);
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{"kvpool-remote-bench: the remote tier's bandwidth and promote latency"};
  app.require_subcommand(1);
  auto* client = app.add_subcommand("client", "ClusterClient SET/GET bandwidth per value size");
  std::vector<std::string> seeds{"127.0.0.1:7100"};
  std::vector<uint64_t> sizes{65536, 524288, 2097152};
  uint32_t batch = 16, pages = 512, timeout_ms = 1000;
  client->add_option("--cluster", seeds, "seed nodes, HOST:PORT")->delimiter(',');
  client->add_option("--sizes", sizes, "value sizes in bytes (header included)")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{128}, uint64_t{512} << 20));
  client->add_option("--batch", batch, "pages per batch")->check(CLI::Range(1u, 4096u));
  client->add_option("--pages", pages, "pages per size and direction")
      ->check(CLI::Range(1u, 1u << 24));
  uint32_t keys = 64;
  client->add_option("--keys", keys, "distinct keys per size, overwritten (redis-benchmark -r)")
      ->check(CLI::Range(1u, 1u << 24));
  client->add_option("--timeout-ms", timeout_ms, "per node and batch")
      ->check(CLI::Range(1u, 60000u));
  auto* promote = app.add_subcommand("promote", "lookup latency of remote hits on a second daemon");
  std::string socket_a, socket_b;
  uint32_t rounds = 200;
  promote->add_option("--socket-a", socket_a, "the daemon that publishes")->required();
  promote->add_option("--socket-b", socket_b, "the daemon that looks up")->required();
  promote->add_option("--batch", batch, "blocks in the long chain")->check(CLI::Range(1u, 4096u));
  promote->add_option("--rounds", rounds, "lookups per chain length")
      ->check(CLI::Range(1u, 100000u));
  auto* slow = app.add_subcommand("slow", "workers' alloc latency, quiet and with a slow node");
  std::string socket, make_slow;
  uint32_t clients = 2;
  double seconds = 5;
  slow->add_option("--socket", socket, "the daemon (a pool with a remote tier)")->required();
  slow->add_option("--clients", clients, "workers that alloc, publish and release")
      ->check(CLI::Range(1u, 64u));
  slow->add_option("--seconds", seconds, "length of each phase")->check(CLI::Range(0.1, 600.0));
  slow->add_option("--make-slow", make_slow, "shell command run between the phases")->required();
  CLI11_PARSE(app, argc, argv);
  if (client->parsed()) return client_bench(seeds, sizes, batch, pages, keys, timeout_ms);
  if (slow->parsed()) return slow_bench(socket, clients, seconds, make_slow);
  return promote_bench(socket_a, socket_b, batch, rounds);
}

}  // namespace

int main(int argc, char** argv) {
  return kvpool::guarded_main("kvpool-remote-bench", [&] { return run(argc, argv); });
}

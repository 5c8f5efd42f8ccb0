// kvpool-stall-bench: does daemon-side memory work stall other workers? One-page alloc (+
// release) round trips are timed on a quiet daemon, then again while another connection keeps
// the daemon busy, back to back, in the same run; the table gives p50, p99 and max of both and
// the loaded / quiet ratios. The load (--load):
//   copy    copy requests of --copy-mib (1 GiB) each;
//   resize  an elastic pool grown to its max_capacity and shrunk back to its start, by an admin
//           resize (whole segments; the pool must be elastic, the tool run as an admin);
//   tier    --tier-blocks (1,000) published blocks evicted to the pool's host tier and looked up
//           again (every lookup promotes them all; the pool needs a host_tier).
//
// A copy larger than kvpoold's --inline-copy-bytes (1 MiB) runs on the daemon's CopyWorker
// thread, not on the event loop; `kvpoold --inline-copy-bytes 1GiB` keeps every copy on the loop,
// as before the CopyWorker, when a 1 GiB copy held the loop for the whole copy and every request
// that arrived meanwhile waited behind it.
//
//   kvpoold --config big.yaml --socket /tmp/k.sock &     # a pool of >= 2 × --copy-mib + 64 MiB
//   kvpool-stall-bench --socket /tmp/k.sock

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "common/block_hash.h"
#include "common/main_guard.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvpool::client::Connection;

struct Figures {
  double p50 = 0, p99 = 0, max = 0;
};

Figures figures(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) {
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
  };
  return {at(0.50), at(0.99), v.back()};
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "kvpool-stall-bench: %s\n", what.c_str());
  std::exit(1);
}

// One alloc(1) round trip in microseconds (the page goes back untimed).
double timed_alloc(Connection& c) {
  const auto t0 = Clock::now();
  auto p = c.alloc(1);
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!p.ok()) fail("alloc: " + p.error().message);
  if (!c.release(p.value()).ok()) fail("release");
  return us;
}

int run(int argc, char** argv) {
  CLI::App app{"kvpool-stall-bench: alloc latency on a quiet daemon and during memory work"};
  std::string socket = kvpool::client::default_socket_path();
  int samples = 20000;
  uint32_t copy_mib = 1024;
  double gap_us = 50;
  double phase_seconds = 5;
  app.add_option("--socket", socket, "kvpoold's socket")->capture_default_str();
  app.add_option("--samples", samples, "Timed allocs per phase")
      ->capture_default_str()
      ->check(CLI::Range(100, 10000000));
  app.add_option("--copy-mib", copy_mib, "Bytes each copy request moves, in MiB (at most 1024)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--gap-us", gap_us, "Pause between timed allocs, in microseconds")
      ->capture_default_str();
  app.add_option("--seconds", phase_seconds, "Longest a phase may take (fewer samples then)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  std::string load_kind = "copy";
  uint32_t tier_blocks = 1000;
  app.add_option("--load", load_kind, "What the daemon does meanwhile: copy, resize or tier")
      ->capture_default_str()
      ->check(CLI::IsMember({"copy", "resize", "tier"}));
  app.add_option("--tier-blocks", tier_blocks, "Blocks each tier round demotes and promotes")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  CLI11_PARSE(app, argc, argv);

  auto timed_conn = Connection::attach(socket, "stall-bench-alloc");
  if (!timed_conn.ok()) fail(timed_conn.error().message);
  auto copy_conn = Connection::attach(socket, "stall-bench-load");
  if (!copy_conn.ok()) fail(copy_conn.error().message);
  Connection& c = *timed_conn.value();
  Connection& copier = *copy_conn.value();
  const uint64_t page_bytes = copier.pool().page_stride;
  // One round of the load; returns the bytes it moved.
  std::function<uint64_t()> load_round;
  std::vector<kvpool::wire::PageCopy> pairs;
  std::vector<kvpool::BlockHash> chain;
  if (load_kind == "copy") {
    const auto copy_pages = static_cast<uint32_t>((uint64_t{copy_mib} << 20) / page_bytes);
    if (copy_pages == 0) fail("a copy of " + std::to_string(copy_mib) + " MiB holds no page");
    auto pages = copier.alloc(2 * copy_pages);
    if (!pages.ok()) {
      fail("the pool must hold 2 × " + std::to_string(copy_pages) + " pages for the copy and " +
           "some to spare: " + pages.error().message);
    }
    pairs.resize(copy_pages);
    for (uint32_t i = 0; i < copy_pages; ++i)
      pairs[i] = {pages.value()[i], pages.value()[copy_pages + i]};
    for (uint32_t i = 0; i < 2 * copy_pages; ++i)  // touched once, so no phase pays first faults
      std::memset(copier.page(pages.value()[i]), static_cast<int>(i), page_bytes);
    load_round = [&] {
      if (auto r = copier.copy(pairs); !r.ok()) fail("copy: " + r.error().message);
      return uint64_t{pairs.size()} * page_bytes;
    };
  } else if (load_kind == "resize") {
    const uint32_t low = copier.pool().num_pages;
    const uint32_t high = copier.pool().max_pages;
    if (high <= low) fail("--load resize needs an elastic pool below its max_capacity");
    load_round = [&, low, high] {
      auto up = copier.resize(high);
      if (!up.ok()) fail("resize: " + up.error().message);
      auto down = copier.resize(low);
      if (!down.ok()) fail("resize: " + down.error().message);
      return 2 * uint64_t{up.value() - down.value()} * page_bytes;
    };
  } else {
    auto pages = copier.alloc(tier_blocks);
    if (!pages.ok()) fail("alloc for the tier blocks: " + pages.error().message);
    std::vector<kvpool::PublishItem> items;
    for (uint32_t i = 0; i < tier_blocks; ++i) {
      chain.push_back(kvpool::BlockHash{0x57a11 + i, 0xbe7c4 * (uint64_t{i} + 1)});
      items.push_back({pages.value()[i], chain.back()});
    }
    if (auto r = copier.publish(items); !r.ok()) fail("publish: " + r.error().message);
    std::vector<kvpool::PageId> tail_first(pages.value().rbegin(), pages.value().rend());
    if (auto r = copier.release(tail_first); !r.ok()) fail("release: " + r.error().message);
    load_round = [&] {
      auto evicted = copier.evict(tier_blocks);  // demoted to the host tier
      if (!evicted.ok()) fail("evict: " + evicted.error().message);
      auto hits = copier.lookup_with_tiers(chain);  // promoted back
      if (!hits.ok()) fail("lookup: " + hits.error().message);
      if (hits.value().pages.size() != chain.size()) {
        fail("the lookup found " + std::to_string(hits.value().pages.size()) + " of " +
             std::to_string(chain.size()) + " blocks: does the pool have a host_tier?");
      }
      std::vector<kvpool::PageId> back(hits.value().pages.rbegin(), hits.value().pages.rend());
      if (auto r = copier.release(back); !r.ok()) fail("release: " + r.error().message);
      return 2 * uint64_t{chain.size()} * page_bytes;
    };
  }

  const auto pause = std::chrono::duration<double, std::micro>(gap_us);
  const auto measure = [&](std::vector<double>& out) {
    const auto until = Clock::now() + std::chrono::duration<double>(phase_seconds);
    for (int i = 0; i < samples && Clock::now() < until; ++i) {
      out.push_back(timed_alloc(c));
      std::this_thread::sleep_for(pause);
    }
  };
  std::vector<double> quiet, loaded;
  // Warm up: the daemon's first round over these pages also maps them in (page faults), and the
  // round trips settle.
  (void)load_round();
  for (int i = 0; i < 1000; ++i)
    timed_alloc(c);
  measure(quiet);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> moved{0};
  double copy_seconds = 0;
  std::thread load([&] {
    const auto t0 = Clock::now();
    while (!stop.load()) {
      moved.fetch_add(load_round());
      copies.fetch_add(1);
    }
    copy_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the first copy is under way
  measure(loaded);
  stop.store(true);
  load.join();

  const Figures q = figures(quiet);
  const Figures l = figures(loaded);
  const double gbps = copy_seconds > 0 ? static_cast<double>(moved.load()) / copy_seconds / 1e9 : 0;
  const std::string what = load_kind == "copy" ? "copies of " + std::to_string(copy_mib) + " MiB"
                           : load_kind == "resize" ? "grows to max_capacity and shrinks back"
                                                   : "demotions and promotions of " +
                                                         std::to_string(tier_blocks) + " blocks";
  std::printf(
      "alloc(1) round trips, %.0f us apart (quiet %zu, loaded %zu, at most %.0f s a phase); "
      "%s back to back\n",
      gap_us, quiet.size(), loaded.size(), phase_seconds, what.c_str());
  std::printf("%-8s %9s %9s %9s\n", "phase", "p50 us", "p99 us", "max us");
  std::printf("%-8s %9.2f %9.2f %9.1f\n", "quiet", q.p50, q.p99, q.max);
  std::printf("%-8s %9.2f %9.2f %9.1f\n", load_kind.c_str(), l.p50, l.p99, l.max);
  std::printf("ratio    %9.2f %9.2f %9.1f   (%s / quiet)\n", l.p50 / q.p50, l.p99 / q.p99,
              l.max / q.max, load_kind.c_str());
  std::printf("rounds done while timing: %llu (%.2f GB/s moved)\n",
              static_cast<unsigned long long>(copies.load()), gbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kvpool::guarded_main("kvpool-stall-bench", [&] { return run(argc, argv); });
}

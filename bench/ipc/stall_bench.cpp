// kvpool-stall-bench: does a large daemon-side copy stall other workers? One-page alloc (+
// release) round trips are timed on a quiet daemon, then again while another connection keeps
// the daemon copying (1 GiB per copy request, back to back), in the same run; the table gives
// p50, p99 and max of both and the loaded / quiet ratios.
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
#include <string>
#include <thread>
#include <vector>

#include "client/connection.h"

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
  CLI::App app{"kvpool-stall-bench: alloc latency on a quiet daemon and during 1 GiB copies"};
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
  CLI11_PARSE(app, argc, argv);

  auto timed_conn = Connection::attach(socket, "stall-bench-alloc");
  if (!timed_conn.ok()) fail(timed_conn.error().message);
  auto copy_conn = Connection::attach(socket, "stall-bench-copy");
  if (!copy_conn.ok()) fail(copy_conn.error().message);
  Connection& c = *timed_conn.value();
  Connection& copier = *copy_conn.value();
  const uint64_t page_bytes = copier.pool().page_stride;
  const auto copy_pages = static_cast<uint32_t>((uint64_t{copy_mib} << 20) / page_bytes);
  if (copy_pages == 0) fail("a copy of " + std::to_string(copy_mib) + " MiB holds no page");
  auto pages = copier.alloc(2 * copy_pages);
  if (!pages.ok()) {
    fail("the pool must hold 2 × " + std::to_string(copy_pages) + " pages for the copy and " +
         "some to spare: " + pages.error().message);
  }
  std::vector<kvpool::wire::PageCopy> pairs(copy_pages);
  for (uint32_t i = 0; i < copy_pages; ++i)
    pairs[i] = {pages.value()[i], pages.value()[copy_pages + i]};
  for (uint32_t i = 0; i < 2 * copy_pages; ++i)  // touched once, so no phase pays first faults
    std::memset(copier.page(pages.value()[i]), static_cast<int>(i), page_bytes);

  const auto pause = std::chrono::duration<double, std::micro>(gap_us);
  const auto measure = [&](std::vector<double>& out) {
    const auto until = Clock::now() + std::chrono::duration<double>(phase_seconds);
    for (int i = 0; i < samples && Clock::now() < until; ++i) {
      out.push_back(timed_alloc(c));
      std::this_thread::sleep_for(pause);
    }
  };
  std::vector<double> quiet, loaded;
  // Warm up: the daemon's first copy over these pages also maps them in (page faults), and the
  // round trips settle.
  if (auto r = copier.copy(pairs); !r.ok()) fail("copy: " + r.error().message);
  for (int i = 0; i < 1000; ++i)
    timed_alloc(c);
  measure(quiet);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> copies{0};
  double copy_seconds = 0;
  std::thread load([&] {
    const auto t0 = Clock::now();
    while (!stop.load()) {
      auto r = copier.copy(pairs);
      if (!r.ok()) fail("copy: " + r.error().message);
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
  const double copied_bytes =
      static_cast<double>(copies.load()) * static_cast<double>(uint64_t{copy_pages} * page_bytes);
  const double gbps = copy_seconds > 0 ? copied_bytes / copy_seconds / 1e9 : 0;
  std::printf(
      "alloc(1) round trips, %.0f us apart (quiet %zu, copying %zu, at most %.0f s a phase); "
      "copies of %u MiB back to back\n",
      gap_us, quiet.size(), loaded.size(), phase_seconds, copy_mib);
  std::printf("%-8s %9s %9s %9s\n", "phase", "p50 us", "p99 us", "max us");
  std::printf("%-8s %9.2f %9.2f %9.1f\n", "quiet", q.p50, q.p99, q.max);
  std::printf("%-8s %9.2f %9.2f %9.1f\n", "copying", l.p50, l.p99, l.max);
  std::printf("ratio    %9.2f %9.2f %9.1f   (copying / quiet)\n", l.p50 / q.p50, l.p99 / q.p99,
              l.max / q.max);
  std::printf("copies done while timing: %llu (%.2f GB/s)\n",
              static_cast<unsigned long long>(copies.load()), gbps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpool-stall-bench: %s\n", e.what());
    return 1;
  }
}

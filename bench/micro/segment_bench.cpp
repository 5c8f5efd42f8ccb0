// kvpool-segment-bench: what one step of an elastic pool costs. For each backend (fake-device:
// MemfdVmm at 2 MiB, the cuda-vmm code; host: memfd at the system page size) and each segment
// size, an elastic pool of one segment grows by N segments and shrinks back, each
// grow_segment() / shrink_segment() timed alone; then the pool core's part, PagePool::grow and
// PagePool::shrink by the pages of one segment (an idle pool: the tail is FREE), and a shrink
// whose tail is all CACHED with room below (every page relocated: index, policy, metadata).
//
// A grow is memfd_create + ftruncate + fallocate (the kernel zeroes and reserves every page: the
// dominant cost, so MiB/s is the figure to read) + export + map + mprotect. A shrink is an
// mmap(PROT_NONE) over the range and two closes; the memory itself is freed when the last
// descriptor goes, inside the call. N per size is --total-mib / size, between 4 and 64.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/page_pool.h"
#include "daemon/memory/host_backend.h"
#include "daemon/memory/vmm_backend.h"

namespace {

using namespace kvpool;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Summary {
  double median_us = 0;
  double p99_us = 0;
};

Summary summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  const size_t p99 = std::min(n - 1, static_cast<size_t>(static_cast<double>(n) * 0.99));
  return {us[n / 2], us[p99]};
}

double since_us(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

void row(const char* backend, const char* what, uint64_t seg_mib, size_t n, const Summary& s,
         double mib) {
  std::printf("%-12s %-23s %8llu %4zu %12.1f %12.1f %10.0f\n", backend, what,
              static_cast<unsigned long long>(seg_mib), n, s.median_us, s.p99_us,
              mib / (s.median_us / 1e6));
}

// Grows an elastic pool of one segment by n segments and shrinks it back; false on an error.
bool bench_backend(const char* name, daemon::MemoryBackend& backend, uint64_t seg, size_t n) {
  daemon::ElasticLayout l;
  l.segment_bytes = seg;
  l.pages_region_bytes = (n + 1) * seg;
  l.reserve_bytes = l.pages_region_bytes;
  l.initial_pages_bytes = seg;
  auto created = backend.create_elastic(l, "bench");
  if (!created.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, created.error().message.c_str());
    return false;
  }
  daemon::PoolMemory& mem = *created.value();
  std::vector<double> grow, shrink;
  for (size_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto r = mem.grow_segment();
    grow.push_back(since_us(t0));
    if (!r.ok()) {
      std::fprintf(stderr, "%s: grow: %s\n", name, r.error().message.c_str());
      return false;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    auto r = mem.shrink_segment();
    shrink.push_back(since_us(t0));
    if (!r.ok()) {
      std::fprintf(stderr, "%s: shrink: %s\n", name, r.error().message.c_str());
      return false;
    }
  }
  const double mib = static_cast<double>(seg) / kMiB;
  row(name, "grow_segment", seg / kMiB, n, summarize(grow), mib);
  row(name, "shrink_segment", seg / kMiB, n, summarize(shrink), mib);
  return true;
}

BlockHash hash_of(uint64_t i) {
  return BlockHash{i * 0x9E3779B97F4A7C15ull + 1, i};
}

// PagePool::grow / shrink by the pages of one segment, n times each; then shrinks whose tail is
// CACHED with as many FREE pages below (every tail page moves).
void bench_core(uint64_t seg, uint64_t page_bytes, size_t n) {
  const auto step = static_cast<uint32_t>(seg / page_bytes);
  core::PoolOptions o;
  o.num_pages = step;
  o.expensive_checks = false;
  core::PagePool pool(std::move(o));
  std::vector<double> grow, shrink, relocate;
  std::vector<core::PageMove> moves;
  for (size_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    (void)pool.grow(pool.num_pages() + step);
    grow.push_back(since_us(t0));
  }
  for (size_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    (void)pool.shrink(pool.num_pages() - step, moves);
    shrink.push_back(since_us(t0));
  }
  // Relocating shrinks: [0, step) FREE, [step, 2·step) CACHED, shrink to step.
  const core::OwnerId owner = pool.open_owner();
  uint64_t next_hash = 0;
  std::vector<core::PageId> held(2 * step);
  std::vector<core::PublishItem> items(step);
  std::vector<core::PublishResult> out(step);
  for (size_t i = 0; i < n; ++i) {
    (void)pool.grow(2 * step);
    if (!pool.alloc(owner, held).ok()) return;
    for (uint32_t k = 0; k < step; ++k)
      items[k] = core::PublishItem{held[step + k], hash_of(next_hash++)};
    (void)pool.publish(owner, 1, items, out);
    (void)pool.release(owner, held);
    moves.clear();
    const auto t0 = Clock::now();
    (void)pool.shrink(step, moves);
    relocate.push_back(since_us(t0));
    if (moves.size() != step) {
      std::fprintf(stderr, "core: %zu pages moved, %u expected\n", moves.size(), step);
      return;
    }
    (void)pool.flush();
  }
  const double mib = static_cast<double>(seg) / kMiB;
  row("core", "PagePool::grow", seg / kMiB, n, summarize(grow), mib);
  row("core", "PagePool::shrink", seg / kMiB, n, summarize(shrink), mib);
  row("core", "PagePool::shrink, moves", seg / kMiB, n, summarize(relocate), mib);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpool-segment-bench: elastic pool grow and shrink latency per segment"};
  std::vector<uint64_t> segment_mib = {2, 32, 256};
  uint64_t total_mib = 1024;
  uint64_t page_kib = 64;
  std::vector<std::string> backends = {"fake-device", "host"};
  app.add_option("--segment-mib", segment_mib, "Segment sizes, MiB")->capture_default_str();
  app.add_option("--total-mib", total_mib, "Bytes grown per size (N = total / size, 4..64)")
      ->capture_default_str();
  app.add_option("--page-kib", page_kib, "Page size for the PagePool rows, KiB")
      ->capture_default_str();
  app.add_option("--backends", backends, "fake-device, host, cuda-vmm")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::printf(
      "PagePool rows: the pages of one segment at %llu KiB a page; \"moves\": every tail "
      "page CACHED and moved below\n",
      static_cast<unsigned long long>(page_kib));
  std::printf("%-12s %-23s %8s %4s %12s %12s %10s\n", "backend", "step", "seg MiB", "n",
              "median us", "p99 us", "MiB/s");
  for (const uint64_t mib : segment_mib) {
    const uint64_t seg = mib * kMiB;
    const size_t n = static_cast<size_t>(std::clamp<uint64_t>(total_mib / mib, 4, 64));
    for (const std::string& name : backends) {
      std::unique_ptr<daemon::MemoryBackend> backend;
      if (name == "fake-device") {
        backend = daemon::make_fake_device_backend();
      } else if (name == "host") {
        backend = std::make_unique<daemon::HostBackend>();
      } else if (name == "cuda-vmm") {
        std::string why;
        auto b = daemon::make_backend("cuda-vmm", 0, why);
        if (!b.ok()) {
          std::printf("%-12s skipped: %s\n", name.c_str(), b.error().message.c_str());
          continue;
        }
        backend = std::move(b.value());
      } else {
        std::fprintf(stderr, "unknown backend '%s'\n", name.c_str());
        return 2;
      }
      if (!bench_backend(name.c_str(), *backend, seg, n)) return 1;
    }
    bench_core(seg, page_kib * 1024, n);
  }
  return 0;
}

// The GPU check of the host tier and of elastic pools: kvpoold owns an elastic pool with a host
// tier on a backend, worker processes attach and run the kernels on its pages through
// PoolKernels.
//
//   1. worker A computes a prompt's K/V into daemon pages and publishes them; an admin evict
//      demotes them to the host tier (pinned host memory on a GPU); worker B's lookup finds them
//      there (tier "host"), promoted into device pages, and B's decode over them equals its
//      decode over its own recomputation, page images byte for byte too;
//   2. promote and demote cost per page: lookups of 32 host-tier blocks against the same lookups
//      hitting the device tier, admin evicts of 32 pages against an evict without a host tier;
//   3. the pool grows by a segment and shrinks back (admin resize) while worker B holds the
//      prompt's pages below, which stay intact; grow and shrink latency per segment.
// Prints one line per check and a table; exits 0 when every check passed, 1 otherwise, 77 when
// a CUDA backend cannot start on a machine without an NVIDIA device node.
//
// Usage: kvpool_gpu_tier_check --kvpoold PATH --backend cuda-vmm|fake-device|host
//                              [--dtype bf16|fp16|int8|fp8_e4m3] [--daemon-log FILE]
// CI runs it on fake-device; tests/gpu/run.sh runs it on cuda-vmm.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "tests/gpu/pool_check_util.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::gpu_check {
namespace {

using client::Connection;
using Clock = std::chrono::steady_clock;

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%-6s %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// 256 pages of 128 KiB (bf16) in segments of 32 MiB, up to 1,024 pages; a host tier of 512.
std::string tier_config(const std::string& backend, const std::string& dtype) {
  return "backend: " + backend +
         "\npools:\n  - name: default\n    geometry: {layers: 2, kv_heads: 8, head_dim: 128, "
         "tokens_per_page: 16, dtype: " +
         dtype +
         "}\n    capacity: 256 pages\n    max_capacity: 1024 pages\n    segment_size: 32MiB\n"
         "    host_tier: 512 pages\n  - name: plain\n    geometry: {layers: 2, kv_heads: 8, "
         "head_dim: 128, tokens_per_page: 16, dtype: " +
         dtype + "}\n    capacity: 256 pages\n";
}

// Worker B: finds the prompt in the host tier, decodes over the promoted pages and compares with
// its own recomputation; then holds them while the pool grows and shrinks above them.
int reuse_from_host(const std::string& socket, std::vector<double>& grow_us,
                    std::vector<double>& shrink_us) {
  auto c = Connection::attach(socket, "worker-b");
  if (!c.ok()) return report(1, c.error().message);
  Connection& conn = *c.value();
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < kFullPages; ++i)
    chain.push_back(prompt_hash(i));
  auto hits = conn.lookup_with_tiers(chain);
  if (!hits.ok() || hits.value().pages.size() != kFullPages) return report(2, "prefix not hit");
  for (uint8_t t : hits.value().tiers) {
    if (t != wire::kTierHost) return report(3, "a block did not come from the host tier");
  }
  const std::vector<PageId> found = hits.value().pages;
  if (const int rc = check_reused_prompt(conn, found); rc != 0) return rc;
  std::vector<std::vector<std::byte>> images;
  for (const PageId p : found) {
    images.push_back(page_image(conn, p));
    if (images.back().empty()) return report(8, "a promoted page could not be read back");
  }

  // 3. Grow by a segment and shrink back, eight times, while these pages stay held.
  const uint32_t base = conn.pool().num_pages;
  for (int r = 0; r < 8; ++r) {
    auto t = Clock::now();
    auto g = conn.resize(base + 1);
    grow_us.push_back(us_since(t));
    if (!g.ok() || g.value() <= base) return report(9, "grow failed");
    t = Clock::now();
    auto s = conn.resize(base);
    shrink_us.push_back(us_since(t));
    if (!s.ok() || s.value() != base) return report(10, "shrink failed");
  }
  for (uint32_t i = 0; i < kFullPages; ++i) {
    const auto now = page_image(conn, found[i]);
    if (now.empty() || now != images[i]) return report(11, "a held page changed (or unreadable)");
  }
  return 0;
}

struct TierTiming {
  double promote_us = 0;  // per page, minus a device hit's lookup
  double demote_us = 0;   // per page, minus an evict without a host tier
};

// Caches 64 filler blocks, demotes them, then times promotions and demotions of 32 at a time.
int measure(const std::string& socket, TierTiming& out) {
  auto c = Connection::attach(socket, "timing");
  auto plain = Connection::attach(socket, "timing-plain", "plain");
  if (!c.ok() || !plain.ok()) return report(1, "attach failed");
  Connection& conn = *c.value();
  constexpr uint32_t kBatch = 32;
  auto filler = [](uint32_t i) { return BlockHash{0xF111'0000 + uint64_t{i}, i}; };
  auto cache = [&](Connection& to, uint32_t first, uint32_t n) {
    auto p = to.alloc(n);
    if (!p.ok()) return false;
    std::vector<PublishItem> items;
    for (uint32_t i = 0; i < n; ++i)
      items.push_back({p.value()[i], filler(first + i)});
    return to.publish(items).ok() && to.release(p.value()).ok();
  };
  if (!cache(conn, 0, 2 * kBatch) || !conn.evict(conn.pool().num_pages).ok())
    return report(2, "setup failed");
  std::vector<double> promote, hit, demote, evict;
  for (uint32_t r = 0; r < 16; ++r) {
    std::vector<BlockHash> chain;
    for (uint32_t i = 0; i < kBatch; ++i)
      chain.push_back(filler((r % 2) * kBatch + i));
    auto t = Clock::now();
    auto up = conn.lookup_with_tiers(chain);
    promote.push_back(us_since(t));
    if (!up.ok() || up.value().pages.size() != kBatch) return report(3, "promotion missed");
    t = Clock::now();
    auto again = conn.lookup(chain);
    hit.push_back(us_since(t));
    if (!again.ok() || !conn.release(again.value()).ok() || !conn.release(up.value().pages).ok())
      return report(4, "release failed");
    t = Clock::now();
    auto down = conn.evict(kBatch);
    demote.push_back(us_since(t));
    if (!down.ok() || down.value() != kBatch) return report(5, "demotion missed");
    if (!cache(*plain.value(), 1000 + r * kBatch, kBatch)) return report(6, "plain cache failed");
    t = Clock::now();
    auto e = plain.value()->evict(kBatch);
    evict.push_back(us_since(t));
    if (!e.ok()) return report(7, "plain evict failed");
  }
  out.promote_us = (median(promote) - median(hit)) / kBatch;
  out.demote_us = (median(demote) - median(evict)) / kBatch;
  return 0;
}

int run(const CheckOptions& o) {
  const std::string& backend = o.backend;
  const std::string& dtype = o.dtype;
  testing::Daemon d(tier_config(backend, dtype));
  keep_daemon_log_on_sigterm(d, o.daemon_log, "tier check " + backend + " " + dtype);
  if (const int rc = start_daemon(d, backend); rc != 0) {
    keep_daemon_log(d, o.daemon_log, "tier check " + backend + " " + dtype);
    return rc;
  }
  std::printf("tier check: backend %s, dtype %s, pages of %u layers x %u KV heads x %u x %u\n",
              backend.c_str(), dtype.c_str(), kLayers, kKvHeads, kHeadDim, kTokensPerPage);
  check(testing::run_worker([&] { return publish_prompt(d.socket(), true); }) == 0,
        "worker A appends a 100-token prompt and publishes 6 pages");
  {
    auto admin = Connection::attach(d.socket(), "admin", "", Connection::Memory::none);
    check(admin.ok() && admin.value()->evict(256).ok(), "an admin evict demotes them");
  }
  std::vector<double> grow_us, shrink_us;
  check(testing::run_worker([&] {
          const int rc = reuse_from_host(d.socket(), grow_us, shrink_us);
          std::printf("| grow one segment (32 MiB) | %.1f us |\n| shrink one segment | %.1f us |\n",
                      median(grow_us), median(shrink_us));
          std::fflush(stdout);
          return rc;
        }) == 0,
        "worker B's lookup promotes them from the host tier; its decode over them equals its "
        "recomputation; the pool grows and shrinks above them 8 times and they stay intact");
  TierTiming t;
  const int m = testing::run_worker([&] {
    const int rc = measure(d.socket(), t);
    std::printf("| promote, per page | %.2f us |\n| demote, per page | %.2f us |\n", t.promote_us,
                t.demote_us);
    std::fflush(stdout);
    return rc;
  });
  check(m == 0, "promote and demote timings");
  d.stop();
  keep_daemon_log(d, o.daemon_log, "tier check " + backend + " " + dtype);
  std::printf("\n%s: %d check(s) failed\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvpool::gpu_check

int main(int argc, char** argv) {
  kvpool::gpu_check::CheckOptions o;
  const int rc = kvpool::gpu_check::parse_check_options(argc, argv, "kvpool_gpu_tier_check",
                                                        "cuda-vmm|fake-device|host", o);
  return rc >= 0 ? rc : kvpool::gpu_check::run(o);
}

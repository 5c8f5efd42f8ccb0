// Shared pieces of the hardening tests (hardening_*_test.cpp): a small pool config, what the
// daemon says about its connections, its resident memory, and access for other uids.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {

// 64 pages of 16 KiB (2 layers × 2 KV heads × 16 tokens × head dim 64 × fp16 × K and V), and a
// socket every uid may open (the tests run workers under other uids).
inline constexpr char kHardeningPool[] = R"(
socket: {mode: "0666"}
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)";

// The scratch directory is 0700; let other uids reach the socket inside it.
inline void open_socket_dir(const Daemon& d) {
  namespace fs = std::filesystem;
  fs::permissions(fs::path(d.socket()).parent_path(),
                  fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
}

// The daemon-wide counters of the stats snapshot, asked through `c` (no segment lag).
inline stats::DaemonStats daemon_stats(client::Connection& c) {
  stats::Snapshot snap;
  auto r = c.snapshot();
  if (r.ok()) (void)stats::decode(r.value().bytes, r.value().layout_version, snap);
  return snap.daemon;
}

// Sanitizer builds: instrumented memcpy is many times slower, and resident memory does not say
// what the daemon holds (AddressSanitizer keeps freed memory in a 256 MiB quarantine,
// ThreadSanitizer keeps a heap of its own), so RSS checks apply to the release tree only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
inline constexpr bool kRssMeansHeld = !kSanitizedBuild;

// Resident memory of a process (VmRSS), in bytes; 0 when unreadable.
inline uint64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream v(line.substr(6));
    uint64_t kib = 0;
    v >> kib;
    return kib * 1024;
  }
  return 0;
}

// The block hash of test block `i`.
inline BlockHash test_hash(uint64_t i) {
  return BlockHash{0x5000 + i, 0xabcdef12345ull * (i + 1)};
}

}  // namespace kvpool::testing

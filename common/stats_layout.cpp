// Stats snapshot codec and seqlock (see stats_layout.h). Snapshots are copied as whole structs
// with memcpy: their layout is the byte layout (static_asserted, little-endian hosts only, as
// the wire protocol), so encoding is a handful of copies and decoding checks what a writer from
// another build could have got wrong: sizes, counts and that every name is terminated.
#include "common/stats_layout.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <thread>

namespace kvpool::stats {

static_assert(std::endian::native == std::endian::little);

namespace {

constexpr size_t kVersionOffset = offsetof(SegmentHeader, version);
constexpr int kReadAttempts = 10000;

uint64_t* word_at(std::byte* p) {
  return reinterpret_cast<uint64_t*>(p);
}
const uint64_t* word_at(const std::byte* p) {
  return reinterpret_cast<const uint64_t*>(p);
}

bool terminated(const char* field, size_t n) {
  return std::memchr(field, '\0', n) != nullptr;
}

}  // namespace

std::string_view Snapshot::pool_name(size_t i) const {
  return std::string_view(pools[i].name, std::min<size_t>(pools[i].name_len, kNameBytes));
}

std::string_view Snapshot::backend(size_t i) const {
  return std::string_view(pools[i].backend);
}

const PoolStats* Snapshot::find_pool(std::string_view name) const {
  if (pools.empty()) return nullptr;
  if (name.empty()) return &pools.front();
  for (size_t i = 0; i < pools.size(); ++i) {
    if (pool_name(i) == name) return &pools[i];
  }
  return nullptr;
}

uint32_t latency_bucket(uint64_t ns) {
  if (ns <= (uint64_t{1} << kFirstBucketLog2)) return 0;
  const auto b = static_cast<uint32_t>(std::bit_width(ns - 1)) - kFirstBucketLog2;
  return std::min(b, kLatencyBuckets - 1);
}

uint64_t bucket_upper_ns(uint32_t i) {
  return i + 1 < kLatencyBuckets ? uint64_t{1} << (kFirstBucketLog2 + i) : 0;
}

void record(OpLatency& h, uint64_t ns) {
  ++h.count;
  h.sum_ns += ns;
  h.max_ns = std::max(h.max_ns, ns);
  ++h.buckets[latency_bucket(ns)];
}

double quantile_ns(const OpLatency& h, double q) {
  if (h.count == 0) return 0;
  const double rank = std::max(1.0, std::ceil(q * static_cast<double>(h.count)));
  uint64_t seen = 0;
  for (uint32_t i = 0; i < kLatencyBuckets; ++i) {
    if (h.buckets[i] == 0) continue;
    const double before = static_cast<double>(seen);
    seen += h.buckets[i];
    if (static_cast<double>(seen) < rank) continue;
    const double hi = i + 1 < kLatencyBuckets ? static_cast<double>(bucket_upper_ns(i))
                                              : static_cast<double>(h.max_ns);
    const double lo = i == 0 ? 1.0 : static_cast<double>(bucket_upper_ns(i - 1));
    // Geometric interpolation: the buckets are log-spaced.
    const double frac = (rank - before) / static_cast<double>(h.buckets[i]);
    const double estimate = lo * std::pow(std::max(hi, lo) / lo, frac);
    return std::min(estimate, static_cast<double>(h.max_ns));
  }
  return static_cast<double>(h.max_ns);
}

void encode(const Snapshot& s, std::vector<std::byte>& out) {
  out.resize(snapshot_bytes(s.pools.size()));
  std::byte* p = out.data();
  DaemonStats d = s.daemon;
  d.num_pools = static_cast<uint32_t>(s.pools.size());
  std::memcpy(p, &d, sizeof d);
  p += sizeof d;
  std::memcpy(p, s.service, sizeof s.service);
  p += sizeof s.service;
  std::memcpy(p, s.request, sizeof s.request);
  p += sizeof s.request;
  if (!s.pools.empty()) std::memcpy(p, s.pools.data(), s.pools.size() * sizeof(PoolStats));
}

std::string decode(std::span<const std::byte> bytes, uint32_t layout_version, Snapshot& out) {
  if (layout_version != kLayoutVersion) {
    return "stats layout version " + std::to_string(layout_version) + " is not the " +
           std::to_string(kLayoutVersion) + " this build reads";
  }
  if (bytes.size() < kSnapshotFixedBytes ||
      (bytes.size() - kSnapshotFixedBytes) % sizeof(PoolStats) != 0) {
    return "stats snapshot of " + std::to_string(bytes.size()) + " bytes is not " +
           std::to_string(kSnapshotFixedBytes) + " + n × " + std::to_string(sizeof(PoolStats));
  }
  const size_t pools = (bytes.size() - kSnapshotFixedBytes) / sizeof(PoolStats);
  const std::byte* p = bytes.data();
  std::memcpy(&out.daemon, p, sizeof out.daemon);
  p += sizeof out.daemon;
  if (out.daemon.num_pools != pools || pools > kMaxPools) {
    return "stats snapshot says " + std::to_string(out.daemon.num_pools) + " pools but holds " +
           std::to_string(pools);
  }
  std::memcpy(out.service, p, sizeof out.service);
  p += sizeof out.service;
  std::memcpy(out.request, p, sizeof out.request);
  p += sizeof out.request;
  out.pools.resize(pools);
  if (pools != 0) std::memcpy(out.pools.data(), p, pools * sizeof(PoolStats));
  for (uint32_t i = 0; i < kMaxOps; ++i) {
    if (!terminated(out.service[i].name, sizeof out.service[i].name) ||
        !terminated(out.request[i].name, sizeof out.request[i].name)) {
      return "stats snapshot: the name of opcode " + std::to_string(i) + " is not terminated";
    }
  }
  for (size_t i = 0; i < pools; ++i) {
    if (out.pools[i].name_len > kNameBytes ||
        !terminated(out.pools[i].backend, sizeof out.pools[i].backend) ||
        !terminated(out.pools[i].policy, sizeof out.pools[i].policy)) {
      return "stats snapshot: pool " + std::to_string(i) +
             " has a malformed name, backend or policy";
    }
  }
  return {};
}

void seqlock_init(std::byte* segment, size_t snapshot_size) {
  SegmentHeader h;
  h.snapshot_bytes = snapshot_size;
  std::memcpy(segment, &h, sizeof h);
}

void seqlock_write(std::byte* segment, std::span<const std::byte> snapshot) {
  uint64_t* version = word_at(segment + kVersionOffset);
  const uint64_t v = __atomic_load_n(version, __ATOMIC_RELAXED);
  __atomic_store_n(version, v + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);  // the odd version is visible before any new word
  uint64_t* dst = word_at(segment + sizeof(SegmentHeader));
  for (size_t i = 0; i < snapshot.size() / 8; ++i) {
    uint64_t w = 0;
    std::memcpy(&w, snapshot.data() + i * 8, 8);
    __atomic_store_n(dst + i, w, __ATOMIC_RELAXED);
  }
  __atomic_store_n(version, v + 2, __ATOMIC_RELEASE);
}

std::string seqlock_read(const std::byte* segment, size_t segment_size,
                         std::vector<std::byte>& out) {
  if (segment_size < sizeof(SegmentHeader)) return "the stats segment is too small";
  // The fields before `version` never change after the daemon made the segment; `version` is
  // written concurrently and only ever read atomically below.
  SegmentHeader h;
  std::memcpy(static_cast<void*>(&h), segment, offsetof(SegmentHeader, version));
  if (h.magic != kSegmentMagic) return "the stats segment has the wrong magic";
  if (h.layout_version != kLayoutVersion) {
    return "the stats segment has layout " + std::to_string(h.layout_version) + ", not " +
           std::to_string(kLayoutVersion);
  }
  if (h.header_bytes != sizeof(SegmentHeader) || h.snapshot_bytes % 8 != 0 ||
      h.snapshot_bytes > segment_size - sizeof(SegmentHeader)) {
    return "the stats segment's header does not match its size";
  }
  const uint64_t* version = word_at(segment + kVersionOffset);
  const uint64_t* src = word_at(segment + sizeof(SegmentHeader));
  const size_t words = h.snapshot_bytes / 8;
  out.resize(h.snapshot_bytes);
  for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
    const uint64_t v1 = __atomic_load_n(version, __ATOMIC_ACQUIRE);
    if (v1 == 0) return "the daemon has not published a snapshot yet";
    if (v1 % 2 != 0) {
      std::this_thread::yield();
      continue;
    }
    for (size_t i = 0; i < words; ++i) {
      const uint64_t w = __atomic_load_n(src + i, __ATOMIC_RELAXED);
      std::memcpy(out.data() + i * 8, &w, 8);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the copy is done before the version is re-read
    if (__atomic_load_n(version, __ATOMIC_RELAXED) == v1) return {};
  }
  return "the stats segment was being rewritten on every attempt";
}

}  // namespace kvpool::stats

// The daemon's stats snapshot: its byte layout, shared by kvpoold (which writes it into a
// read-only shared-memory segment and answers the snapshot op with the same bytes), kvpoolctl
// and the metrics endpoint (which read it).
//
// Segment = SegmentHeader (64 bytes) + snapshot. Snapshot = DaemonStats + kMaxOps OpLatency for
// the time inside the service ("service") + kMaxOps OpLatency from a frame's arrival to its reply
// being queued ("request") + num_pools × PoolStats. Every struct is plain data: fixed-width
// little-endian integers and NUL-padded character arrays, no pointers, sizes static_asserted and
// multiples of 8 bytes; kLayoutVersion changes whenever any of it does, and readers refuse a
// version they do not know.
//
// Seqlock: the header's `version` word is odd while the single writer (the daemon's event loop)
// rewrites the snapshot and even when it is whole. A reader copies the snapshot between two
// reads of an equal even version, retrying a bounded number of times; it never writes, so a
// reader can neither block nor corrupt the writer. Every word is accessed with relaxed atomic
// loads and stores plus fences, so a torn copy is detected, never acted upon.
//
// Latency histograms: bucket i < kLatencyBuckets − 1 counts durations in (2^(7+i), 2^(8+i)] ns
// (bucket 0 is everything up to 256 ns), the last bucket everything above 2^30 ns (~1.07 s).
//
// Thread-safety: plain values; seqlock_write from one thread, seqlock_read from any.
// Error policy: decode() and seqlock_read() say what is wrong instead of throwing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvpool::stats {

inline constexpr uint64_t kSegmentMagic = 0x3153544154534B56;  // bytes "VKSTATS1"
// 3: PoolStats::layout, the KV-event batch counters; 4: the host tier's and elastic pools' words
// in PoolStats; 5: the geometry's attention kind and window in PoolStats.
inline constexpr uint32_t kLayoutVersion = 8;
inline constexpr uint32_t kMaxOps = 32;  // histograms indexed by opcode number 0..31
inline constexpr uint32_t kLatencyBuckets = 24;
inline constexpr uint32_t kFirstBucketLog2 = 8;  // bucket 0 ends at 256 ns
inline constexpr uint32_t kNameBytes = 256;      // = wire::kMaxNameBytes
inline constexpr uint32_t kMaxPools = 4096;      // bound a reader accepts

struct SegmentHeader {
  uint64_t magic = kSegmentMagic;
  uint32_t layout_version = kLayoutVersion;
  uint32_t header_bytes = sizeof(SegmentHeader);
  uint64_t snapshot_bytes = 0;
  uint64_t version = 0;  // seqlock: odd while being written; 0 = nothing published yet
  uint64_t reserved[4] = {};
};
static_assert(sizeof(SegmentHeader) == 64);

struct DaemonStats {
  uint64_t pid = 0;
  uint64_t start_unix_ms = 0;      // wall clock at start
  uint64_t published_mono_ns = 0;  // CLOCK_MONOTONIC when this snapshot was taken
  uint64_t uptime_ms = 0;
  uint32_t sessions = 0;  // open connections, attached or not
  uint32_t num_pools = 0;
  uint32_t subscribers = 0;
  uint32_t latency_enabled = 0;
  uint64_t stream_id = 0;  // the event stream's id (changes with every start)
  uint64_t event_next_seq = 0;
  uint64_t event_oldest_seq = 0;
  uint64_t event_capacity = 0;
  uint64_t events_lost = 0;  // sequence numbers skipped by gap markers, all subscribers
  uint64_t reloads = 0;
  uint64_t reload_failures = 0;
  // Connection limits (docs/ARCHITECTURE.md, "Limits"); layout version 1 kept these words zero.
  uint64_t buffered_bytes = 0;    // all connections' input and output buffers
  uint64_t sessions_refused = 0;  // connections refused at accept (session limits, tenants)
  uint64_t closed_by_limits = 0;  // connections closed by a deadline, a timeout or the budget
  // KV events for routers over ZeroMQ (events.zmq_endpoint; zero when off). Layout version 3.
  uint64_t kv_batches_published = 0;  // batches handed to libzmq
  uint64_t kv_batches_dropped = 0;    // batches libzmq refused (not sent to any subscriber)
};
static_assert(sizeof(DaemonStats) == 144);

struct OpLatency {
  char name[16] = {};  // the operation ("" when the opcode names none); NUL-padded
  uint64_t count = 0;
  uint64_t sum_ns = 0;
  uint64_t max_ns = 0;
  uint64_t buckets[kLatencyBuckets] = {};  // not cumulative
};
static_assert(sizeof(OpLatency) == 232);

struct PoolStats {
  char name[kNameBytes] = {};  // name_len bytes, NUL-padded
  char backend[16] = {};       // NUL-terminated
  uint32_t name_len = 0;
  uint32_t dtype = 0;  // KvDtype
  uint32_t layers = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t tokens_per_page = 0;
  uint32_t total = 0;
  uint32_t free = 0;
  uint32_t in_use = 0;
  uint32_t cached = 0;
  uint32_t sessions = 0;  // sessions attached to this pool
  uint32_t indexed = 0;   // blocks in the prefix index
  int32_t device = -1;    // the daemon's CUDA ordinal; −1: host memory
  uint32_t segments = 0;  // memory segments the pool is made of
  uint64_t page_stride = 0;
  uint64_t segment_bytes = 0;
  uint64_t lookups = 0;
  uint64_t lookup_blocks = 0;
  uint64_t hit_blocks = 0;
  uint64_t allocated = 0;
  uint64_t released = 0;
  uint64_t published = 0;
  uint64_t duplicates = 0;
  uint64_t evicted = 0;
  uint64_t flushed = 0;
  char policy[16] = {};        // the eviction policy's name, NUL-terminated
  uint32_t pinned = 0;         // pages a client pin holds, any state
  uint32_t pinned_cached = 0;  // of the cached pages, those a pin keeps from eviction
  uint64_t pins = 0;           // pins set or extended
  uint64_t pins_expired = 0;   // pins that ran out
  uint32_t layout = 0;         // KvLayout
  uint32_t host_slots = 0;     // the host tier's capacity in pages; 0 = no host tier
  // The host tier (daemon/memory/host_tier_store.h). Layout version 4.
  uint32_t host_held = 0;        // blocks it holds now
  uint32_t host_unused = 0;      // keeps the words below 8-byte aligned
  uint64_t host_bytes = 0;       // its memory
  uint64_t host_demoted = 0;     // blocks copied down from the pool
  uint64_t host_promoted = 0;    // blocks copied back up by lookups (host-tier hits)
  uint64_t host_dropped = 0;     // blocks it evicted to make room
  uint64_t host_demote_ns = 0;   // time spent copying down, in all
  uint64_t host_promote_ns = 0;  // time spent copying up, in all
  uint64_t host_copy_failures = 0;
  // Elastic pools (max_capacity; zeros for a fixed pool). Layout version 4.
  uint32_t min_pages = 0;
  uint32_t max_pages = 0;    // = total for a fixed pool
  uint64_t grows = 0;        // segments added
  uint64_t shrinks = 0;      // segments given back
  uint32_t epoch = 0;        // the segment list's version
  uint32_t history_len = 0;  // entries of history in use, ≤ kResizeHistory
  struct Resize {
    uint64_t unix_ms = 0;
    uint32_t pages = 0;  // the pool's size after this resize
    uint32_t unused = 0;
  };
  static constexpr size_t kResizeHistory = 8;
  Resize history[kResizeHistory] = {};  // the last resizes, oldest first
  // The geometry's attention kind (AttentionKind) and window. Layout version 5.
  uint32_t kind = 0;
  uint32_t window = 0;
  // Block-table entries static reservations hold (reserve). Layout version 6.
  uint64_t reserved = 0;
  // Precision before eviction (convert_evictions_to; daemon/pool/eviction_converter.h; zeros
  // without). Layout version 7.
  uint32_t convert_into = 0;  // the 8-bit pool's index among the pools + 1; 0 = none
  uint32_t convert_unused = 0;
  uint64_t converted = 0;           // evicted blocks converted into it
  uint64_t convert_duplicates = 0;  // evicted blocks it held already
  uint64_t convert_skipped = 0;     // evicted blocks lost (no page there, a flush, ...)
  uint64_t convert_failures = 0;    // conversion batches that failed
  uint64_t convert_ns = 0;          // time spent converting, in all
  uint64_t converted_back = 0;      // blocks lookups found there, converted back into the pool
  // The remote tier on Redis Cluster (remote_tier; daemon/remote/remote_tier.h; zeros without).
  // Layout version 8.
  // 1: the pool has one (write: on_publish), 2: one it only reads (write: off), 3: one it
  // writes as its device tier evicts (write: on_demote).
  uint32_t remote_tier = 0;
  uint32_t remote_nodes = 0;          // masters in its slot map
  uint32_t remote_reachable = 0;      // of them, not failed within the last second
  uint32_t remote_slots = 0;          // slots the map gives a master (16384 when whole)
  uint64_t remote_lookups = 0;        // lookups that asked the cluster
  uint64_t remote_hits = 0;           // blocks fetched and promoted into the pool
  uint64_t remote_misses = 0;         // lookups that asked and found nothing usable
  uint64_t remote_skipped = 0;        // lookups not asked: the cluster was unreachable
  uint64_t remote_rejected = 0;       // values refused: another geometry or block, a bad checksum
  uint64_t remote_stored = 0;         // blocks written
  uint64_t remote_store_skipped = 0;  // blocks not written: no staging memory free, or down
  uint64_t remote_store_failed = 0;   // blocks whose write failed
  uint64_t remote_fetch_failed = 0;   // keys whose read failed (a node down, a timeout)
  uint64_t remote_fetch_ns = 0;       // time in read batches, in all
  uint64_t remote_store_ns = 0;       // time in write batches, in all
  uint64_t remote_fetch_batches = 0;
  uint64_t remote_store_batches = 0;
};
static_assert(sizeof(PoolStats) == 880);

// A decoded snapshot.
struct Snapshot {
  DaemonStats daemon;
  OpLatency service[kMaxOps];
  OpLatency request[kMaxOps];
  std::vector<PoolStats> pools;

  std::string_view pool_name(size_t i) const;
  std::string_view backend(size_t i) const;
  // The pool named `name` ("" = the first); nullptr when there is none.
  const PoolStats* find_pool(std::string_view name) const;
};

inline constexpr size_t kSnapshotFixedBytes =
    sizeof(DaemonStats) + size_t{2} * kMaxOps * sizeof(OpLatency);
static_assert(kSnapshotFixedBytes % 8 == 0 && sizeof(PoolStats) % 8 == 0);

inline constexpr size_t snapshot_bytes(size_t num_pools) {
  return kSnapshotFixedBytes + num_pools * sizeof(PoolStats);
}

// Copies `text` into a NUL-padded field of N bytes, cut to fit (N − 1 bytes when the field must
// stay NUL-terminated).
template <size_t N>
void set_name(char (&field)[N], std::string_view text, bool terminated = true) {
  const size_t n = std::min(text.size(), terminated ? N - 1 : N);
  for (size_t i = 0; i < N; ++i)
    field[i] = i < n ? text[i] : '\0';
}

// The histogram bucket of a duration; the upper bound of bucket i in ns (0 for the last, which
// has none).
uint32_t latency_bucket(uint64_t ns);
uint64_t bucket_upper_ns(uint32_t i);
// Records one duration into a histogram.
void record(OpLatency& h, uint64_t ns);
// An estimate of the q-quantile (0 < q ≤ 1) in ns: the bucket holding it, interpolated
// geometrically inside the bucket and never above the recorded maximum; 0 without samples.
double quantile_ns(const OpLatency& h, double q);

// Snapshot ↔ bytes (the segment's snapshot part, the snapshot op's payload).
void encode(const Snapshot& s, std::vector<std::byte>& out);
// "" when `bytes` is a whole snapshot of `layout_version` with consistent counts and names;
// otherwise what is wrong (and `out` is unspecified).
std::string decode(std::span<const std::byte> bytes, uint32_t layout_version, Snapshot& out);

// Seqlock over a mapped segment (SegmentHeader at offset 0, snapshot after it).
// The writer: `segment` has room for the header and snapshot.size() bytes.
void seqlock_init(std::byte* segment, size_t snapshot_size);
void seqlock_write(std::byte* segment, std::span<const std::byte> snapshot);
// A reader: copies the newest whole snapshot of a segment of `segment_size` bytes into `out`.
// "" on success, else why not (wrong magic or layout, nothing published yet, always mid-write).
std::string seqlock_read(const std::byte* segment, size_t segment_size,
                         std::vector<std::byte>& out);

}  // namespace kvpool::stats

// The counter tables: every counter and gauge kvpoold reports, once. KVPOOL_POOL_COUNTERS holds a
// pool's (stats::PoolStats), KVPOOL_DAEMON_COUNTERS the daemon's (stats::DaemonStats). Columns:
//   field   its name, the same in stats::PoolStats (and, for the core's own, in
//           core::PoolCounters), and the key in every surface that names counters
//   kind    counter (only grows while the daemon runs) or gauge
//   source  core: the page core counts it (daemon/core/page_pool.h; copied into the snapshot by
//           this table); pool: the rest of the pool (pins, index, elastic size, host tier),
//           filled in by PoolRuntime::fill_stats; daemon: the daemon's parts (sessions,
//           events, reloads), filled in by Service::fill_daemon
//   form    how Prometheus shows it: as_is; as_tokens (× the pool's tokens_per_page);
//           ms_as_seconds; by_hand (common/prometheus.cpp: in a family shared with its kin under a
//           label, or reckoned from the value); none (not shown)
//   family  its Prometheus family ("" for form none)
//   help    what it counts
// From the pool table follow: the copy of the core's counters into the snapshot, the stats reply's
// counter list, the Prometheus families, the C API's kvpool_counter_* calls, the keys of
// Python's Connection.stats() and kvpoolctl stats' "counters". From the daemon table: the stats
// reply's daemon list, the Prometheus families, kvpool_daemon_counter_*, Python's
// Connection.daemon_stats() and kvpoolctl stats' "daemon_counters".
// tests/integration/counters_test.cpp walks both tables through every one of them.
//
// Rows are only ever appended, at the end, whatever their source: the stats reply carries the
// values in table order, so a client reads the counters it knows from a daemon whose table is
// longer. A row needs a PoolStats (DaemonStats) field, which changes the stats segment's layout:
// the static_asserts below hold kLayoutVersion, and the last row, to the tables.
#pragma once

#include <cstdint>
#include <iterator>
#include <string_view>

#include "common/stats_layout.h"

namespace kvpool::stats {

#define KVPOOL_POOL_COUNTERS(X)                                                                    \
  X(lookups, counter, core, as_is, "kvpool_lookups_total", "Prefix lookup calls.")                 \
  X(lookup_blocks, counter, core, as_tokens, "kvpool_prefix_query_tokens_total",                   \
    "Tokens asked for by prefix lookups.")                                                         \
  X(hit_blocks, counter, core, as_tokens, "kvpool_prefix_hit_tokens_total",                        \
    "Tokens found cached by prefix lookups.")                                                      \
  X(allocated, counter, core, as_is, "kvpool_pages_allocated_total", "Pages handed out by alloc.") \
  X(released, counter, core, as_is, "kvpool_page_references_released_total",                       \
    "References dropped by release and by closing sessions.")                                      \
  X(published, counter, core, as_is, "kvpool_pages_published_total", "Pages published (stored).")  \
  X(duplicates, counter, core, as_is, "kvpool_publish_duplicates_total",                           \
    "Publishes answered with a page another worker published first.")                              \
  X(evicted, counter, core, as_is, "kvpool_evictions_total",                                       \
    "Cached pages evicted (by alloc or evict).")                                                   \
  X(flushed, counter, core, as_is, "kvpool_pages_flushed_total", "Cached pages dropped by flush.") \
  X(pins, counter, core, as_is, "kvpool_pins_total", "Pins set or extended by clients.")           \
  X(pins_expired, counter, core, as_is, "kvpool_pins_expired_total", "Pins that ran out.")         \
  X(pinned, gauge, pool, as_is, "kvpool_pinned_pages", "Pages a client pin keeps (any state).")    \
  X(pinned_cached, gauge, pool, as_is, "kvpool_pinned_cached_pages",                               \
    "Cached pages a client pin keeps from eviction.")                                              \
  X(indexed, gauge, pool, as_is, "kvpool_indexed_blocks", "Blocks in the prefix index.")           \
  X(max_pages, gauge, pool, as_is, "kvpool_pool_max_pages",                                        \
    "Pages the pool may grow to (its size, for a fixed pool).")                                    \
  X(grows, counter, pool, by_hand, "kvpool_pool_resizes_total",                                    \
    "Segments an elastic pool added (grow) or gave back (shrink).")                                \
  X(shrinks, counter, pool, by_hand, "kvpool_pool_resizes_total",                                  \
    "Segments an elastic pool added (grow) or gave back (shrink).")                                \
  X(host_slots, gauge, pool, as_is, "kvpool_host_tier_capacity_pages",                             \
    "Pages the pool's host tier can hold (0: no host tier).")                                      \
  X(host_held, gauge, pool, as_is, "kvpool_host_tier_blocks",                                      \
    "Blocks the pool's host tier holds.")                                                          \
  X(host_demoted, counter, pool, as_is, "kvpool_host_tier_demoted_total",                          \
    "Blocks the pool evicted that were copied down to its host tier.")                             \
  X(host_promoted, counter, pool, as_is, "kvpool_host_tier_promoted_total",                        \
    "Host-tier hits copied back into pool pages by lookups.")                                      \
  X(host_dropped, counter, pool, as_is, "kvpool_host_tier_dropped_total",                          \
    "Blocks the host tier evicted to make room.")                                                  \
  X(host_demote_ns, counter, pool, by_hand, "kvpool_host_tier_copy_seconds_total",                 \
    "Time spent copying between the pool and its host tier, by direction.")                        \
  X(host_promote_ns, counter, pool, by_hand, "kvpool_host_tier_copy_seconds_total",                \
    "Time spent copying between the pool and its host tier, by direction.")                        \
  X(host_copy_failures, counter, pool, as_is, "kvpool_host_tier_copy_failures_total",              \
    "Copies between the pool and its host tier that failed (their blocks were dropped).")          \
  X(reserved, gauge, pool, as_is, "kvpool_reserved_pages",                                         \
    "Block-table entries static reservations hold (their pages stay in use).")                     \
  X(converted, counter, pool, as_is, "kvpool_evictions_converted_total",                           \
    "Blocks the pool evicted that were converted into its 8-bit pool (convert_evictions_to).")     \
  X(convert_duplicates, counter, pool, as_is, "kvpool_evictions_convert_duplicates_total",         \
    "Blocks the pool evicted that its 8-bit pool already held (not converted again).")             \
  X(convert_skipped, counter, pool, as_is, "kvpool_evictions_convert_skipped_total",               \
    "Blocks the pool evicted and lost all the same: no 8-bit page to be had, or a flush, a "       \
    "shrink "                                                                                      \
    "or a busy host tier of the 8-bit pool meanwhile.")                                            \
  X(convert_failures, counter, pool, as_is, "kvpool_evictions_convert_failures_total",             \
    "Conversion batches between the pool and its 8-bit pool that failed (blocks not served).")     \
  X(converted_back, counter, pool, as_is, "kvpool_evictions_converted_back_total",                 \
    "Blocks lookups found in the pool's 8-bit pool and got converted back into the pool.")         \
  X(remote_reachable, gauge, pool, as_is, "kvpool_remote_tier_nodes_reachable",                    \
    "Masters of the remote tier's cluster that answer (0 with no remote tier).")                   \
  X(remote_slots, gauge, pool, as_is, "kvpool_remote_tier_slots_covered",                          \
    "Cluster slots the remote tier's slot map gives a master (16384 when whole).")                 \
  X(remote_lookups, counter, pool, as_is, "kvpool_remote_tier_lookups_total",                      \
    "Lookups that missed locally and asked the remote tier.")                                      \
  X(remote_hits, counter, pool, as_is, "kvpool_remote_tier_hit_blocks_total",                      \
    "Blocks the remote tier served, fetched and copied into pool pages.")                          \
  X(remote_misses, counter, pool, as_is, "kvpool_remote_tier_misses_total",                        \
    "Lookups that asked the remote tier and found nothing usable.")                                \
  X(remote_skipped, counter, pool, as_is, "kvpool_remote_tier_skipped_total",                      \
    "Lookups that did not ask the remote tier: its cluster was unreachable (degraded to local).")  \
  X(remote_rejected, counter, pool, as_is, "kvpool_remote_tier_rejected_total",                    \
    "Remote values refused: another geometry or block, or a bad checksum (never served).")         \
  X(remote_stored, counter, pool, as_is, "kvpool_remote_tier_stored_total",                        \
    "Blocks written to the remote tier.")                                                          \
  X(remote_store_skipped, counter, pool, as_is, "kvpool_remote_tier_store_skipped_total",          \
    "Blocks not written to the remote tier: its staging memory was full or it was unreachable.")   \
  X(remote_store_failed, counter, pool, as_is, "kvpool_remote_tier_store_failures_total",          \
    "Blocks whose write to the remote tier failed (a node down, out of memory, a timeout).")       \
  X(remote_fetch_failed, counter, pool, as_is, "kvpool_remote_tier_fetch_failures_total",          \
    "Keys whose read from the remote tier failed (a node down, a timeout).")

// The daemon's rows, in DaemonStats order.
#define KVPOOL_DAEMON_COUNTERS(X)                                                            \
  X(pid, gauge, daemon, none, "", "The daemon's process id.")                                \
  X(start_unix_ms, gauge, daemon, ms_as_seconds, "kvpool_start_time_seconds",                \
    "When the daemon started, in Unix seconds.")                                             \
  X(published_mono_ns, gauge, daemon, none, "",                                              \
    "CLOCK_MONOTONIC when these figures were taken, in ns.")                                 \
  X(uptime_ms, gauge, daemon, ms_as_seconds, "kvpool_uptime_seconds",                        \
    "Seconds since the daemon started.")                                                     \
  X(sessions, gauge, daemon, as_is, "kvpool_connections",                                    \
    "Open connections to the daemon, attached or not.")                                      \
  X(num_pools, gauge, daemon, as_is, "kvpool_pools", "Pools the daemon serves.")             \
  X(subscribers, gauge, daemon, as_is, "kvpool_event_subscribers",                           \
    "Connections following the event stream.")                                               \
  X(latency_enabled, gauge, daemon, none, "", "1 when the daemon times operations.")         \
  X(stream_id, gauge, daemon, none, "", "The event stream's id (new with every start).")     \
  X(event_next_seq, counter, daemon, by_hand, "kvpool_events_total",                         \
    "The sequence number of the next index event: events logged + 1.")                       \
  X(event_oldest_seq, gauge, daemon, none, "", "The oldest event the stream still holds.")   \
  X(event_capacity, gauge, daemon, none, "", "Events the stream holds for subscribers.")     \
  X(events_lost, counter, daemon, as_is, "kvpool_events_lost_total",                         \
    "Events subscribers fell behind on (reported to them as gaps).")                         \
  X(reloads, counter, daemon, by_hand, "kvpool_reloads_total",                               \
    "Configuration reloads, applied or refused.")                                            \
  X(reload_failures, counter, daemon, by_hand, "kvpool_reloads_total",                       \
    "Configuration reloads refused.")                                                        \
  X(buffered_bytes, gauge, daemon, as_is, "kvpool_buffered_bytes",                           \
    "Bytes in all connections' input and output buffers (limits.max_buffered_bytes).")       \
  X(sessions_refused, counter, daemon, as_is, "kvpool_sessions_refused_total",               \
    "Connections refused at accept (session limits, unknown peers).")                        \
  X(closed_by_limits, counter, daemon, as_is, "kvpool_connections_closed_by_limits_total",   \
    "Connections closed by the hello deadline, the frame timeout or the buffer budget.")     \
  X(kv_batches_published, counter, daemon, as_is, "kvpool_kv_event_batches_published_total", \
    "KV event batches published to routers over ZeroMQ (events.zmq_endpoint).")              \
  X(kv_batches_dropped, counter, daemon, as_is, "kvpool_kv_event_batches_dropped_total",     \
    "KV event batches libzmq refused to send (subscribers see a sequence gap).")

enum class CounterKind : uint8_t { counter, gauge };
enum class PromForm : uint8_t { as_is, as_tokens, ms_as_seconds, by_hand, none };

// One row of a table over Stats (PoolStats or DaemonStats).
template <class Stats>
struct Counter {
  std::string_view name;
  CounterKind kind;
  PromForm form;
  std::string_view family;
  std::string_view help;
  uint64_t (*get)(const Stats&);
};
using PoolCounter = Counter<PoolStats>;
using DaemonCounter = Counter<DaemonStats>;

#define KVPOOL_COUNTER_ROW(Stats, field, kind_, form_, family_, help_) \
  Counter<Stats>{                                                      \
      #field,          CounterKind::kind_,                             \
      PromForm::form_, family_,                                        \
      help_,           [](const Stats& s) -> uint64_t { return static_cast<uint64_t>(s.field); }},
#define KVPOOL_POOL_ROW(field, kind, source, form, family, help) \
  KVPOOL_COUNTER_ROW(PoolStats, field, kind, form, family, help)
#define KVPOOL_DAEMON_ROW(field, kind, source, form, family, help) \
  KVPOOL_COUNTER_ROW(DaemonStats, field, kind, form, family, help)
inline constexpr PoolCounter kPoolCounters[] = {KVPOOL_POOL_COUNTERS(KVPOOL_POOL_ROW)};
inline constexpr DaemonCounter kDaemonCounters[] = {KVPOOL_DAEMON_COUNTERS(KVPOOL_DAEMON_ROW)};
#undef KVPOOL_DAEMON_ROW
#undef KVPOOL_POOL_ROW
#undef KVPOOL_COUNTER_ROW
inline constexpr size_t kNumPoolCounters = std::size(kPoolCounters);
inline constexpr size_t kNumDaemonCounters = std::size(kDaemonCounters);

// A row more is a PoolStats field more: raise kLayoutVersion, then these figures.
static_assert(kNumPoolCounters == 42 && sizeof(PoolStats) == 880 && kLayoutVersion == 8,
              "the counter table and PoolStats changed: raise kLayoutVersion");
static_assert(kPoolCounters[kNumPoolCounters - 1].name == "remote_fetch_failed",
              "rows are appended at the end of the table");
static_assert(kNumDaemonCounters == 20 && sizeof(DaemonStats) == 144 && kLayoutVersion == 8,
              "the daemon table and DaemonStats changed: raise kLayoutVersion");
static_assert(kDaemonCounters[kNumDaemonCounters - 1].name == "kv_batches_dropped",
              "rows are appended at the end of the table");

// The row named `name` (a constant expression for the names of the table).
constexpr const PoolCounter& pool_counter(std::string_view name) {
  for (const PoolCounter& c : kPoolCounters) {
    if (c.name == name) return c;
  }
  return kPoolCounters[0];  // never reached for a name of the table
}
constexpr const DaemonCounter& daemon_counter(std::string_view name) {
  for (const DaemonCounter& c : kDaemonCounters) {
    if (c.name == name) return c;
  }
  return kDaemonCounters[0];  // never reached for a name of the table
}

}  // namespace kvpool::stats

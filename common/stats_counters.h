// The pool counter table: every counter and gauge of a pool that kvpoold reports, once. Columns:
//   field   its name, the same in stats::PoolStats (and, for the core's own, in
//           core::PoolCounters), and the key in every surface that names counters
//   kind    counter (only grows while the daemon runs) or gauge
//   source  core: the page core counts it (daemon/core/page_pool.h; copied into the snapshot by
//           this table); pool: the rest of the pool (pins, index, elastic size, host tier),
//           filled in by PoolRuntime::fill_stats
//   form    how Prometheus shows it: as_is; as tokens (× the pool's tokens_per_page); or by hand
//           in a family shared with its kin under a label (common/prometheus.cpp)
//   family  its Prometheus family
//   help    what it counts
// From the table follow: the copy of the core's counters into the snapshot, the stats reply's
// counter list, the Prometheus families, the C API's kvpool_counter_* calls, the keys of
// Python's Connection.stats() and kvpoolctl stats' "counters". A test walks the table through
// every one of them.
//
// Rows are only ever appended, at the end, whatever their source: the stats reply carries the
// values in table order, so a client reads the counters it knows from a daemon whose table is
// longer. A row needs a PoolStats field, which changes the stats segment's layout: the
// static_assert below holds kLayoutVersion, and the last row, to the table.
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
  X(grows, counter, pool, labelled, "kvpool_pool_resizes_total",                                   \
    "Segments an elastic pool added (grow) or gave back (shrink).")                                \
  X(shrinks, counter, pool, labelled, "kvpool_pool_resizes_total",                                 \
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
  X(host_demote_ns, counter, pool, labelled, "kvpool_host_tier_copy_seconds_total",                \
    "Time spent copying between the pool and its host tier, by direction.")                        \
  X(host_promote_ns, counter, pool, labelled, "kvpool_host_tier_copy_seconds_total",               \
    "Time spent copying between the pool and its host tier, by direction.")                        \
  X(host_copy_failures, counter, pool, as_is, "kvpool_host_tier_copy_failures_total",              \
    "Copies between the pool and its host tier that failed (their blocks were dropped).")

enum class CounterKind : uint8_t { counter, gauge };
enum class PromForm : uint8_t { as_is, as_tokens, labelled };

struct PoolCounter {
  std::string_view name;
  CounterKind kind;
  PromForm form;
  std::string_view family;
  std::string_view help;
  uint64_t (*get)(const PoolStats&);
};

#define KVPOOL_COUNTER_ROW(field, kind_, source_, form_, family_, help_) \
  PoolCounter{#field,                                                    \
              CounterKind::kind_,                                        \
              PromForm::form_,                                           \
              family_,                                                   \
              help_,                                                     \
              [](const PoolStats& p) -> uint64_t { return static_cast<uint64_t>(p.field); }},
inline constexpr PoolCounter kPoolCounters[] = {KVPOOL_POOL_COUNTERS(KVPOOL_COUNTER_ROW)};
#undef KVPOOL_COUNTER_ROW
inline constexpr size_t kNumPoolCounters = std::size(kPoolCounters);

// A row more is a PoolStats field more: raise kLayoutVersion, then these figures.
static_assert(kNumPoolCounters == 25 && sizeof(PoolStats) == 688 && kLayoutVersion == 4,
              "the counter table and PoolStats changed: raise kLayoutVersion");
static_assert(kPoolCounters[kNumPoolCounters - 1].name == "host_copy_failures",
              "rows are appended at the end of the table");

// The row named `name` (a constant expression for the names of the table).
constexpr const PoolCounter& pool_counter(std::string_view name) {
  for (const PoolCounter& c : kPoolCounters) {
    if (c.name == name) return c;
  }
  return kPoolCounters[0];  // never reached for a name of the table
}

}  // namespace kvpool::stats

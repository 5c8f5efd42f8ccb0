// kvpoolctl status and stats: both render one stats snapshot, read from the daemon's stats
// segment when it can be (no round trip) or else asked for with the snapshot op.
#include <string>

#include "client/ctl/common.h"
#include "common/geometry.h"
#include "common/prometheus.h"
#include "common/stats_counters.h"

namespace kvpool::ctl {

namespace {

const char* source_name(const Fetched& f) {
  return f.from_segment ? "segment" : "op";
}

// The attention kind by name: "full", "sliding", "chunked" (an unknown value by number).
std::string kind_text(uint32_t kind) {
  return kind <= static_cast<uint32_t>(kMaxAttentionKind)
             ? std::string(attention_kind_name(static_cast<AttentionKind>(kind)))
             : "kind " + std::to_string(kind);
}

std::string layout_text(uint32_t layout) {
  return layout <= static_cast<uint32_t>(kMaxKvLayout)
             ? std::string(layout_name(static_cast<KvLayout>(layout)))
             : "layout " + std::to_string(layout);
}

std::string dtype_text(uint32_t dtype) {
  return dtype <= static_cast<uint32_t>(KvDtype::int8)
             ? std::string(dtype_name(static_cast<KvDtype>(dtype)))
             : "dtype " + std::to_string(dtype);
}

// "op":{"count":..,"p50_us":..,...} for every operation called at least once.
std::string latency_json(const stats::OpLatency (&service)[stats::kMaxOps],
                         const stats::OpLatency (&request)[stats::kMaxOps]) {
  std::string out = "{";
  for (uint32_t op = 0; op < stats::kMaxOps; ++op) {
    const stats::OpLatency& h = service[op];
    if (h.count == 0 || h.name[0] == '\0') continue;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\":{\"count\":%llu,\"mean_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,"
                  "\"max_us\":%.3f,\"request_p99_us\":%.3f}",
                  out.size() > 1 ? "," : "", json_escape(h.name).c_str(),
                  static_cast<unsigned long long>(h.count),
                  static_cast<double>(h.sum_ns) / static_cast<double>(h.count) / 1e3,
                  stats::quantile_ns(h, 0.5) / 1e3, stats::quantile_ns(h, 0.99) / 1e3,
                  static_cast<double>(h.max_ns) / 1e3, stats::quantile_ns(request[op], 0.99) / 1e3);
    out += buf;
  }
  return out + "}";
}

// The pool an index of PoolStats::convert_into names (null: none, or not in the snapshot).
const stats::PoolStats* convert_target(const stats::Snapshot& s, const stats::PoolStats& p) {
  return p.convert_into == 0 || p.convert_into > s.pools.size() ? nullptr
                                                                : &s.pools[p.convert_into - 1];
}

// Precision before eviction, as JSON: null, or where the pool's evictions go and their counts.
std::string convert_json(const stats::Snapshot& s, const stats::PoolStats& p) {
  const stats::PoolStats* t = convert_target(s, p);
  if (t == nullptr) return "null";
  const auto u = [](uint64_t v) { return std::to_string(v); };
  return "{\"into\":\"" +
         json_escape(std::string(s.pool_name(static_cast<size_t>(t - s.pools.data())))) +
         "\",\"dtype\":\"" + dtype_text(t->dtype) + "\",\"converted\":" + u(p.converted) +
         ",\"duplicates\":" + u(p.convert_duplicates) + ",\"skipped\":" + u(p.convert_skipped) +
         ",\"failures\":" + u(p.convert_failures) + ",\"back\":" + u(p.converted_back) +
         ",\"into_pages\":{\"in_use\":" + u(t->in_use) + ",\"cached\":" + u(t->cached) + "}}";
}

// Pages per precision: this pool's and those of the pool its evictions are converted into, or
// of the pools converting into this one.
void print_precision(const stats::Snapshot& s, const stats::PoolStats& p, bool raw) {
  if (const stats::PoolStats* t = convert_target(s, p)) {
    const std::string into(s.pool_name(static_cast<size_t>(t - s.pools.data())));
    std::printf(
        "  precision evictions converted into %s (%s): %s converted, %s held there "
        "already, %s lost, %s batches failed, %s converted back by lookups; there %s in use, "
        "%s cached\n",
        display_text(into).c_str(), dtype_text(t->dtype).c_str(),
        count_text(p.converted, raw).c_str(), count_text(p.convert_duplicates, raw).c_str(),
        count_text(p.convert_skipped, raw).c_str(), count_text(p.convert_failures, raw).c_str(),
        count_text(p.converted_back, raw).c_str(), count_text(t->in_use, raw).c_str(),
        count_text(t->cached, raw).c_str());
  }
  for (size_t i = 0; i < s.pools.size(); ++i) {
    const stats::PoolStats& from = s.pools[i];
    if (convert_target(s, from) != &p) continue;
    std::printf(
        "  precision holds the evictions of %s (%s) in %s: %s converted so far; %s's "
        "pages %s in use, %s cached\n",
        display_text(std::string(s.pool_name(i))).c_str(), dtype_text(from.dtype).c_str(),
        dtype_text(p.dtype).c_str(), count_text(from.converted, raw).c_str(),
        display_text(std::string(s.pool_name(i))).c_str(), count_text(from.in_use, raw).c_str(),
        count_text(from.cached, raw).c_str());
  }
}

// The remote tier (remote_tier), as JSON: null, or its cluster as seen and its counts.
std::string remote_json(const stats::PoolStats& p) {
  if (p.remote_tier == 0) return "null";
  const auto u = [](uint64_t v) { return std::to_string(v); };
  const char* write = p.remote_tier == 2 ? "off" : p.remote_tier == 3 ? "on_demote" : "on_publish";
  return std::string("{\"writes\":") + (p.remote_tier == 2 ? "false" : "true") + ",\"write\":\"" +
         write + "\"" + ",\"nodes\":" + u(p.remote_nodes) +
         ",\"reachable\":" + u(p.remote_reachable) + ",\"slots\":" + u(p.remote_slots) +
         ",\"lookups\":" + u(p.remote_lookups) + ",\"hit_blocks\":" + u(p.remote_hits) +
         ",\"misses\":" + u(p.remote_misses) + ",\"skipped_unreachable\":" + u(p.remote_skipped) +
         ",\"rejected\":" + u(p.remote_rejected) + ",\"stored\":" + u(p.remote_stored) +
         ",\"store_skipped\":" + u(p.remote_store_skipped) +
         ",\"store_failed\":" + u(p.remote_store_failed) +
         ",\"fetch_failed\":" + u(p.remote_fetch_failed) +
         ",\"fetch_batches\":" + u(p.remote_fetch_batches) +
         ",\"fetch_ns\":" + u(p.remote_fetch_ns) +
         ",\"store_batches\":" + u(p.remote_store_batches) +
         ",\"store_ns\":" + u(p.remote_store_ns) + "}";
}

// The remote tier, as two lines: the cluster as this daemon sees it, then reads and writes.
void print_remote(const stats::PoolStats& p, bool raw) {
  if (p.remote_tier == 0) return;
  const auto mean_ms = [](uint64_t ns, uint64_t n) {
    return n == 0 ? 0.0 : static_cast<double>(ns) / static_cast<double>(n) / 1e6;
  };
  std::printf("  remote    %u of %u master(s) reachable, %u of 16384 slots mapped%s\n",
              p.remote_reachable, p.remote_nodes, p.remote_slots,
              p.remote_tier == 2   ? ", reads only (write: off)"
              : p.remote_tier == 3 ? ", written as the device evicts (write: on_demote)"
                                   : "");
  std::printf(
      "  remote    %s lookups asked (%s blocks hit, %s found nothing, %s skipped while "
      "unreachable, %s values refused, %s keys failed; %.2f ms a batch); %s blocks written "
      "(%s skipped, %s failed; %.2f ms a batch)\n",
      count_text(p.remote_lookups, raw).c_str(), count_text(p.remote_hits, raw).c_str(),
      count_text(p.remote_misses, raw).c_str(), count_text(p.remote_skipped, raw).c_str(),
      count_text(p.remote_rejected, raw).c_str(), count_text(p.remote_fetch_failed, raw).c_str(),
      mean_ms(p.remote_fetch_ns, p.remote_fetch_batches), count_text(p.remote_stored, raw).c_str(),
      count_text(p.remote_store_skipped, raw).c_str(),
      count_text(p.remote_store_failed, raw).c_str(),
      mean_ms(p.remote_store_ns, p.remote_store_batches));
}

}  // namespace

int status_verb(const Globals& g) {
  Fetched f;
  if (!fetch_snapshot(g, f)) return 1;
  const stats::Snapshot& s = f.snapshot;
  const stats::PoolStats& p = *s.find_pool(g.pool);
  const std::string name(s.pool_name(static_cast<size_t>(&p - s.pools.data())));
  const std::string backend(p.backend);
  const std::string policy(p.policy);
  if (g.json) {
    const std::string tenant =
        f.tenant.empty() ? "" : ",\"tenant\":\"" + json_escape(f.tenant) + "\"";
    std::string history;
    for (uint32_t k = 0; k < p.history_len && k < stats::PoolStats::kResizeHistory; ++k) {
      history += (k == 0 ? "" : ",") + std::string("{\"unix_ms\":") +
                 std::to_string(p.history[k].unix_ms) +
                 ",\"pages\":" + std::to_string(p.history[k].pages) + "}";
    }
    std::printf(
        "{\"schema\":%d,\"socket\":\"%s\",\"source\":\"%s\",\"pid\":%llu,\"uptime_s\":%.1f,"
        "\"pool\":\"%s\",\"backend\":\"%s\"%s,\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,"
        "\"tokens_per_page\":%u,\"dtype\":\"%s\",\"attention\":\"%s\",\"window\":%u,"
        "\"layout\":\"%s\",\"page_bytes\":%llu,\"pool_"
        "bytes\":%llu,"
        "\"segments\":%u,\"device\":%d,\"pages\":{\"total\":%u,\"free\":%u,\"in_use\":%u,"
        "\"cached\":%u,\"reserved\":%llu},\"indexed_blocks\":%u,\"policy\":\"%s\",\"pinned\":%u,"
        "\"pinned_cached\":%u,\"sessions\":%u,\"pool_sessions\":%u,\"host_tier\":{\"pages\":%u,"
        "\"held\":%u,\"bytes\":%llu,\"demoted\":%llu,\"promoted\":%llu,\"dropped\":%llu},"
        "\"elastic\":{\"min_pages\":%u,\"max_pages\":%u,\"grows\":%llu,\"shrinks\":%llu,"
        "\"epoch\":%u,\"history\":[%s]},\"convert_evictions\":%s,\"remote_tier\":%s}\n",
        kSchema, json_escape(g.socket).c_str(), source_name(f),
        static_cast<unsigned long long>(s.daemon.pid),
        static_cast<double>(s.daemon.uptime_ms) / 1e3, json_escape(name).c_str(),
        json_escape(backend).c_str(), tenant.c_str(), p.layers, p.kv_heads, p.head_dim,
        p.tokens_per_page, dtype_text(p.dtype).c_str(), kind_text(p.kind).c_str(), p.window,
        layout_text(p.layout).c_str(), static_cast<unsigned long long>(p.page_stride),
        static_cast<unsigned long long>(p.segment_bytes), p.segments, p.device, p.total, p.free,
        p.in_use, p.cached, static_cast<unsigned long long>(p.reserved), p.indexed,
        json_escape(policy).c_str(), p.pinned, p.pinned_cached, s.daemon.sessions, p.sessions,
        p.host_slots, p.host_held, static_cast<unsigned long long>(p.host_bytes),
        static_cast<unsigned long long>(p.host_demoted),
        static_cast<unsigned long long>(p.host_promoted),
        static_cast<unsigned long long>(p.host_dropped), p.min_pages, p.max_pages,
        static_cast<unsigned long long>(p.grows), static_cast<unsigned long long>(p.shrinks),
        p.epoch, history.c_str(), convert_json(s, p).c_str(), remote_json(p).c_str());
    return 0;
  }
  auto pct = [&](uint32_t n) { return p.total ? 100.0 * n / p.total : 0.0; };
  std::printf("kvpoold at %s (pid %llu, up %.0f s)\n", display_text(g.socket).c_str(),
              static_cast<unsigned long long>(s.daemon.pid),
              static_cast<double>(s.daemon.uptime_ms) / 1e3);
  std::printf("  pool      %s (%s backend)%s\n", display_text(name).c_str(),
              display_text(backend).c_str(),
              f.tenant.empty() ? "" : (", tenant " + display_text(f.tenant)).c_str());
  const std::string attention =
      p.window != 0 ? ", " + kind_text(p.kind) + " window " + std::to_string(p.window)
      : p.kind != 0 ? ", " + kind_text(p.kind)
                    : "";
  std::printf("  geometry  %u layers x %u KV heads x head dim %u, %u tokens/page, %s, %s%s\n",
              p.layers, p.kv_heads, p.head_dim, p.tokens_per_page, dtype_text(p.dtype).c_str(),
              layout_text(p.layout).c_str(), attention.c_str());
  std::printf("  memory    %s in %s pages of %s, %u segment(s), %s\n",
              bytes_text(p.segment_bytes, g.raw).c_str(), count_text(p.total, g.raw).c_str(),
              bytes_text(p.page_stride, g.raw).c_str(), p.segments,
              p.device < 0 ? "host memory" : ("CUDA device " + std::to_string(p.device)).c_str());
  std::printf("  pages     %s free (%.1f%%), %s in use (%.1f%%), %s cached (%.1f%%)\n",
              count_text(p.free, g.raw).c_str(), pct(p.free), count_text(p.in_use, g.raw).c_str(),
              pct(p.in_use), count_text(p.cached, g.raw).c_str(), pct(p.cached));
  if (p.reserved != 0) {
    std::printf("  reserved  %s pages held by static reservations (in use until unreserved)\n",
                count_text(p.reserved, g.raw).c_str());
  }
  std::printf("  eviction  %s policy, %s pages pinned (%s of them cached)\n",
              display_text(policy).c_str(), count_text(p.pinned, g.raw).c_str(),
              count_text(p.pinned_cached, g.raw).c_str());
  if (p.min_pages != 0) {
    std::printf(
        "  elastic   %s pages now (min %s, max %s), %llu segment(s) added, %llu given back\n",
        count_text(p.total, g.raw).c_str(), count_text(p.min_pages, g.raw).c_str(),
        count_text(p.max_pages, g.raw).c_str(), static_cast<unsigned long long>(p.grows),
        static_cast<unsigned long long>(p.shrinks));
    if (p.history_len != 0) {
      // Size over time: each of the last resizes, how long ago and the size it left.
      const double now_s = static_cast<double>(s.daemon.start_unix_ms + s.daemon.uptime_ms) / 1e3;
      std::printf("  sizes    ");
      for (uint32_t k = 0; k < p.history_len && k < stats::PoolStats::kResizeHistory; ++k) {
        const double ago = now_s - static_cast<double>(p.history[k].unix_ms) / 1e3;
        std::printf(" %.0fs ago %s;", ago < 0 ? 0.0 : ago,
                    count_text(p.history[k].pages, g.raw).c_str());
      }
      std::printf(" now %s\n", count_text(p.total, g.raw).c_str());
    }
  }
  if (p.host_slots != 0) {
    std::printf("  host tier %s of %s pages held (%s), %s demoted, %s promoted, %s dropped\n",
                count_text(p.host_held, g.raw).c_str(), count_text(p.host_slots, g.raw).c_str(),
                bytes_text(p.host_bytes, g.raw).c_str(), count_text(p.host_demoted, g.raw).c_str(),
                count_text(p.host_promoted, g.raw).c_str(),
                count_text(p.host_dropped, g.raw).c_str());
  }
  print_precision(s, p, g.raw);
  print_remote(p, g.raw);
  std::printf("  sessions  %u worker(s)\n", s.daemon.sessions);
  return 0;
}

namespace {

// Every row of a counter table, by its names: {"lookups":N,...}.
template <class Row, size_t N, class Stats>
std::string counters_json(const Row (&table)[N], const Stats& s) {
  std::string out = "{";
  for (const Row& c : table) {
    if (out.size() > 1) out += ',';
    out += '"';
    out += c.name;
    out += "\":";
    out += std::to_string(c.get(s));
  }
  return out + "}";
}

}  // namespace

int stats_verb(const Globals& g, const std::string& format) {
  Fetched f;
  if (!fetch_snapshot(g, f)) return 1;
  const stats::Snapshot& s = f.snapshot;
  if (format == "prom") {
    std::fputs(stats::prometheus_text(s, g.pool).c_str(), stdout);
    return 0;
  }
  const stats::PoolStats& p = *s.find_pool(g.pool);
  const std::string name(s.pool_name(static_cast<size_t>(&p - s.pools.data())));
  const uint64_t t = p.tokens_per_page;
  const uint64_t query_tokens = p.lookup_blocks * t;
  const uint64_t hit_tokens = p.hit_blocks * t;
  const double hit = p.lookup_blocks ? double(p.hit_blocks) / double(p.lookup_blocks) : 0.0;
  const stats::DaemonStats& d = s.daemon;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"source\":\"%s\",\"pool\":\"%s\",\"pages\":{\"total\":%u,\"free\":%u,"
        "\"in_use\":%u,\"cached\":%u},\"indexed_blocks\":%u,\"sessions\":%u,\"lookups\":%llu,"
        "\"query_tokens\":%llu,\"hit_tokens\":%llu,\"hit_rate\":%.6f,\"allocated\":%llu,"
        "\"released\":%llu,\"published\":%llu,\"duplicates\":%llu,\"evicted\":%llu,"
        "\"flushed\":%llu,\"counters\":%s,\"daemon_counters\":%s,\"events\":{\"next_seq\":%llu,"
        "\"oldest_seq\":%llu,"
        "\"subscribers\":%u,"
        "\"lost\":%llu,\"zmq_published\":%llu,\"zmq_dropped\":%llu},\"reloads\":{\"applied\":%llu,"
        "\"refused\":%llu},"
        "\"connections\":{\"buffered_bytes\":%llu,\"refused\":%llu,\"closed_by_limits\":%llu},"
        "\"latency_timed\":%s,\"latency\":%s}\n",
        kSchema, source_name(f), json_escape(name).c_str(), p.total, p.free, p.in_use, p.cached,
        p.indexed, d.sessions, static_cast<unsigned long long>(p.lookups),
        static_cast<unsigned long long>(query_tokens), static_cast<unsigned long long>(hit_tokens),
        hit, static_cast<unsigned long long>(p.allocated),
        static_cast<unsigned long long>(p.released), static_cast<unsigned long long>(p.published),
        static_cast<unsigned long long>(p.duplicates), static_cast<unsigned long long>(p.evicted),
        static_cast<unsigned long long>(p.flushed), counters_json(stats::kPoolCounters, p).c_str(),
        counters_json(stats::kDaemonCounters, d).c_str(),
        static_cast<unsigned long long>(d.event_next_seq),
        static_cast<unsigned long long>(d.event_oldest_seq), d.subscribers,
        static_cast<unsigned long long>(d.events_lost),
        static_cast<unsigned long long>(d.kv_batches_published),
        static_cast<unsigned long long>(d.kv_batches_dropped),
        static_cast<unsigned long long>(d.reloads - d.reload_failures),
        static_cast<unsigned long long>(d.reload_failures),
        static_cast<unsigned long long>(d.buffered_bytes),
        static_cast<unsigned long long>(d.sessions_refused),
        static_cast<unsigned long long>(d.closed_by_limits), d.latency_enabled ? "true" : "false",
        latency_json(s.service, s.request).c_str());
    return 0;
  }
  std::printf("pool %s\n", display_text(name).c_str());
  std::printf("  pages        %s total: %s free, %s in use, %s cached; %s blocks indexed\n",
              count_text(p.total, g.raw).c_str(), count_text(p.free, g.raw).c_str(),
              count_text(p.in_use, g.raw).c_str(), count_text(p.cached, g.raw).c_str(),
              count_text(p.indexed, g.raw).c_str());
  std::printf("  prefix       %s lookups, %s of %s tokens hit (%.1f%%)\n",
              count_text(p.lookups, g.raw).c_str(), count_text(p.hit_blocks * t, g.raw).c_str(),
              count_text(p.lookup_blocks * t, g.raw).c_str(), 100.0 * hit);
  std::printf("  pages moved  %s allocated, %s released, %s published, %s duplicates\n",
              count_text(p.allocated, g.raw).c_str(), count_text(p.released, g.raw).c_str(),
              count_text(p.published, g.raw).c_str(), count_text(p.duplicates, g.raw).c_str());
  std::printf("  dropped      %s evicted, %s flushed\n", count_text(p.evicted, g.raw).c_str(),
              count_text(p.flushed, g.raw).c_str());
  std::printf("  sessions     %u worker(s)\n", d.sessions);
  std::printf("  connections  %s buffered; %s refused at accept, %s closed by limits\n",
              bytes_text(d.buffered_bytes, g.raw).c_str(),
              count_text(d.sessions_refused, g.raw).c_str(),
              count_text(d.closed_by_limits, g.raw).c_str());
  std::printf("  events       next seq %llu, %u subscriber(s), %s lost to gaps\n",
              static_cast<unsigned long long>(d.event_next_seq), d.subscribers,
              count_text(d.events_lost, g.raw).c_str());
  if (d.kv_batches_published + d.kv_batches_dropped > 0) {
    std::printf("  zmq events   %s batches published, %s dropped\n",
                count_text(d.kv_batches_published, g.raw).c_str(),
                count_text(d.kv_batches_dropped, g.raw).c_str());
  }
  if (!d.latency_enabled) {
    std::printf("  latency      not timed (metrics.latency_histograms: false)\n");
    return 0;
  }
  std::printf("  latency      %-10s %10s %10s %10s %10s %12s\n", "op", "count", "p50", "p99", "max",
              "request p99");
  for (uint32_t op = 0; op < stats::kMaxOps; ++op) {
    const stats::OpLatency& h = s.service[op];
    if (h.count == 0 || h.name[0] == '\0') continue;
    std::printf("               %-10s %10s %10s %10s %10s %12s\n", display_text(h.name).c_str(),
                count_text(h.count, g.raw).c_str(),
                duration_text(stats::quantile_ns(h, 0.5)).c_str(),
                duration_text(stats::quantile_ns(h, 0.99)).c_str(),
                duration_text(static_cast<double>(h.max_ns)).c_str(),
                duration_text(stats::quantile_ns(s.request[op], 0.99)).c_str());
  }
  return 0;
}

}  // namespace kvpool::ctl

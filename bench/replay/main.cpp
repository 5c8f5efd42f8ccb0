// kvpool-replay: replays a Mooncake-format trace through the pool core at several capacities and
// prints the prefix hit rate per capacity and policy (see replay.h for the exact procedure).

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/replay/daemon_replay.h"
#include "bench/replay/model_replay.h"
#include "bench/replay/replay.h"
#include "bench/replay/synthetic_trace.h"
#include "common/main_guard.h"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

void print_json(const kvpool::bench::ReplayResult& r, const kvpool::bench::Trace& trace) {
  std::printf(
      "{\"capacity\":%u,\"capacity_pages\":%u,\"policy\":\"%s\",\"page_tokens\":%u,"
      "\"hit_rate\":%.6f,\"requests\":%llu,\"blocks\":%llu,\"pages\":%llu,\"hit_pages\":%llu,"
      "\"reused_pages\":%llu,\"allocated_pages\":%llu,\"evicted_pages\":%llu,"
      "\"alloc_failures\":%llu,\"distinct_blocks\":%llu,\"seconds\":%.6f,"
      "\"requests_per_second\":%.1f,\"ns_per_page_op\":%.2f,\"host_blocks\":%u,"
      "\"host_hit_pages\":%llu,\"host_reused_pages\":%llu,\"demoted_pages\":%llu,"
      "\"window_skipped_pages\":%llu}\n",
      r.capacity_blocks, r.capacity_pages, r.policy.c_str(), r.page_tokens, r.hit_rate(),
      static_cast<unsigned long long>(r.requests),
      static_cast<unsigned long long>(trace.total_blocks), static_cast<unsigned long long>(r.pages),
      static_cast<unsigned long long>(r.hit_pages), static_cast<unsigned long long>(r.reused_pages),
      static_cast<unsigned long long>(r.allocated_pages),
      static_cast<unsigned long long>(r.evicted_pages),
      static_cast<unsigned long long>(r.alloc_failures),
      static_cast<unsigned long long>(trace.distinct_blocks), r.seconds,
      double(r.requests) / r.seconds, 1e9 * r.seconds / double(r.page_ops), r.host_blocks,
      static_cast<unsigned long long>(r.host_hit_pages),
      static_cast<unsigned long long>(r.host_reused_pages),
      static_cast<unsigned long long>(r.demoted_pages),
      static_cast<unsigned long long>(r.window_skipped_pages));
}

void print_latency(const char* op, const kvpool::bench::LatencySummary& l) {
  std::printf("  %-8s %9llu %7u %7u %9.1f %9.1f %9.1f %9.1f %8.2f\n", op,
              static_cast<unsigned long long>(l.calls), l.request_bytes, l.reply_bytes, l.p50_us,
              l.p99_us, l.baseline_p50_us, l.baseline_p99_us,
              l.baseline_p50_us > 0 ? l.p50_us / l.baseline_p50_us : 0.0);
}

// --model: the replay through kvpoold's hybrid model (or plain pool), in trace order.
int run_model(const kvpool::bench::Trace& trace, const std::string& socket, uint32_t page_tokens,
              uint32_t pace_us, bool json) {
  const kvpool::bench::ModelReplayResult r =
      kvpool::bench::replay_model(trace, split(socket), page_tokens, pace_us);
  const double held = r.requests == 0 ? 0 : double(r.held_bytes) / double(r.requests);
  const double full = r.requests == 0 ? 0 : double(r.all_full_bytes) / double(r.requests);
  if (json) {
    std::printf(
        "{\"mode\":\"model\",\"model\":\"%s\",\"groups\":%zu,\"pool_bytes\":%llu,"
        "\"requests\":%llu,\"blocks\":%llu,\"hit_rate\":%.6f,\"held_bytes_per_sequence\":%.0f,"
        "\"all_full_bytes_per_sequence\":%.0f,\"held_ratio\":%.4f,\"alloc_failures\":%llu,"
        "\"remote_bytes\":%llu,\"remote_blocks\":%llu,\"seconds\":%.3f}\n",
        r.model.c_str(), r.groups.size(), static_cast<unsigned long long>(r.budget_bytes),
        static_cast<unsigned long long>(r.requests), static_cast<unsigned long long>(r.blocks),
        r.hit_rate(), held, full, full > 0 ? held / full : 0.0,
        static_cast<unsigned long long>(r.alloc_failures),
        static_cast<unsigned long long>(r.remote_bytes),
        static_cast<unsigned long long>(r.remote_blocks), r.seconds);
    return 0;
  }
  std::printf("replay through kvpoold at %s, model %s, one worker in trace order:\n",
              socket.c_str(), r.model.c_str());
  for (const std::string& g : r.groups)
    std::printf("  group %s\n", g.c_str());
  std::printf("  %llu requests, %llu pages asked: hit rate %.4f, %llu pages not allocated\n",
              static_cast<unsigned long long>(r.requests),
              static_cast<unsigned long long>(r.blocks), r.hit_rate(),
              static_cast<unsigned long long>(r.alloc_failures));
  std::printf(
      "  a sequence holds %.0f bytes at its end (mean), %.4f of the %.0f every block of every "
      "group would take\n",
      held, full > 0 ? held / full : 0.0, full);
  std::printf(
      "  pool memory at the end %llu bytes; %llu bytes of hits from the remote tier; %.3f s\n",
      static_cast<unsigned long long>(r.budget_bytes),
      static_cast<unsigned long long>(r.remote_bytes), r.seconds);
  return 0;
}

// --daemon: the replay through kvpoold, then the in-process replay at the same capacity.
int run_daemon(const kvpool::bench::Trace& trace, const std::string& socket, uint32_t workers,
               bool ordered, uint32_t page_tokens, bool json) {
  kvpool::bench::DaemonReplayOptions o;
  o.sockets = split(socket);
  o.workers = workers;
  o.ordered = ordered;
  o.page_tokens = page_tokens;
  const kvpool::bench::DaemonReplayResult d = kvpool::bench::replay_through_daemon(trace, o);
  kvpool::bench::ReplayOptions in;
  in.capacity_blocks = d.replay.capacity_blocks;
  in.policy = d.replay.policy;
  in.page_tokens = page_tokens;
  const kvpool::bench::ReplayResult p = kvpool::bench::replay(trace, in);
  // Several daemons: also one daemon holding all their capacity (the bound a shared tier aims at).
  kvpool::bench::ReplayResult whole = p;
  if (d.daemons > 1) {
    in.capacity_blocks = d.replay.capacity_blocks * d.daemons;
    whole = kvpool::bench::replay(trace, in);
  }
  const double rps = double(d.replay.requests) / d.replay.seconds;
  if (json) {
    std::printf(
        "{\"mode\":\"daemon\",\"ordered\":%s,\"workers\":%u,\"capacity\":%u,"
        "\"capacity_pages\":%u,\"hit_rate\":%.6f,\"in_process_hit_rate\":%.6f,"
        "\"requests\":%llu,\"blocks\":%llu,\"seconds\":%.6f,"
        "\"requests_per_second\":%.1f,\"alloc_p50_us\":%.2f,\"alloc_p99_us\":%.2f,"
        "\"release_p50_us\":%.2f,\"release_p99_us\":%.2f,\"lookup_p50_us\":%.2f,"
        "\"lookup_p99_us\":%.2f,\"pingpong_alloc_p50_us\":%.2f,"
        "\"pingpong_release_p50_us\":%.2f,\"pingpong_lookup_p50_us\":%.2f,"
        "\"converted_pages\":%llu,\"converted_back_pages\":%llu,\"daemons\":%u,"
        "\"one_daemon_all_capacity_hit_rate\":%.6f,\"remote_hit_pages\":%llu,"
        "\"remote_stored_pages\":%llu}\n",
        ordered ? "true" : "false", workers, d.replay.capacity_blocks, d.replay.capacity_pages,
        d.replay.hit_rate(), p.hit_rate(), static_cast<unsigned long long>(d.replay.requests),
        static_cast<unsigned long long>(trace.total_blocks), d.replay.seconds, rps, d.alloc.p50_us,
        d.alloc.p99_us, d.release.p50_us, d.release.p99_us, d.lookup.p50_us, d.lookup.p99_us,
        d.alloc.baseline_p50_us, d.release.baseline_p50_us, d.lookup.baseline_p50_us,
        static_cast<unsigned long long>(d.converted_pages),
        static_cast<unsigned long long>(d.converted_back_pages), d.daemons, whole.hit_rate(),
        static_cast<unsigned long long>(d.remote_hit_pages),
        static_cast<unsigned long long>(d.remote_stored_pages));
  } else {
    std::printf("replay through kvpoold at %s: %u worker processes, %s\n", socket.c_str(), workers,
                ordered ? "in trace order" : "concurrent");
    std::printf("  capacity %u blocks (%u pages of %u tokens), %s policy\n",
                d.replay.capacity_blocks, d.replay.capacity_pages, page_tokens,
                d.replay.policy.c_str());
    std::printf("  hit rate %.4f through the daemon, %.4f in process%s\n", d.replay.hit_rate(),
                p.hit_rate(), d.replay.hit_pages == p.hit_pages ? " (equal)" : " (differs)");
    if (d.daemons > 1) {
      std::printf(
          "  over %u daemons round-robin; one daemon holding all their capacity (in process): "
          "%.4f\n",
          d.daemons, whole.hit_rate());
    }
    if (d.remote_hit_pages != 0 || d.remote_stored_pages != 0) {
      std::printf("  remote tier: %llu pages written, %llu served to lookups\n",
                  static_cast<unsigned long long>(d.remote_stored_pages),
                  static_cast<unsigned long long>(d.remote_hit_pages));
    }
    if (d.converted_pages != 0) {
      std::printf(
          "  the pool converted %llu evictions into its 8-bit pool; lookups converted %llu "
          "blocks back from there (the in-process replay has no such tier)\n",
          static_cast<unsigned long long>(d.converted_pages),
          static_cast<unsigned long long>(d.converted_back_pages));
    }
    std::printf("  %llu requests in %.3f s: %.0f requests/s (in process: %.0f requests/s)\n",
                static_cast<unsigned long long>(d.replay.requests), d.replay.seconds, rps,
                double(p.requests) / p.seconds);
    std::printf(
        "  round trips in microseconds, next to a bare Unix-socket ping-pong of the same "
        "sizes:\n  %-8s %9s %7s %7s %9s %9s %9s %9s %8s\n",
        "call", "calls", "req B", "reply B", "p50", "p99", "pp p50", "pp p99", "p50 x");
    print_latency("alloc", d.alloc);
    print_latency("release", d.release);
    print_latency("lookup", d.lookup);
  }
  // In trace order the hit rates must be equal, but for a pool with an 8-bit tier below it.
  // One daemon in trace order, with no tier that serves what the in-process replay lacks: the hit
  // rates must be equal.
  const bool comparable =
      ordered && d.daemons == 1 && d.converted_pages == 0 && d.remote_hit_pages == 0;
  return comparable && d.replay.hit_pages != p.hit_pages ? 1 : 0;
}

int run(int argc, char** argv) {
  CLI::App app{
      "Replay a Mooncake-format request trace through the kvpool pool core and report the\n"
      "prefix-cache hit rate (hit blocks / requested blocks) for each capacity and policy."};
  std::string trace_path = KVPOOL_DEFAULT_TRACE;
  std::string capacities = "1000,4000,8000,16000";
  std::string policies = "prefix,lru";
  uint32_t page_tokens = kvpool::bench::kTraceBlockTokens;
  uint32_t host_blocks = 0;
  bool json = false;
  std::string daemon_socket;
  uint32_t workers = 4;
  bool concurrent = false;
  size_t limit = 0;
  app.add_option("--trace", trace_path, "Trace file (JSON lines)")->capture_default_str();
  app.add_option("--capacities", capacities, "Pool capacities in 512-token blocks, comma-separated")
      ->capture_default_str();
  app.add_option("--policy", policies,
                 "Eviction policies, comma-separated: prefix (kvpoold's default), lru, s3fifo, "
                 "and the offline bounds belady and reuse-oracle; NAME+hints replays with the "
                 "trace's client hints (priority classes, pins)")
      ->capture_default_str();
  bool synthetic = false;
  kvpool::bench::SyntheticTraceOptions synthetic_options;
  double pin_share = 0.25;
  app.add_flag("--synthetic", synthetic,
               "Replay a generated trace with client hints (shared system prompts, multi-turn "
               "chats, long one-off documents) instead of --trace");
  app.add_option("--seed", synthetic_options.seed, "Seed of the --synthetic trace")
      ->capture_default_str();
  app.add_option("--synthetic-requests", synthetic_options.requests,
                 "Requests in the --synthetic trace")
      ->capture_default_str()
      ->check(CLI::Range(1u, 10000000u));
  app.add_option("--pin-share", pin_share,
                 "Share of the pool one replay may keep pinned (like the daemon's "
                 "limits.max_pinned_pages_per_tenant)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--host-blocks", host_blocks,
                 "Blocks of a host-memory tier under the pool: the device tier's evictions are "
                 "demoted into it and lookups that miss there promote from it (0 = none)")
      ->capture_default_str();
  app.add_option("--page-tokens", page_tokens,
                 "Tokens per page; must divide 512 (each block becomes 512/N pages)")
      ->capture_default_str();
  app.add_flag("--json", json, "One JSON object per capacity and policy instead of a table");
  app.add_option("--daemon", daemon_socket,
                 "Replay through the kvpoold listening on this socket (its default pool, which "
                 "must be empty) with --workers processes, next to the in-process replay at the "
                 "same capacity; SOCKET,SOCKET,...: several daemons, requests round-robin over "
                 "them (--workers a multiple of their number)");
  std::string model_socket;
  app.add_option("--model", model_socket,
                 "Replay through the kvpoold listening on this socket, on its hybrid model (a "
                 "pool with groups: one lookup_groups per request, every group's pages) or "
                 "plain pool, one worker in trace order: the hit rate and the bytes a sequence "
                 "holds against every layer keeping every block; SOCKET,SOCKET,...: several "
                 "daemons serving the same model, requests round-robin over them");
  uint32_t pace_us = 0;
  app.add_option("--pace-us-per-page", pace_us,
                 "With --model: after each request, wait this long per page it computed (its "
                 "prefill; the daemons' background work, remote writes among it, runs meanwhile)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 1'000'000u));
  app.add_option("--workers", workers, "Worker processes for --daemon")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_flag("--concurrent", concurrent,
               "With --daemon: let the workers run freely instead of in trace order (throughput; "
               "the hit rate then differs slightly from the sequential one)");
  app.add_option("--limit", limit, "Replay only the first N requests of the trace");
  uint32_t window_tokens = 0;
  bool prefix_lookup = false;
  app.add_option("--window", window_tokens,
                 "Replay a sliding-window model of this many tokens: the worker lets go of the "
                 "pages before the window first, and lookups need only the window's pages "
                 "(0 = full attention)")
      ->capture_default_str();
  app.add_flag("--prefix-lookup", prefix_lookup,
               "With --window: plain prefix lookups (every page from the first), the baseline");
  CLI11_PARSE(app, argc, argv);

  std::vector<uint32_t> caps;
  for (const std::string& c : split(capacities)) {
    try {
      size_t used = 0;
      const unsigned long v = std::stoul(c, &used);
      if (used != c.size() || v == 0 || v > 0x7fffffffUL) throw std::invalid_argument(c);
      caps.push_back(static_cast<uint32_t>(v));
    } catch (const std::exception&) {
      std::cerr << "kvpool-replay: --capacities: \"" << c << "\" is not a positive block count\n";
      return 2;
    }
  }
  const std::vector<std::string> pols = split(policies);
  if (caps.empty() || pols.empty()) {
    std::cerr << "kvpool-replay: need at least one capacity and one policy\n";
    return 2;
  }

  kvpool::bench::Trace trace;
  try {
    if (synthetic) {
      trace = kvpool::bench::synthetic_trace(synthetic_options);
      trace_path = "(synthetic, seed " + std::to_string(synthetic_options.seed) + ")";
    } else {
      trace = kvpool::bench::load_trace(trace_path);
    }
  } catch (const std::exception& e) {
    std::cerr << "kvpool-replay: " << e.what() << "\n";
    return 1;
  }

  if (limit != 0 && limit < trace.requests.size()) {
    trace.requests.resize(limit);
    trace.total_blocks = 0;
    for (const auto& r : trace.requests)
      trace.total_blocks += r.hash_ids.size();
  }
  if (!model_socket.empty()) {
    try {
      return run_model(trace, model_socket, page_tokens, pace_us, json);
    } catch (const std::exception& e) {
      std::cerr << "kvpool-replay: " << e.what() << "\n";
      return 1;
    }
  }
  if (!daemon_socket.empty()) {
    return run_daemon(trace, daemon_socket, workers, !concurrent, page_tokens, json);
  }

  const bool tty = isatty(STDERR_FILENO) != 0;
  if (!json) {
    std::printf("trace %s: %zu requests, %llu blocks, %llu distinct (unbounded hit rate %.4f)\n",
                trace_path.c_str(), trace.requests.size(),
                static_cast<unsigned long long>(trace.total_blocks),
                static_cast<unsigned long long>(trace.distinct_blocks),
                trace.total_blocks == 0
                    ? 0.0
                    : 1.0 - double(trace.distinct_blocks) / double(trace.total_blocks));
    std::printf("%10s %14s %7s %9s %10s %9s %10s %12s %11s", "capacity", "policy", "pages/b",
                "hit_rate", "evicted", "seconds", "requests/s", "ns/page-op", "alloc_fail");
    if (host_blocks != 0) {
      std::printf(" %11s %9s %9s", "host_blocks", "host_hits", "host_share");
    }
    std::printf("\n");
  }
  for (const std::string& policy : pols) {
    for (const uint32_t cap : caps) {
      kvpool::bench::ReplayOptions opt;
      opt.capacity_blocks = cap;
      opt.policy = policy;
      opt.page_tokens = page_tokens;
      opt.host_blocks = host_blocks;
      opt.window_tokens = window_tokens;
      opt.window_lookup = !prefix_lookup;
      opt.pin_limit_pages = static_cast<uint32_t>(
          pin_share * double(cap) * double(kvpool::bench::kTraceBlockTokens / page_tokens));
      if (tty) {
        opt.progress = [&](size_t done, size_t total) {
          std::fprintf(stderr, "\r%s capacity %u: %zu/%zu requests", policy.c_str(), cap, done,
                       total);
        };
      }
      kvpool::bench::ReplayResult r;
      try {
        r = kvpool::bench::replay(trace, opt);
      } catch (const std::invalid_argument& e) {
        std::cerr << "kvpool-replay: " << e.what() << "\n";
        return 2;
      } catch (const std::exception& e) {
        std::cerr << "kvpool-replay: " << e.what() << "\n";
        return 1;
      }
      if (tty) std::fprintf(stderr, "\r\033[K");
      if (json) {
        print_json(r, trace);
      } else {
        std::printf("%10u %14s %7u %9.4f %10llu %9.4f %10.0f %12.1f %11llu", cap, policy.c_str(),
                    kvpool::bench::kTraceBlockTokens / page_tokens, r.hit_rate(),
                    static_cast<unsigned long long>(r.evicted_pages), r.seconds,
                    double(r.requests) / r.seconds, 1e9 * r.seconds / double(r.page_ops),
                    static_cast<unsigned long long>(r.alloc_failures));
        if (host_blocks != 0) {
          const uint64_t hits = r.hit_pages;
          std::printf(" %11u %9llu %9.4f", host_blocks,
                      static_cast<unsigned long long>(r.host_hit_pages),
                      hits == 0 ? 0.0 : double(r.host_hit_pages) / double(hits));
        }
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return kvpool::guarded_main("kvpool-replay", [&] { return run(argc, argv); });
}

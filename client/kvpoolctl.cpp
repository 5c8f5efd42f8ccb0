// kvpoolctl: inspect a running kvpoold, and size KV caches.
//
//   kvpoolctl status [--watch SEC]           the pool the daemon serves, pages by state, sessions
//   kvpoolctl stats [--format text|prom]     counters (Prometheus text exposition with prom)
//   kvpoolctl sessions                       the worker sessions attached to the pool
//   kvpoolctl pages [--width N]              a map of the pool's pages by state
//   kvpoolctl evict N | flush                drop cached pages (root or the admin group)
//   kvpoolctl plan --layers L --kv-heads H --head-dim D --tokens N [--dtype fp16] ...
// Global: --socket PATH (default $KVPOOL_SOCKET, else the daemon's default), --pool NAME, --json
// (one object per report, with "schema": 1), --raw (plain numbers instead of human units).
// Exit codes: 0 ok, 1 failure (e.g. the daemon is not running), 2 usage error.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "client/connection.h"
#include "common/geometry.h"

namespace {

using kvpool::client::Connection;

constexpr int kSchema = 1;

struct Globals {
  std::string socket;
  std::string pool;
  bool json = false;
  bool raw = false;
};

std::string bytes_text(uint64_t b, bool raw) {
  if (raw) return std::to_string(b);
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  } else if (b >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f %s (%.1f GB)", v, kUnits[u], double(b) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

std::string count_text(uint64_t n, bool raw) {
  std::string s = std::to_string(n);
  if (raw) return s;
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
    s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

// Connects, or prints why not and returns null.
std::unique_ptr<Connection> connect(const Globals& g) {
  auto c = Connection::attach(g.socket, "kvpoolctl", g.pool, Connection::Memory::none);
  if (!c.ok()) {
    std::fprintf(stderr, "kvpoolctl: %s\n", c.error().message.c_str());
    return nullptr;
  }
  return std::move(c.value());
}

// True when the call succeeded; otherwise prints the daemon's reason (the verb then exits 1).
template <typename T>
bool succeeded(const kvpool::client::Result<T>& r) {
  if (r.ok()) return true;
  std::fprintf(stderr, "kvpoolctl: %s\n", r.error().message.c_str());
  return false;
}

int status_once(const Globals& g) {
  auto c = connect(g);
  if (!c) return 1;
  auto st = c->stats();
  if (!succeeded(st)) return 1;
  const auto& p = c->pool();
  const auto& s = st.value();
  const uint64_t page_bytes = p.page_stride;
  // The asking session itself is not a worker.
  const uint32_t sessions = s.sessions > 0 ? s.sessions - 1 : 0;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"socket\":\"%s\",\"pool\":\"%s\",\"backend\":\"%s\",\"tenant\":\"%s\","
        "\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"tokens_per_page\":%u,\"dtype\":\"%s\","
        "\"page_bytes\":%llu,\"pool_bytes\":%llu,\"segments\":%zu,\"device\":%d,"
        "\"pages\":{\"total\":%u,\"free\":%u,"
        "\"in_use\":%u,\"cached\":%u},\"sessions\":%u}\n",
        kSchema, json_escape(g.socket).c_str(), json_escape(p.pool_name).c_str(),
        json_escape(p.backend).c_str(), json_escape(p.tenant).c_str(), p.geometry.layers,
        p.geometry.kv_heads, p.geometry.head_dim, p.geometry.tokens_per_page,
        std::string(kvpool::dtype_name(p.geometry.dtype)).c_str(),
        static_cast<unsigned long long>(page_bytes),
        static_cast<unsigned long long>(p.segment_bytes), p.segments.size(), p.device, s.total,
        s.free, s.in_use, s.cached, sessions);
    return 0;
  }
  auto pct = [&](uint32_t n) { return s.total ? 100.0 * n / s.total : 0.0; };
  std::printf("kvpoold at %s\n", g.socket.c_str());
  std::printf("  pool      %s (%s backend), tenant %s\n", p.pool_name.c_str(), p.backend.c_str(),
              p.tenant.c_str());
  std::printf("  geometry  %u layers x %u KV heads x head dim %u, %u tokens/page, %s\n",
              p.geometry.layers, p.geometry.kv_heads, p.geometry.head_dim,
              p.geometry.tokens_per_page,
              std::string(kvpool::dtype_name(p.geometry.dtype)).c_str());
  std::printf("  memory    %s in %s pages of %s, %zu segment(s), %s\n",
              bytes_text(p.segment_bytes, g.raw).c_str(), count_text(s.total, g.raw).c_str(),
              bytes_text(page_bytes, g.raw).c_str(), p.segments.size(),
              p.device < 0 ? "host memory" : ("CUDA device " + std::to_string(p.device)).c_str());
  std::printf("  pages     %s free (%.1f%%), %s in use (%.1f%%), %s cached (%.1f%%)\n",
              count_text(s.free, g.raw).c_str(), pct(s.free), count_text(s.in_use, g.raw).c_str(),
              pct(s.in_use), count_text(s.cached, g.raw).c_str(), pct(s.cached));
  std::printf("  sessions  %u worker(s)\n", sessions);
  return 0;
}

int stats_once(const Globals& g, const std::string& format) {
  auto c = connect(g);
  if (!c) return 1;
  auto st = c->stats();
  if (!succeeded(st)) return 1;
  const auto& s = st.value();
  const auto& p = c->pool();
  const uint64_t t = p.geometry.tokens_per_page;
  const uint32_t sessions = s.sessions > 0 ? s.sessions - 1 : 0;
  if (format == "prom") {
    const std::string lbl = "pool=\"" + json_escape(p.pool_name) + "\"";
    auto metric = [&](const char* name, const char* type, const char* help) {
      std::printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    };
    metric("kvpool_pages", "gauge", "Pages by state.");
    std::printf("kvpool_pages{%s,state=\"free\"} %u\n", lbl.c_str(), s.free);
    std::printf("kvpool_pages{%s,state=\"in_use\"} %u\n", lbl.c_str(), s.in_use);
    std::printf("kvpool_pages{%s,state=\"cached\"} %u\n", lbl.c_str(), s.cached);
    metric("kvpool_pool_bytes", "gauge", "Bytes of pool memory.");
    std::printf("kvpool_pool_bytes{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(p.segment_bytes));
    metric("kvpool_sessions", "gauge", "Worker sessions attached (this query excluded).");
    std::printf("kvpool_sessions{%s} %u\n", lbl.c_str(), sessions);
    metric("kvpool_prefix_query_tokens_total", "counter", "Tokens asked for by prefix lookups.");
    std::printf("kvpool_prefix_query_tokens_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.lookup_blocks * t));
    metric("kvpool_prefix_hit_tokens_total", "counter", "Tokens found cached by prefix lookups.");
    std::printf("kvpool_prefix_hit_tokens_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.hit_blocks * t));
    metric("kvpool_lookups_total", "counter", "Prefix lookup calls.");
    std::printf("kvpool_lookups_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.lookups));
    metric("kvpool_pages_allocated_total", "counter", "Pages handed out by alloc.");
    std::printf("kvpool_pages_allocated_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.allocated));
    metric("kvpool_pages_published_total", "counter", "Pages published (stored).");
    std::printf("kvpool_pages_published_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.published));
    metric("kvpool_publish_duplicates_total", "counter",
           "Publishes answered with a page another worker published first.");
    std::printf("kvpool_publish_duplicates_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.duplicates));
    metric("kvpool_evictions_total", "counter", "Cached pages evicted for new allocations.");
    std::printf("kvpool_evictions_total{%s} %llu\n", lbl.c_str(),
                static_cast<unsigned long long>(s.evicted));
    return 0;
  }
  const double hit = s.lookup_blocks ? double(s.hit_blocks) / double(s.lookup_blocks) : 0.0;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"pool\":\"%s\",\"pages\":{\"total\":%u,\"free\":%u,\"in_use\":%u,"
        "\"cached\":%u},\"sessions\":%u,\"lookups\":%llu,\"query_tokens\":%llu,"
        "\"hit_tokens\":%llu,\"hit_rate\":%.6f,\"allocated\":%llu,\"released\":%llu,"
        "\"published\":%llu,\"duplicates\":%llu,\"evicted\":%llu,\"flushed\":%llu}\n",
        kSchema, json_escape(p.pool_name).c_str(), s.total, s.free, s.in_use, s.cached, sessions,
        static_cast<unsigned long long>(s.lookups),
        static_cast<unsigned long long>(s.lookup_blocks * t),
        static_cast<unsigned long long>(s.hit_blocks * t), hit,
        static_cast<unsigned long long>(s.allocated), static_cast<unsigned long long>(s.released),
        static_cast<unsigned long long>(s.published), static_cast<unsigned long long>(s.duplicates),
        static_cast<unsigned long long>(s.evicted), static_cast<unsigned long long>(s.flushed));
    return 0;
  }
  std::printf("pool %s\n", p.pool_name.c_str());
  std::printf("  pages        %s total: %s free, %s in use, %s cached\n",
              count_text(s.total, g.raw).c_str(), count_text(s.free, g.raw).c_str(),
              count_text(s.in_use, g.raw).c_str(), count_text(s.cached, g.raw).c_str());
  std::printf("  prefix       %s lookups, %s of %s tokens hit (%.1f%%)\n",
              count_text(s.lookups, g.raw).c_str(), count_text(s.hit_blocks * t, g.raw).c_str(),
              count_text(s.lookup_blocks * t, g.raw).c_str(), 100.0 * hit);
  std::printf("  pages moved  %s allocated, %s released, %s published, %s duplicates\n",
              count_text(s.allocated, g.raw).c_str(), count_text(s.released, g.raw).c_str(),
              count_text(s.published, g.raw).c_str(), count_text(s.duplicates, g.raw).c_str());
  std::printf("  dropped      %s evicted, %s flushed\n", count_text(s.evicted, g.raw).c_str(),
              count_text(s.flushed, g.raw).c_str());
  std::printf("  sessions     %u worker(s)\n", sessions);
  return 0;
}

int sessions(const Globals& g) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->sessions();
  if (!succeeded(r)) return 1;
  const uint64_t self = c->session_id();
  if (g.json) {
    std::printf("{\"schema\":%d,\"pool\":\"%s\",\"sessions\":[", kSchema,
                json_escape(c->pool().pool_name).c_str());
    bool first = true;
    for (const auto& s : r.value()) {
      if (s.id == self) continue;
      std::printf(
          "%s{\"id\":%llu,\"pid\":%u,\"uid\":%u,\"held_pages\":%u,\"worker\":\"%s\","
          "\"tenant\":\"%s\"}",
          first ? "" : ",", static_cast<unsigned long long>(s.id), s.pid, s.uid, s.held_pages,
          json_escape(s.worker).c_str(), json_escape(s.tenant).c_str());
      first = false;
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("%8s %8s %8s %10s  %-12s %s\n", "session", "pid", "uid", "pages", "tenant", "worker");
  for (const auto& s : r.value()) {
    if (s.id == self) continue;
    std::printf("%8llu %8u %8u %10s  %-12s %s\n", static_cast<unsigned long long>(s.id), s.pid,
                s.uid, count_text(s.held_pages, g.raw).c_str(), s.tenant.c_str(), s.worker.c_str());
  }
  return 0;
}

// A map of the pool: each character stands for `per_cell` consecutive pages and shows the state
// most of them are in ('.' free, '#' in use, 'o' cached; ties go to in use, then cached).
int pages_map(const Globals& g, uint32_t width) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->pages();
  if (!succeeded(r)) return 1;
  const std::vector<uint8_t>& st = r.value();
  uint64_t count[3] = {0, 0, 0};
  for (const uint8_t s : st)
    ++count[s];
  if (g.json) {
    // Runs of equal state: [state, length], in page order.
    std::printf(
        "{\"schema\":%d,\"pool\":\"%s\",\"pages\":%zu,\"free\":%llu,\"in_use\":%llu,"
        "\"cached\":%llu,\"runs\":[",
        kSchema, json_escape(c->pool().pool_name).c_str(), st.size(),
        static_cast<unsigned long long>(count[0]), static_cast<unsigned long long>(count[1]),
        static_cast<unsigned long long>(count[2]));
    for (size_t i = 0; i < st.size();) {
      size_t j = i;
      while (j < st.size() && st[j] == st[i])
        ++j;
      std::printf("%s[%u,%zu]", i == 0 ? "" : ",", st[i], j - i);
      i = j;
    }
    std::printf("]}\n");
    return 0;
  }
  constexpr uint32_t kMaxRows = 32;
  const uint64_t cells =
      std::max<uint64_t>(1, std::min<uint64_t>(st.size(), uint64_t{width} * kMaxRows));
  const uint64_t per_cell = (st.size() + cells - 1) / cells;
  std::printf(
      "pool %s: %zu pages, each character %llu page(s):  . free (%llu)  # in use (%llu)  "
      "o cached (%llu)\n",
      c->pool().pool_name.c_str(), st.size(), static_cast<unsigned long long>(per_cell),
      static_cast<unsigned long long>(count[0]), static_cast<unsigned long long>(count[1]),
      static_cast<unsigned long long>(count[2]));
  std::string row;
  uint64_t row_start = 0;
  for (uint64_t first = 0; first < st.size(); first += per_cell) {
    uint64_t n[3] = {0, 0, 0};
    for (uint64_t p = first; p < std::min<uint64_t>(st.size(), first + per_cell); ++p)
      ++n[st[p]];
    char ch = '.';
    if (n[1] > 0 && n[1] >= n[0] && n[1] >= n[2]) {
      ch = '#';
    } else if (n[2] > 0 && n[2] >= n[0]) {
      ch = 'o';
    }
    if (row.empty()) row_start = first;
    row += ch;
    if (row.size() == width) {
      std::printf("%8llu  %s\n", static_cast<unsigned long long>(row_start), row.c_str());
      row.clear();
    }
  }
  if (!row.empty())
    std::printf("%8llu  %s\n", static_cast<unsigned long long>(row_start), row.c_str());
  return 0;
}

// evict (count > 0) or flush (count == 0).
int drop(const Globals& g, uint32_t count) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = count == 0 ? c->flush() : c->evict(count);
  if (!succeeded(r)) return 1;
  const char* verb = count == 0 ? "flushed" : "evicted";
  if (g.json) {
    std::printf("{\"schema\":%d,\"pool\":\"%s\",\"%s\":%u}\n", kSchema,
                json_escape(c->pool().pool_name).c_str(), verb, r.value());
  } else {
    std::printf("%s %u cached page(s) from pool %s\n", verb, r.value(),
                c->pool().pool_name.c_str());
  }
  return 0;
}

struct PlanArgs {
  uint32_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0, batch = 1, tokens_per_page = 16;
  std::string dtype = "fp16";
  std::string capacity;
};

int plan(const Globals& g, const PlanArgs& a) {
  const auto dtype = kvpool::parse_dtype(a.dtype);
  if (!dtype) {
    std::fprintf(stderr, "kvpoolctl plan: --dtype %s is not fp16, bf16, fp8_e4m3 or int8\n",
                 a.dtype.c_str());
    return 2;
  }
  const kvpool::Geometry geo{a.layers, a.kv_heads, a.head_dim, a.tokens_per_page, *dtype};
  if (const std::string e = kvpool::validate(geo); !e.empty()) {
    std::fprintf(stderr, "kvpoolctl plan: %s\n", e.c_str());
    return 2;
  }
  const uint64_t per_token = kvpool::kv_bytes_per_token(geo);
  const uint64_t per_seq = kvpool::kv_bytes(geo, a.tokens);
  const uint64_t pages = kvpool::pages_for_tokens(geo, a.tokens);
  const uint64_t page_bytes = kvpool::page_data_bytes(geo) + kvpool::page_scale_bytes(geo);
  const uint64_t pool_per_seq = pages * page_bytes;
  uint64_t capacity = 0;
  if (!a.capacity.empty()) {
    // Binary units only here: 80GiB, 512MiB, or plain bytes.
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(a.capacity, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || !(v > 0) || v > 1e30) {
      std::fprintf(stderr, "kvpoolctl plan: --capacity %s is not a positive size like 80GiB\n",
                   a.capacity.c_str());
      return 2;
    }
    std::string unit = a.capacity.substr(used);
    while (!unit.empty() && unit.front() == ' ')
      unit.erase(0, 1);
    double mult = 1;
    if (unit == "KiB")
      mult = 1024.0;
    else if (unit == "MiB")
      mult = 1024.0 * 1024;
    else if (unit == "GiB")
      mult = 1024.0 * 1024 * 1024;
    else if (unit == "TiB")
      mult = 1024.0 * 1024 * 1024 * 1024;
    else if (unit == "GB")
      mult = 1e9;
    else if (unit == "TB")
      mult = 1e12;
    else if (!unit.empty() && unit != "B") {
      std::fprintf(stderr,
                   "kvpoolctl plan: --capacity %s: unit must be B, KiB, MiB, GiB, TiB, GB or TB\n",
                   a.capacity.c_str());
      return 2;
    }
    capacity = static_cast<uint64_t>(v * mult);
  }
  const uint64_t fit = capacity ? capacity / pool_per_seq : 0;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype\":\"%s\","
        "\"tokens\":%u,\"batch\":%u,\"tokens_per_page\":%u,\"bytes_per_token\":%llu,"
        "\"bytes_per_sequence\":%llu,\"bytes_per_batch\":%llu,\"pages_per_sequence\":%llu,"
        "\"page_bytes\":%llu,\"pool_bytes_per_sequence\":%llu,\"capacity_bytes\":%llu,"
        "\"sequences_that_fit\":%llu}\n",
        kSchema, a.layers, a.kv_heads, a.head_dim, std::string(kvpool::dtype_name(*dtype)).c_str(),
        a.tokens, a.batch, a.tokens_per_page, static_cast<unsigned long long>(per_token),
        static_cast<unsigned long long>(per_seq),
        static_cast<unsigned long long>(per_seq * a.batch), static_cast<unsigned long long>(pages),
        static_cast<unsigned long long>(page_bytes), static_cast<unsigned long long>(pool_per_seq),
        static_cast<unsigned long long>(capacity), static_cast<unsigned long long>(fit));
    return 0;
  }
  std::printf("KV cache of %u layers x %u KV heads x head dim %u, %s:\n", a.layers, a.kv_heads,
              a.head_dim, std::string(kvpool::dtype_name(*dtype)).c_str());
  std::printf("  per token     %s\n", bytes_text(per_token, g.raw).c_str());
  std::printf("  per sequence  %s for %s tokens\n", bytes_text(per_seq, g.raw).c_str(),
              count_text(a.tokens, g.raw).c_str());
  if (a.batch > 1) {
    std::printf("  per batch     %s for %u sequences\n",
                bytes_text(per_seq * a.batch, g.raw).c_str(), a.batch);
  }
  std::printf("  in the pool   %s pages of %u tokens (%s each) = %s per sequence\n",
              count_text(pages, g.raw).c_str(), a.tokens_per_page,
              bytes_text(page_bytes, g.raw).c_str(), bytes_text(pool_per_seq, g.raw).c_str());
  if (capacity) {
    std::printf("  capacity      %s holds %s such sequences\n", bytes_text(capacity, g.raw).c_str(),
                count_text(fit, g.raw).c_str());
  }
  return 0;
}

int run(int argc, char** argv) {
  CLI::App app{
      "kvpoolctl: inspect a running kvpoold and size KV caches.\n"
      "Exit codes: 0 ok, 1 failure (e.g. the daemon is not running), 2 usage error."};
  app.require_subcommand(1);
  Globals g;
  g.socket = kvpool::client::default_socket_path();
  g.raw = isatty(STDOUT_FILENO) == 0;
  bool raw_flag = false;
  app.add_option("--socket", g.socket, "kvpoold's socket")->capture_default_str();
  app.add_option("--pool", g.pool, "Pool to inspect (default: the daemon's first pool)");
  app.add_flag("--json", g.json, "One JSON object per report (\"schema\": 1)");
  app.add_flag("--raw", raw_flag,
               "Plain numbers instead of human units (the default off a terminal)");

  double watch = 0;
  auto* status =
      app.add_subcommand("status", "The pool the daemon serves: memory, pages by state, sessions");
  status->add_option("--watch", watch, "Repeat every SEC seconds until interrupted")
      ->check(CLI::PositiveNumber);
  std::string format = "text";
  auto* stats = app.add_subcommand("stats", "Counters: prefix hits, pages moved, evictions");
  stats->add_option("--format", format, "text or prom (Prometheus text exposition)")
      ->check(CLI::IsMember({"text", "prom"}))
      ->capture_default_str();
  stats->add_option("--watch", watch, "Repeat every SEC seconds until interrupted")
      ->check(CLI::PositiveNumber);
  auto* sessc = app.add_subcommand("sessions", "The worker sessions attached to the pool");
  uint32_t map_width = 64;
  auto* pagesc = app.add_subcommand("pages", "A map of the pool's pages by state");
  pagesc->add_option("--width", map_width, "Characters per row")
      ->capture_default_str()
      ->check(CLI::Range(8u, 1024u));
  uint32_t evict_count = 0;
  auto* evictc = app.add_subcommand(
      "evict", "Drop up to N cached pages, least recently released first (root or admin group)");
  evictc->add_option("count", evict_count, "Pages to drop")
      ->required()
      ->check(CLI::Range(1u, UINT32_MAX));
  auto* flushc =
      app.add_subcommand("flush", "Drop every cached page not in use (root or admin group)");
  PlanArgs pa;
  auto* planc = app.add_subcommand(
      "plan", "KV bytes for a model and context (GQA aware) and how many sequences fit");
  planc->add_option("--layers", pa.layers, "Transformer layers")->required();
  planc->add_option("--kv-heads", pa.kv_heads, "KV heads (not query heads: GQA/MQA)")->required();
  planc->add_option("--head-dim", pa.head_dim, "Head dimension")->required();
  planc->add_option("--tokens", pa.tokens, "Context length in tokens")
      ->required()
      ->check(CLI::Range(1u, 1u << 31));
  planc->add_option("--dtype", pa.dtype, "fp16, bf16, fp8_e4m3, int8")->capture_default_str();
  planc->add_option("--batch", pa.batch, "Sequences")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 31));
  planc->add_option("--tokens-per-page", pa.tokens_per_page, "Tokens per pool page")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  planc->add_option("--capacity", pa.capacity, "Pool capacity, e.g. 80GiB: prints how many fit");
  // Global options may also follow the verb: kvpoolctl status --json.
  for (CLI::App* sub : {status, stats, sessc, pagesc, evictc, flushc, planc})
    sub->fallthrough();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (raw_flag) g.raw = true;
  if (g.json) g.raw = true;

  if (planc->parsed()) return plan(g, pa);
  if (sessc->parsed()) return sessions(g);
  if (pagesc->parsed()) return pages_map(g, map_width);
  if (evictc->parsed()) return drop(g, evict_count);
  if (flushc->parsed()) return drop(g, 0);
  auto once = [&] { return status->parsed() ? status_once(g) : stats_once(g, format); };
  if (watch <= 0) return once();
  for (;;) {
    if (isatty(STDOUT_FILENO)) std::printf("\033[H\033[2J");
    const int rc = once();
    std::fflush(stdout);
    if (rc != 0) return rc;
    std::this_thread::sleep_for(std::chrono::duration<double>(watch));
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvpoolctl: %s\n", e.what());
    return 1;
  }
}

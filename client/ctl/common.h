// kvpoolctl's shared pieces: global options, number and byte formatting, how a verb connects to
// the daemon and reports a failed call, and the verbs themselves (one file per group:
// snapshot_verbs.cpp, pool_verbs.cpp, events_verb.cpp, plan_verb.cpp; kvpoolctl.cpp wires them
// to the command line).
//
// Output conventions: text for people (human units on a terminal, plain numbers with --raw or
// off a terminal); --json prints one object per report (events: one per line) carrying
// "schema": 1. Exit codes: 0 ok, 1 failure (daemon not running, refused, ...), 2 usage.
//
// Text that comes from the daemon or its stats segment (worker, tenant and pool names, error
// messages, which may quote client data) is never printed raw: display_text in text output,
// json_escape in JSON (common/text.h), so a worker name cannot drive the terminal or make the
// JSON invalid UTF-8.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "common/text.h"

namespace kvpool::ctl {

inline constexpr int kSchema = 1;

struct Globals {
  std::string socket;
  std::string pool;
  bool json = false;
  bool raw = false;
  bool no_shm = false;  // ask the daemon instead of reading the stats segment
};

std::string bytes_text(uint64_t b, bool raw);
std::string count_text(uint64_t n, bool raw);
// A duration in ns as "850 ns", "12.3 us", "4.56 ms", "1.20 s".
std::string duration_text(double ns);

// Connects (hello to g.pool), or prints why not and returns null.
std::unique_ptr<client::Connection> connect(const Globals& g);

// True when the call succeeded; otherwise prints the daemon's reason (the verb then exits 1).
template <typename T>
bool succeeded(const client::Result<T>& r) {
  if (r.ok()) return true;
  // The daemon's messages do not repeat the error's name; it is said here, once.
  std::fprintf(stderr, "kvpoolctl: %s: %s\n",
               std::string(errc_name(r.error().status.code())).c_str(),
               display_text(r.error().message).c_str());
  return false;
}

// A stats snapshot from the segment beside the socket, or (no_shm, or no usable segment) from
// the snapshot op, in which case the asking session is taken out of the session counts and
// `tenant` is the tenant the daemon gave this user. Prints why not and returns false.
struct Fetched {
  stats::Snapshot snapshot;
  bool from_segment = false;
  std::string tenant;  // "" when read from the segment (no session: no tenant)
};
bool fetch_snapshot(const Globals& g, Fetched& out);

// Verbs: each returns the exit code.
int status_verb(const Globals& g);
int stats_verb(const Globals& g, const std::string& format);
int sessions_verb(const Globals& g);
int pages_verb(const Globals& g, uint32_t width);
int drop_verb(const Globals& g, uint32_t count);  // evict (count > 0) or flush (0)
int resize_verb(const Globals& g, uint32_t pages);
int prefixes_verb(const Globals& g, uint32_t limit);
int reload_verb(const Globals& g);
int events_verb(const Globals& g, uint64_t from_seq, uint64_t count);

struct PlanArgs {
  uint32_t layers = 0, kv_heads = 0, head_dim = 0, tokens = 0, batch = 1, tokens_per_page = 16;
  std::string dtype = "fp16";
  std::string capacity;
  std::string models;  // a models.yaml-style file: plan every model in it (or --model's)
  std::string model;
};
int plan_verb(const Globals& g, const PlanArgs& a);

}  // namespace kvpool::ctl

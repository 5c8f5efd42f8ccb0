// kvpoolctl: inspect and steer a running kvpoold, and size KV caches.
//
//   kvpoolctl status [--watch SEC]           the pool: memory, pages by state, sessions
//   kvpoolctl stats [--format text|prom]     counters and operation latencies (prom: Prometheus)
//   kvpoolctl sessions                       the worker sessions attached to the pool
//   kvpoolctl pages [--width N]              a map of the pool's pages by state
//   kvpoolctl prefixes [--limit N]           the most-hit indexed blocks (prefixes)
//   kvpoolctl events [--from SEQ] [--count N]  follow stored/removed/cleared events
//   kvpoolctl evict N | flush | reload       drop cached pages, reload the config (admin)
//   kvpoolctl resize PAGES                   grow or shrink an elastic pool (admin)
//   kvpoolctl plan --layers L --kv-heads H --head-dim D --tokens N [--dtype fp16] ...
//   kvpoolctl plan --models FILE [--model NAME] --tokens N   hybrid, windowed and latent models
// Global: --socket PATH (default $KVPOOL_SOCKET, else the daemon's default), --pool NAME, --json
// (one object per report, with "schema": 1), --raw (plain numbers instead of human units),
// --no-shm (status and stats ask the daemon instead of reading its stats segment).
// Exit codes: 0 ok, 1 failure (e.g. the daemon is not running), 2 usage error.
// The verbs live in client/ctl/.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "client/ctl/common.h"
#include "common/main_guard.h"

namespace {

using namespace kvpool::ctl;

// The subcommands' names, comma-separated.
std::string command_list(CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!out.empty()) out += ", ";
    out += sub->get_name();
  }
  return out;
}

// The first word of the command line that is neither an option, an option's value nor a
// subcommand: what the user meant as the command. "" when there is none.
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind('-', 0) == 0) {
      if (a == "--socket" || a == "--pool") {
        ++i;  // its value
      } else if (a != "--json" && a != "--raw" && a != "--no-shm") {
        return "";  // an option CLI11 will name itself (its value is no command)
      }
      continue;
    }
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == a) return "";
    }
    return a;
  }
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{
      "kvpoolctl: inspect and steer a running kvpoold, and size KV caches.\n"
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
  app.add_flag("--no-shm", g.no_shm,
               "status, stats: ask the daemon (snapshot op) instead of reading <socket>.stats");

  double watch = 0;
  auto* status =
      app.add_subcommand("status", "The pool the daemon serves: memory, pages by state, sessions");
  status->add_option("--watch", watch, "Repeat every SEC seconds until interrupted")
      ->check(CLI::PositiveNumber);
  std::string format = "text";
  auto* stats = app.add_subcommand(
      "stats", "Counters (prefix hits, pages moved, evictions, events) and operation latencies");
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
  uint32_t prefix_limit = 20;
  auto* prefixc = app.add_subcommand(
      "prefixes",
      "The most-hit indexed blocks: hits, the prefix each ends, state, age (yours; all tenants "
      "for root and the admin group)");
  prefixc->add_option("--limit", prefix_limit, "How many to list")
      ->capture_default_str()
      ->check(CLI::Range(1u, kvpool::wire::kMaxPrefixes));
  uint64_t from_seq = 0;
  uint64_t event_count = 0;
  auto* eventsc = app.add_subcommand(
      "events",
      "Follow stored/removed/cleared events of the pool's prefix index, with sequence numbers "
      "(a gap line when this reader fell behind)");
  eventsc
      ->add_option("--from", from_seq,
                   "First sequence number wanted (default: new events only); older ones than "
                   "the daemon keeps arrive as a gap")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  eventsc->add_option("--count", event_count, "Stop after N events (gaps count)")
      ->check(CLI::Range(uint64_t{1}, UINT64_MAX));
  uint32_t evict_count = 0;
  auto* evictc = app.add_subcommand(
      "evict",
      "Drop up to N cached pages in the pool's eviction order (its policy: prefix, lru or s3fifo; "
      "the pages an alloc would take next); pinned pages stay (root or admin group)");
  evictc->add_option("count", evict_count, "Pages to drop")
      ->required()
      ->check(CLI::Range(1u, UINT32_MAX));
  auto* flushc =
      app.add_subcommand("flush", "Drop every cached page not in use (root or admin group)");
  uint32_t resize_pages = 0;
  auto* resizec = app.add_subcommand(
      "resize",
      "Resize an elastic pool by whole segments within its min and max: below PAGES it grows to "
      "the first size at or above PAGES, above it shrinks while it stays at or above PAGES; a "
      "shrink is refused while a page past the new end is in use (root or admin group)");
  resizec->add_option("pages", resize_pages, "Pages wanted")
      ->required()
      ->check(CLI::Range(1u, UINT32_MAX));
  auto* reloadc = app.add_subcommand(
      "reload",
      "Make the daemon re-read its config file, as SIGHUP does, and say what was applied, "
      "refused or needs a restart (root or admin group)");
  PlanArgs pa;
  auto* planc = app.add_subcommand(
      "plan", "KV bytes for a model and context (GQA aware) and how many sequences fit");
  auto* layers_opt = planc->add_option("--layers", pa.layers, "Transformer layers");
  auto* heads_opt =
      planc->add_option("--kv-heads", pa.kv_heads, "KV heads (not query heads: GQA/MQA)");
  auto* dim_opt = planc->add_option("--head-dim", pa.head_dim, "Head dimension");
  auto* models_opt = planc->add_option(
      "--models", pa.models,
      "A file of model geometries (shared/data/models.yaml's form: layer groups of full, sliding, "
      "chunked or latent attention): the KV bytes of each at --tokens, against every layer "
      "keeping full K/V; instead of --layers/--kv-heads/--head-dim");
  planc->add_option("--model", pa.model, "With --models: only the model of this name")
      ->needs(models_opt);
  for (CLI::Option* o : {layers_opt, heads_opt, dim_opt}) {
    o->excludes(models_opt);
    models_opt->excludes(o);
  }
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
  for (CLI::App* sub :
       {status, stats, sessc, pagesc, prefixc, eventsc, evictc, flushc, resizec, reloadc, planc})
    sub->fallthrough();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A word that is no command reads better named than as "a subcommand is required".
    if (const std::string word = unknown_command(app, argc, argv); !word.empty()) {
      std::fprintf(stderr, "kvpoolctl: unknown command '%s' (commands: %s); see --help\n",
                   word.c_str(), command_list(app).c_str());
      return 2;
    }
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (raw_flag) g.raw = true;
  if (g.json) g.raw = true;

  if (planc->parsed()) return plan_verb(g, pa);
  if (sessc->parsed()) return sessions_verb(g);
  if (pagesc->parsed()) return pages_verb(g, map_width);
  if (prefixc->parsed()) return prefixes_verb(g, prefix_limit);
  if (eventsc->parsed()) return events_verb(g, from_seq, event_count);
  if (evictc->parsed()) return drop_verb(g, evict_count);
  if (flushc->parsed()) return drop_verb(g, 0);
  if (resizec->parsed()) return resize_verb(g, resize_pages);
  if (reloadc->parsed()) return reload_verb(g);
  auto once = [&] { return status->parsed() ? status_verb(g) : stats_verb(g, format); };
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
  return kvpool::guarded_main("kvpoolctl", [&] { return run(argc, argv); });
}

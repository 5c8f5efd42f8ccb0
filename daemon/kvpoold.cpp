// kvpoold: the kvpool daemon. Owns the pools, serves workers on a Unix socket.
//
//   kvpoold [--config FILE] [--socket PATH]      run (built-in default config without --config)
//   kvpoold --check-config FILE                  validate a config file and exit (0 = valid;
//                                                a warning per pool this machine cannot back)
//   kvpoold --version
//   kvpoold --inline-copy-bytes SIZE ...         copies above SIZE (default 1MiB), page copies or
//                                                host-tier moves of one call, run off the loop
//
// Signals: SIGTERM / SIGINT stop (every session is released, the socket removed); SIGHUP re-reads
// and validates the config file, applies what can change live (limits, tenants, logging), names
// what needs a restart, and keeps the running config when the file is invalid.
// The same reload runs for `kvpoolctl reload` (root or admin_group), which is told the outcome.
// Beside the socket it publishes a read-only stats segment, <socket>.stats, and with
// metrics.listen it serves Prometheus metrics over HTTP from a thread of its own.
// Under systemd (Type=notify) it sends READY=1 with a STATUS= line once the pools and the socket
// are up, RELOADING=1 then READY=1 around a reload, STOPPING=1 when it stops, and WATCHDOG=1
// from the event loop at half WatchdogSec.

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>

#include "common/main_guard.h"
#include "daemon/config/config.h"
#include "daemon/config/config_check.h"
#include "daemon/daemon.h"

#ifndef KVPOOL_VERSION
#define KVPOOL_VERSION "0.0.0"
#endif

namespace {

using namespace kvpool::daemon;

int run(int argc, char** argv) {
  CLI::App app{
      "kvpoold: the kvpool KV-cache page pool daemon.\n"
      "Owns the pools of its config and serves model workers on a Unix socket."};
  std::string config_path;
  std::string check_path;
  std::string socket_override;
  int frame_timeout_ms = 10000;
  std::string inline_copy = "1MiB";
  bool version = false;
  app.add_option("--config", config_path, "Config file (YAML); the built-in default without it");
  app.add_option("--check-config", check_path, "Validate this config file and exit (0 = valid)");
  app.add_option("--socket", socket_override, "Listen on this path instead of the config's");
  app.add_option("--frame-timeout-ms", frame_timeout_ms,
                 "Close a connection that leaves a frame incomplete this long")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600 * 1000));
  app.add_option(
         "--inline-copy-bytes", inline_copy,
         "Daemon-side copies up to this size (a copy request, or one call's host-tier "
         "demotions and promotions) run on the event loop; larger ones on a thread of "
         "their own, and the call's reply waits for them (\"1B\" sends nearly every one there)")
      ->capture_default_str();
  app.add_flag("--version", version, "Print the version and exit");
  CLI11_PARSE(app, argc, argv);
  Capacity inline_copy_bytes;
  if (std::string err = parse_capacity(inline_copy, inline_copy_bytes);
      !err.empty() || inline_copy_bytes.unit != Capacity::Unit::bytes) {
    std::cerr << "kvpoold: --inline-copy-bytes: "
              << (err.empty() ? "expected bytes, like \"1MiB\"" : err) << "\n";
    return 2;
  }

  if (version) {
    std::cout << "kvpoold " << KVPOOL_VERSION << "\n";
    return 0;
  }
  if (!check_path.empty()) {
    const auto cfg = load_config(check_path);
    if (!cfg.ok()) {
      std::cerr << "kvpoold: " << cfg.error().message << "\n";
      return 1;
    }
    // What this machine makes impossible: the errors the start would refuse with.
    const std::vector<std::string> errors = machine_errors(cfg.value());
    for (const std::string& e : errors)
      std::cerr << "kvpoold: " << e << "\n";
    if (!errors.empty()) {
      std::cerr << "kvpoold: " << check_path << ": " << errors.size()
                << " error(s) on this machine\n";
      return 1;
    }
    // Valid, but a pool that this machine cannot back would fail the start: said, not refused
    // (the file may be meant for another machine).
    std::vector<std::string> warnings;
    if (const auto available = available_memory_for(cfg.value())) {
      warnings = capacity_warnings(cfg.value(), *available);
    }
    for (const std::string& w : warnings)
      std::cerr << "kvpoold: warning: " << w << "\n";
    std::cout << check_path << ": valid (" << cfg.value().pools.size() << " pool(s), "
              << cfg.value().tenants.size() << " tenant(s)";
    if (!warnings.empty()) std::cout << ", " << warnings.size() << " warning(s)";
    std::cout << ")\n";
    return 0;
  }

  DaemonOptions options;
  options.config_path = config_path;
  options.socket_override = socket_override;
  options.frame_timeout_ms = frame_timeout_ms;
  options.inline_copy_bytes = inline_copy_bytes.value;
  options.version = KVPOOL_VERSION;
  auto daemon = Daemon::start(options);
  if (!daemon.ok()) {
    std::cerr << "kvpoold: " << daemon.error().message << "\n";
    return 1;
  }
  return daemon.value()->run();
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  return kvpool::guarded_main("kvpoold: fatal", [&] { return run(argc, argv); });
}

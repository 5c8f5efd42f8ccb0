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

#include <sys/resource.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <iostream>

#include "common/prometheus.h"
#include "common/stats_layout.h"

#include "daemon/config/config.h"
#include "daemon/config/config_check.h"
#include "daemon/memory/host_backend.h"
#include "daemon/notify.h"
#include "daemon/reload.h"
#include "daemon/server/server.h"
#include "daemon/service/service.h"
#include "daemon/stats_publisher.h"
#include "daemon/telemetry/kv_event_publisher.h"
#include "daemon/telemetry/log.h"
#include "daemon/telemetry/metrics_http.h"
#include "daemon/telemetry/stats_segment.h"

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

  auto loaded = config_path.empty() ? kvpool::wire::Result<Config>(default_config())
                                    : load_config(config_path);
  if (!loaded.ok()) {
    std::cerr << "kvpoold: " << loaded.error().message << "\n";
    return 1;
  }
  Config config = std::move(loaded.value());
  if (!socket_override.empty()) config.socket_path = socket_override;
  // The same machine checks --check-config makes, so that the two never disagree.
  if (const std::vector<std::string> errors = machine_errors(config); !errors.empty()) {
    for (const std::string& e : errors) {
      log_event(LogLevel::error, "config_refused", {kv("error", e)});
      std::cerr << "kvpoold: " << e << "\n";
    }
    return 1;
  }
  LogLevel level = LogLevel::info;
  parse_log_level(config.log_level, level);
  set_log_level(level);
  log_event(LogLevel::info, "starting",
            {kv("version", KVPOOL_VERSION), kv("config", config.source), kv("pid", ::getpid())});

  // One descriptor per session: take the whole hard limit, and say when max_sessions exceeds it.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  // The events endpoints hold up to zmq_max_connections each (and a few past it for a moment).
  const uint64_t zmq_files =
      config.events.zmq_endpoint.empty() ? 0 : uint64_t{2} * 2 * config.events.zmq_max_connections;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur < config.max_sessions + zmq_files + 64ull) {
    log_event(LogLevel::warn, "fd_limit_low",
              {kv("limit", static_cast<uint64_t>(files.rlim_cur)),
               kv("max_sessions", config.max_sessions), kv("zmq_descriptors", zmq_files),
               kv("detail", "sessions beyond the descriptor limit wait in the accept queue")});
  }

  const int stale = HostBackend::remove_stale_segments();
  if (stale > 0) log_event(LogLevel::info, "stale_segments_removed", {kv("count", stale)});

  std::string why;
  auto backend = make_backend(config.backend, config.device, why);
  if (!backend.ok()) {
    log_event(LogLevel::error, "backend_failed", {kv("error", backend.error().message)});
    std::cerr << "kvpoold: " << backend.error().message << "\n";
    return 1;
  }
  log_event(LogLevel::info, "backend", {kv("name", backend.value()->name()), kv("why", why)});
  auto service = Service::create(config, std::move(backend.value()));
  if (!service.ok()) {
    log_event(LogLevel::error, "pool_failed", {kv("error", service.error().message)});
    std::cerr << "kvpoold: " << service.error().message << "\n";
    return 1;
  }

  service.value()->set_inline_copy_bytes(inline_copy_bytes.value);

  boost::asio::io_context io(1);
  // KV events for routers (vLLM's ZeroMQ format): bound before the socket listens, so a bad
  // endpoint stops the start-up with libzmq's reason before any worker attaches.
  std::unique_ptr<KvEventPublisher> kv_publisher;
  if (!config.events.zmq_endpoint.empty()) {
    auto started = KvEventPublisher::start(config.events, io);
    if (!started.ok()) {
      log_event(LogLevel::error, "kv_events_failed", {kv("error", started.error().message)});
      std::cerr << "kvpoold: " << started.error().message << "\n";
      return 1;
    }
    kv_publisher = std::move(started.value());
    log_event(LogLevel::info, "kv_events_publishing",
              {kv("endpoint", config.events.zmq_endpoint),
               kv("replay", config.events.zmq_replay_endpoint),
               kv("block_hash", config.events.zmq_block_hash)});
  }
  Server server(io, *service.value(), std::chrono::milliseconds(frame_timeout_ms));
  server.set_kv_event_publisher(kv_publisher.get());
  if (kv_publisher) service.value()->set_kv_event_counters(&kv_publisher->counters());
  const auto listening = server.listen(config.socket_path, config.socket_mode, config.socket_group);
  if (!listening.ok()) {
    log_event(LogLevel::error, "listen_failed", {kv("error", listening.error().message)});
    std::cerr << "kvpoold: " << listening.error().message << "\n";
    return 1;
  }
  const std::string status = "serving " + std::to_string(service.value()->pools().size()) +
                             " pool(s) on " + config.socket_path + " (" +
                             std::string(service.value()->backend().name()) + " backend)";
  Notifier notifier;
  // SIGHUP and `kvpoolctl reload` take the same path.
  auto reload = [&]() {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    notifier.notify("RELOADING=1\nMONOTONIC_USEC=" +
                    std::to_string(uint64_t(now.tv_sec) * 1000000 + uint64_t(now.tv_nsec) / 1000));
    kvpool::wire::ReloadReply outcome =
        reload_config(config_path, socket_override, *service.value());
    notifier.notify("READY=1\nSTATUS=" + status + reload_status_note(outcome));
    return outcome;
  };
  service.value()->set_reload_handler(reload);

  // The stats segment beside the socket (an anonymous one when it is off or cannot be made, so
  // that the metrics endpoint reads snapshots the same way), refreshed from this loop.
  const size_t snapshot_bytes = kvpool::stats::snapshot_bytes(service.value()->pools().size());
  std::unique_ptr<StatsSegment> segment;
  if (config.metrics.stats_segment) {
    auto file = StatsSegment::create_file(StatsSegment::path_for(config.socket_path),
                                          snapshot_bytes, config.socket_mode, config.socket_group);
    if (file.ok()) {
      segment = std::move(file.value());
      log_event(LogLevel::info, "stats_segment", {kv("path", segment->path())});
    } else {
      log_event(LogLevel::warn, "stats_segment_failed",
                {kv("error", file.error().message),
                 kv("detail", "kvpoolctl falls back to the snapshot op")});
    }
  }
  if (!segment) {
    auto anonymous = StatsSegment::create_anonymous(snapshot_bytes);
    if (!anonymous.ok()) {
      std::cerr << "kvpoold: " << anonymous.error().message << "\n";
      return 1;
    }
    segment = std::move(anonymous.value());
  }
  StatsPublisher publisher(io, *service.value(), *segment);
  publisher.start();
  server.set_activity_listener(&publisher);

  // The metrics endpoint reads the segment only, on its own thread.
  std::unique_ptr<MetricsHttp> metrics;
  if (!config.metrics.listen.empty()) {
    ListenAddress address;
    parse_listen_address(config.metrics.listen, address);  // validated with the config
    auto started = MetricsHttp::start(address, [&segment]() -> std::optional<std::string> {
      std::vector<std::byte> bytes;
      kvpool::stats::Snapshot snapshot;
      if (!segment->read(bytes).empty() ||
          !kvpool::stats::decode(bytes, kvpool::stats::kLayoutVersion, snapshot).empty()) {
        return std::nullopt;
      }
      return kvpool::stats::prometheus_text(snapshot);
    });
    if (!started.ok()) {
      log_event(LogLevel::error, "metrics_failed", {kv("error", started.error().message)});
      std::cerr << "kvpoold: " << started.error().message << "\n";
      return 1;
    }
    metrics = std::move(started.value());
    log_event(LogLevel::info, "metrics_listening", {kv("address", metrics->bound())});
  }

  boost::asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        if (sig == SIGHUP) {
          reload();
          signals.async_wait(on_signal);
          return;
        }
        log_event(LogLevel::info, "stopping",
                  {kv("signal", sig), kv("sessions", server.connections())});
        notifier.notify("STOPPING=1\nSTATUS=stopping");
        metrics.reset();
        publisher.stop();
        server.stop();
        io.stop();
      };
  signals.async_wait(on_signal);

  // The watchdog is fed from the event loop itself, so a loop that stops turning stops feeding.
  boost::asio::steady_timer watchdog(io);
  const auto interval = Notifier::watchdog_interval();
  std::function<void(const boost::system::error_code&)> feed =
      [&](const boost::system::error_code& ec) {
        if (ec) return;
        notifier.notify("WATCHDOG=1");
        watchdog.expires_after(interval);
        watchdog.async_wait(feed);
      };
  if (notifier.enabled() && interval.count() > 0) {
    watchdog.expires_after(interval);
    watchdog.async_wait(feed);
  }

  notifier.notify("READY=1\nSTATUS=" + status);
  log_event(LogLevel::info, "ready",
            {kv("socket", config.socket_path), kv("pools", service.value()->pools().size())});
  io.run();
  metrics.reset();
  publisher.stop();
  server.stop();
  if (kv_publisher) {
    const KvEventCounters& c = kv_publisher->counters();
    log_event(LogLevel::info, "kv_events_stopped",
              {kv("batches_published", c.batches_published),
               kv("batches_dropped", c.batches_dropped), kv("replay_requests", c.replay_requests),
               kv("connections_refused", kv_publisher->connections_refused())});
  }
  log_event(LogLevel::info, "stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvpoold: fatal: " << e.what() << "\n";
    return 1;
  }
}

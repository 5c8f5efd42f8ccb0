#include "daemon/daemon.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <csignal>
#include <optional>

#include "common/prometheus.h"
#include "common/stats_layout.h"
#include "daemon/config/config_check.h"
#include "daemon/memory/host_backend.h"
#include "daemon/reload.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// Logs `event` with the error and hands the error on.
wire::Error failed(const char* event, wire::Error e) {
  log_event(LogLevel::error, event, {kv("error", e.message)});
  return e;
}

}  // namespace

Daemon::Daemon(const DaemonOptions& options, Config config)
    : options_(options), config_(std::move(config)) {}

Daemon::~Daemon() {
  stop();
}

wire::Result<std::unique_ptr<Daemon>> Daemon::start(const DaemonOptions& options) {
  auto loaded = options.config_path.empty() ? wire::Result<Config>(default_config())
                                            : load_config(options.config_path);
  if (!loaded.ok()) return loaded.error();
  Config config = std::move(loaded.value());
  if (!options.socket_override.empty()) config.socket_path = options.socket_override;
  // The same machine checks --check-config makes, so that the two never disagree.
  if (const std::vector<std::string> errors = machine_errors(config); !errors.empty()) {
    std::string all;
    for (const std::string& e : errors) {
      log_event(LogLevel::error, "config_refused", {kv("error", e)});
      all += (all.empty() ? "" : "\nkvpoold: ") + e;
    }
    return wire::Error::of(Errc::invalid_argument, all);
  }
  LogLevel level = LogLevel::info;
  parse_log_level(config.log_level, level);
  set_log_level(level);
  log_event(LogLevel::info, "starting",
            {kv("version", options.version), kv("config", config.source), kv("pid", ::getpid())});
  std::unique_ptr<Daemon> d(new Daemon(options, std::move(config)));
  d->raise_file_limit();

  const int stale = HostBackend::remove_stale_segments();
  if (stale > 0) log_event(LogLevel::info, "stale_segments_removed", {kv("count", stale)});
  std::string why;
  auto backend = make_backend(d->config_.backend, d->config_.device, why);
  if (!backend.ok()) return failed("backend_failed", backend.error());
  log_event(LogLevel::info, "backend", {kv("name", backend.value()->name()), kv("why", why)});
  auto service = Service::create(d->config_, std::move(backend.value()));
  if (!service.ok()) return failed("pool_failed", service.error());
  d->service_ = std::move(service.value());
  d->service_->set_inline_copy_bytes(options.inline_copy_bytes);

  d->server_ = std::make_unique<Server>(d->io_, *d->service_,
                                        std::chrono::milliseconds(options.frame_timeout_ms));
  const Config& c = d->config_;
  // The socket first: it is where a second kvpoold of the same config finds the first one and
  // stops. Binding the events endpoint before it would take an ipc endpoint from the running
  // daemon (libzmq replaces the path), whose subscribers would then hear nothing.
  if (auto ok = d->server_->listen(c.socket_path, c.socket_mode, c.socket_group); !ok.ok()) {
    return failed("listen_failed", ok.error());
  }
  // Before the loop runs, so no worker is served until the events are bound, and a bad endpoint
  // stops the start-up with libzmq's reason.
  if (auto ok = d->start_kv_events(); !ok.ok()) return ok.error();
  d->server_->set_kv_event_publisher(d->kv_publisher_.get());
  if (d->kv_publisher_) d->service_->set_kv_event_counters(&d->kv_publisher_->counters());
  d->status_ = "serving " + std::to_string(d->service_->pools().size()) + " pool(s) on " +
               c.socket_path + " (" + std::string(d->service_->backend().name()) + " backend)";
  d->service_->set_reload_handler([daemon = d.get()] { return daemon->reload(); });
  if (auto ok = d->open_stats_segment(); !ok.ok()) return ok.error();
  d->publisher_ = std::make_unique<StatsPublisher>(d->io_, *d->service_, *d->segment_);
  d->publisher_->start();
  d->server_->set_activity_listener(d->publisher_.get());
  if (auto ok = d->start_metrics(); !ok.ok()) return ok.error();
  return d;
}

void Daemon::raise_file_limit() const {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  // The events endpoints hold up to zmq_max_connections each (and a few past it for a moment).
  const uint64_t zmq_files = config_.events.zmq_endpoint.empty()
                                 ? 0
                                 : uint64_t{2} * 2 * config_.events.zmq_max_connections;
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 &&
      files.rlim_cur < config_.max_sessions + zmq_files + 64ull) {
    log_event(LogLevel::warn, "fd_limit_low",
              {kv("limit", static_cast<uint64_t>(files.rlim_cur)),
               kv("max_sessions", config_.max_sessions), kv("zmq_descriptors", zmq_files),
               kv("detail", "sessions beyond the descriptor limit wait in the accept queue")});
  }
}

wire::Result<bool> Daemon::start_kv_events() {
  // KV events for routers (vLLM's ZeroMQ format).
  const EventsConfig& ev = config_.events;
  if (ev.zmq_endpoint.empty()) return true;
  auto started = KvEventPublisher::start(ev, io_);
  if (!started.ok()) return failed("kv_events_failed", started.error());
  kv_publisher_ = std::move(started.value());
  log_event(LogLevel::info, "kv_events_publishing",
            {kv("endpoint", ev.zmq_endpoint),
             kv("mode", KvEventPublisher::binds(ev) ? "bind" : "connect"),
             kv("replay", ev.zmq_replay_endpoint), kv("block_hash", ev.zmq_block_hash)});
  publish_cleared();
  return true;
}

void Daemon::publish_cleared() {
  for (const auto& pool : service_->pools()) {
    std::vector<KvEvent> events = pool->take_kv_events();
    events.push_back(KvEvent{KvEvent::Kind::cleared, {}, KvTier::pool, false, {}, {}, {}});
    kv_publisher_->publish(pool->name(), pool->kv_format(), events);
  }
}

wire::Result<bool> Daemon::open_stats_segment() {
  // The stats segment beside the socket (an anonymous one when it is off or cannot be made, so
  // that the metrics endpoint reads snapshots the same way), refreshed from the loop.
  const size_t bytes = stats::snapshot_bytes(service_->pools().size());
  if (config_.metrics.stats_segment) {
    auto file = StatsSegment::create_file(StatsSegment::path_for(config_.socket_path), bytes,
                                          config_.socket_mode, config_.socket_group);
    if (file.ok()) {
      segment_ = std::move(file.value());
      log_event(LogLevel::info, "stats_segment", {kv("path", segment_->path())});
      return true;
    }
    log_event(LogLevel::warn, "stats_segment_failed",
              {kv("error", file.error().message),
               kv("detail", "kvpoolctl falls back to the snapshot op")});
  }
  auto anonymous = StatsSegment::create_anonymous(bytes);
  if (!anonymous.ok()) return anonymous.error();
  segment_ = std::move(anonymous.value());
  return true;
}

wire::Result<bool> Daemon::start_metrics() {
  // The metrics endpoint reads the segment only, on its own thread.
  if (config_.metrics.listen.empty()) return true;
  ListenAddress address;
  parse_listen_address(config_.metrics.listen, address);  // validated with the config
  auto started =
      MetricsHttp::start(address, [segment = segment_.get()]() -> std::optional<std::string> {
        std::vector<std::byte> bytes;
        stats::Snapshot snapshot;
        if (!segment->read(bytes).empty() ||
            !stats::decode(bytes, stats::kLayoutVersion, snapshot).empty()) {
          return std::nullopt;
        }
        return stats::prometheus_text(snapshot);
      });
  if (!started.ok()) return failed("metrics_failed", started.error());
  metrics_ = std::move(started.value());
  log_event(LogLevel::info, "metrics_listening", {kv("address", metrics_->bound())});
  return true;
}

wire::ReloadReply Daemon::reload() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  notifier_.notify("RELOADING=1\nMONOTONIC_USEC=" +
                   std::to_string(uint64_t(now.tv_sec) * 1000000 + uint64_t(now.tv_nsec) / 1000));
  wire::ReloadReply outcome =
      reload_config(options_.config_path, options_.socket_override, *service_);
  notifier_.notify("READY=1\nSTATUS=" + status_ + reload_status_note(outcome));
  return outcome;
}

void Daemon::on_signal(const boost::system::error_code& ec, int sig) {
  if (ec) return;
  if (sig == SIGHUP) {
    reload();
    signals_->async_wait([this](const auto& e, int s) { on_signal(e, s); });
    return;
  }
  log_event(LogLevel::info, "stopping",
            {kv("signal", sig), kv("sessions", server_->connections())});
  notifier_.notify("STOPPING=1\nSTATUS=stopping");
  stop();
  io_.stop();
}

void Daemon::feed_watchdog(const boost::system::error_code& ec) {
  // Fed from the event loop itself, so a loop that stops turning stops feeding.
  if (ec) return;
  notifier_.notify("WATCHDOG=1");
  watchdog_.expires_after(watchdog_interval_);
  watchdog_.async_wait([this](const auto& e) { feed_watchdog(e); });
}

void Daemon::stop() {
  if (stopped_) return;
  stopped_ = true;
  metrics_.reset();
  if (publisher_) publisher_->stop();
  if (kv_publisher_ && server_) {
    // The server publishes nothing more once stopped: the clear is the last a router hears.
    publish_cleared();
    kv_publisher_->finish(kStopLinger);
  }
  if (server_) server_->stop();
}

int Daemon::run() {
  signals_.emplace(io_, SIGINT, SIGTERM, SIGHUP);
  signals_->async_wait([this](const auto& e, int s) { on_signal(e, s); });
  watchdog_interval_ = Notifier::watchdog_interval();
  if (notifier_.enabled() && watchdog_interval_.count() > 0) {
    watchdog_.expires_after(watchdog_interval_);
    watchdog_.async_wait([this](const auto& e) { feed_watchdog(e); });
  }
  notifier_.notify("READY=1\nSTATUS=" + status_);
  log_event(LogLevel::info, "ready",
            {kv("socket", config_.socket_path), kv("pools", service_->pools().size())});
  io_.run();
  stop();
  if (kv_publisher_) {
    const KvEventCounters& c = kv_publisher_->counters();
    log_event(LogLevel::info, "kv_events_stopped",
              {kv("batches_published", c.batches_published),
               kv("batches_dropped", c.batches_dropped), kv("replay_requests", c.replay_requests),
               kv("connections_refused", kv_publisher_->connections_refused())});
  }
  log_event(LogLevel::info, "stopped");
  return 0;
}

}  // namespace kvpool::daemon

// Daemon: kvpoold while it runs. start() builds, in this order, the memory backend and the
// Service (the pools), the KV event publisher, the Server listening on the socket, the stats
// segment and its publisher and the metrics endpoint; run() installs the signal handlers and the
// systemd watchdog, turns the event loop until SIGTERM or SIGINT and then stops them in reverse,
// releasing every session and removing the socket.
//
// SIGHUP and `kvpoolctl reload` take one path (reload()): re-read and validate the config file,
// apply what can change live, name what needs a restart, and tell systemd (RELOADING=1, then
// READY=1 with the status line).
//
// Error policy: start() returns an error naming the cause (each also logged under its own event
// name: config_refused, backend_failed, pool_failed, kv_events_failed, listen_failed,
// metrics_failed); nothing is left listening when it fails. Thread-safety: one thread, the event
// loop's; the metrics endpoint runs a thread of its own that reads only the stats segment.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/notify.h"
#include "daemon/server/server.h"
#include "daemon/service/service.h"
#include "daemon/stats_publisher.h"
#include "daemon/telemetry/kv_event_publisher.h"
#include "daemon/telemetry/metrics_http.h"
#include "daemon/telemetry/stats_segment.h"

namespace kvpool::daemon {

struct DaemonOptions {
  std::string config_path;      // "" = the built-in default config
  std::string socket_override;  // --socket
  int frame_timeout_ms = 10000;
  uint64_t inline_copy_bytes = Service::kDefaultInlineCopyBytes;
  std::string version;
};

class Daemon {
 public:
  // How long a clean stop waits for libzmq to deliver the last KV events (the clear).
  static constexpr std::chrono::milliseconds kStopLinger{1000};

  static wire::Result<std::unique_ptr<Daemon>> start(const DaemonOptions& options);
  ~Daemon();
  // Serves until SIGTERM or SIGINT; the exit status.
  int run();

 private:
  Daemon(const DaemonOptions& options, Config config);
  // One descriptor per session: the whole hard limit, and a warning when it is short.
  void raise_file_limit() const;
  wire::Result<bool> start_kv_events();
  // Publishes an AllBlocksCleared for every pool (after what their events still held): at start
  // a router drops what it kept of an earlier daemon on this endpoint, at a clean stop all.
  void publish_cleared();
  wire::Result<bool> open_stats_segment();
  wire::Result<bool> start_metrics();
  wire::ReloadReply reload();
  void on_signal(const boost::system::error_code& ec, int sig);
  void feed_watchdog(const boost::system::error_code& ec);
  void stop();

  DaemonOptions options_;
  Config config_;
  std::unique_ptr<Service> service_;
  boost::asio::io_context io_{1};
  std::unique_ptr<KvEventPublisher> kv_publisher_;
  std::unique_ptr<Server> server_;
  Notifier notifier_;
  std::string status_;  // systemd's STATUS= line while serving
  std::unique_ptr<StatsSegment> segment_;
  std::unique_ptr<StatsPublisher> publisher_;
  std::unique_ptr<MetricsHttp> metrics_;
  // Made by run(): until then SIGTERM, SIGINT and SIGHUP keep their default action, so a start
  // that hangs (a device, a large reservation) can still be stopped.
  std::optional<boost::asio::signal_set> signals_;
  boost::asio::steady_timer watchdog_{io_};
  std::chrono::microseconds watchdog_interval_{0};
  bool stopped_ = false;
};

}  // namespace kvpool::daemon

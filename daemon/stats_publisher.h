// StatsPublisher: when kvpoold writes its stats snapshot into the StatsSegment.
//
// Cadence: at start, every kHeartbeat (so a reader can tell a live daemon from a dead one by the
// snapshot's age, and uptime moves), and after activity (requests handled, sessions opened or
// closed): at once when the last publish is at least kMinInterval old, else once when it will
// be. An operator's change (evict, flush, reload) is published at once, before its reply is
// sent, so `kvpoolctl flush && kvpoolctl status` never shows the cache from before the flush. So
// the snapshot trails the pools by at most kMinInterval (plus scheduling), and a busy daemon
// publishes at most 100 snapshots a second (under a microsecond each). Why not more often: a 1 ms
// interval meant a timer wakeup per millisecond, which tripled the p99 round trip of a daemon
// sharing its core with its clients (bench/RESULTS.md). Everything runs on the event loop, which
// alone reads the Service.
//
// Thread-safety: event-loop thread only.
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <chrono>
#include <vector>

#include "common/stats_layout.h"
#include "daemon/server/server.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/stats_segment.h"

namespace kvpool::daemon {

class StatsPublisher final : public ActivityListener {
 public:
  static constexpr std::chrono::milliseconds kMinInterval{10};
  static constexpr std::chrono::milliseconds kHeartbeat{100};

  StatsPublisher(boost::asio::io_context& io, Service& service, StatsSegment& segment);

  void start();
  // Something changed; `urgent` (an operator's evict, flush or reload) publishes at once.
  void changed(bool urgent = false);
  // The Server's activity: changed(), urgent when the Service saw an operator's change.
  void on_activity() override { changed(service_.take_operator_change()); }
  void stop();

 private:
  void publish();
  void beat();

  Service& service_;
  StatsSegment& segment_;
  boost::asio::steady_timer heartbeat_;
  boost::asio::steady_timer soon_;
  bool soon_armed_ = false;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point last_{};
  stats::Snapshot snapshot_;
  std::vector<std::byte> bytes_;
};

}  // namespace kvpool::daemon

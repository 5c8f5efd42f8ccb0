#include "daemon/stats_publisher.h"

namespace kvpool::daemon {

StatsPublisher::StatsPublisher(boost::asio::io_context& io, Service& service, StatsSegment& segment)
    : service_(service), segment_(segment), heartbeat_(io), soon_(io) {}

void StatsPublisher::start() {
  publish();
  beat();
}

void StatsPublisher::stop() {
  stopped_ = true;
  heartbeat_.cancel();
  soon_.cancel();
}

void StatsPublisher::beat() {
  heartbeat_.expires_after(kHeartbeat);
  heartbeat_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    publish();
    beat();
  });
}

void StatsPublisher::changed(bool urgent) {
  if (stopped_) return;
  if (urgent) return publish();
  if (soon_armed_) return;
  const auto due = last_ + kMinInterval;
  if (std::chrono::steady_clock::now() >= due) return publish();
  soon_armed_ = true;
  soon_.expires_at(due);
  soon_.async_wait([this](const boost::system::error_code& ec) {
    soon_armed_ = false;
    if (ec || stopped_) return;
    publish();
  });
}

void StatsPublisher::publish() {
  service_.fill_snapshot(snapshot_);
  stats::encode(snapshot_, bytes_);
  segment_.publish(bytes_);
  last_ = std::chrono::steady_clock::now();
}

}  // namespace kvpool::daemon

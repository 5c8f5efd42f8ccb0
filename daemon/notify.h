// systemd notification (sd_notify(3)'s datagram protocol, without libsystemd).
//
// When $NOTIFY_SOCKET names a Unix datagram socket (a path, or "@name" for the abstract
// namespace), each call sends one datagram of newline-separated KEY=VALUE lines to it: READY=1,
// STATUS=..., STOPPING=1, WATCHDOG=1. Without $NOTIFY_SOCKET every call does nothing, so kvpoold
// runs the same outside systemd. watchdog_interval() reads $WATCHDOG_USEC (and $WATCHDOG_PID, which
// must be ours when set) and returns half of it, the cadence sd_watchdog_enabled(3) recommends.
//
// Thread-safety: the notifier is used from the event-loop thread only.
// Error policy: notification is best effort; a failed send is reported once in the log.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace kvpool::daemon {

class Notifier {
 public:
  Notifier();  // reads $NOTIFY_SOCKET
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  bool enabled() const { return fd_ >= 0; }
  // Sends `state` (e.g. "READY=1\nSTATUS=serving 1 pool"); false when it could not be sent.
  bool notify(std::string_view state);

  // Half of $WATCHDOG_USEC when the watchdog is on for this process, else zero.
  static std::chrono::microseconds watchdog_interval();

 private:
  int fd_ = -1;
  std::string path_;
  bool reported_failure_ = false;
};

}  // namespace kvpool::daemon

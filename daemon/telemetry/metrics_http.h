// MetricsHttp: kvpoold's optional Prometheus endpoint (config metrics.listen), Boost.Beast.
//
// It runs on a thread of its own with its own io_context and never touches the Service: the
// /metrics body comes from `render`, which reads the stats segment's newest snapshot through its
// seqlock. So a scrape cannot stall the event loop, and a slow or hostile HTTP client can hold
// at most this thread's resources, which are bounded:
//   - at most kMaxConnections at once; a new client beyond that closes the connection that has
//     waited longest for a request (an idle keep-alive or a slow request: nginx's rule), so that
//     idle or slowloris clients can never keep a scrape out; only when every connection is
//     writing a response is the new one closed at once;
//   - a request's header is at most kMaxHeaderBytes and it may not carry a body (431 / 400);
//   - a new connection's first request must arrive, and each response leave, within kTimeout;
//     a kept-alive connection's next request within kIdleTimeout; else the connection is
//     closed. A connection serves at most kMaxRequestsPerConnection requests.
// Routes: GET or HEAD /metrics → 200, text/plain; version=0.0.4; other methods there → 405;
// any other target → 404; a malformed request → 400 and close; no snapshot yet → 503.
//
// Thread-safety: start() and the destructor from the daemon's thread; everything else runs on
// the endpoint's thread. The destructor closes every connection and joins the thread.
// Error policy: start() returns an Error naming the address and the failing step.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/wire/protocol.h"
#include "daemon/config/listen_address.h"

namespace kvpool::daemon {

class MetricsHttp {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr size_t kMaxHeaderBytes = size_t{8} * 1024;
  static constexpr std::chrono::seconds kTimeout{5};
  static constexpr std::chrono::seconds kIdleTimeout{2};
  static constexpr int kMaxRequestsPerConnection = 100;

  // The /metrics body, or nullopt when there is nothing to serve (503). Runs on the endpoint's
  // thread.
  using Render = std::function<std::optional<std::string>()>;

  static wire::Result<std::unique_ptr<MetricsHttp>> start(const ListenAddress& address,
                                                          Render render);
  ~MetricsHttp();
  MetricsHttp(const MetricsHttp&) = delete;
  MetricsHttp& operator=(const MetricsHttp&) = delete;

  // "HOST:PORT" as bound (the port the kernel chose when the config said 0).
  const std::string& bound() const { return bound_; }

 private:
  struct State;
  class Session;
  explicit MetricsHttp(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
  std::string bound_;
};

}  // namespace kvpool::daemon

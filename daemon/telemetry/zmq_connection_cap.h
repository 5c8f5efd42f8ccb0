// ZmqConnectionCap: at most N connections at once on a socket libzmq has bound, whatever the
// peers do.
//
// libzmq has no connection limit: its I/O thread accepts every TCP (or ipc) connection, and one
// that never completes the ZMTP handshake holds a descriptor until ZMQ_HANDSHAKE_IVL passes. A
// flood of such connections would take every descriptor of the process, and the workers' Unix
// socket with them. The cap listens to the socket's monitor (ZMQ_EVENT_ACCEPTED and
// ZMQ_EVENT_DISCONNECTED, each carrying the connection's descriptor) on the event loop, woken
// by the monitor's ZMQ_FD, and shuts down each connection accepted past the cap (shutdown(2),
// both directions): libzmq's engine then reads end-of-file and closes the descriptor itself, so
// the descriptor is never closed under libzmq.
//
// Invariant: a descriptor is shut down only if it is, at that moment, a connected stream socket
// (not a listening one) whose local address is the bound endpoint's (same TCP port, or same ipc
// path). Monitor events arrive after the fact and a descriptor number may have been closed and
// reused by then (by a worker's Unix connection, say); the check keeps the cap from touching
// anything but this endpoint's connections.
//
// Thread-safety: the event-loop thread only, like the socket's owner. Error policy: start()
// returns an Error naming the endpoint and libzmq's reason when the monitor cannot be made;
// afterwards nothing fails (a descriptor that fails the check is forgotten).
#pragma once

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "common/wire/protocol.h"

namespace kvpool::daemon {

class ZmqConnectionCap {
 public:
  // Watches `socket` (bound to `endpoint`, as configured: "tcp://HOST:PORT" or "ipc://PATH") of
  // `context`; `name` makes the monitor's inproc address unique within the context.
  static wire::Result<std::unique_ptr<ZmqConnectionCap>> start(void* context, void* socket,
                                                               const std::string& endpoint,
                                                               const std::string& name,
                                                               uint32_t max_connections,
                                                               boost::asio::io_context& io);
  ~ZmqConnectionCap();  // stops the monitor; call before the socket closes
  ZmqConnectionCap(const ZmqConnectionCap&) = delete;
  ZmqConnectionCap& operator=(const ZmqConnectionCap&) = delete;

  size_t open_connections() const { return open_.size(); }
  uint64_t refused() const { return refused_; }
  // Called after a batch of monitor events in which a held connection went (memory may be free).
  void set_on_disconnect(std::function<void()> f) { on_disconnect_ = std::move(f); }

 private:
  ZmqConnectionCap(void* socket, uint32_t max_connections, boost::asio::io_context& io);
  void wait();
  void drain();
  void accepted(int fd);
  // Whether `fd` is now a connection to this endpoint (the invariant above).
  bool is_endpoint_connection(int fd) const;

  void* socket_;
  void* monitor_ = nullptr;
  uint32_t max_;
  boost::asio::posix::stream_descriptor wake_;
  int tcp_port_ = -1;     // the bound TCP port; -1 for ipc
  std::string ipc_path_;  // the bound ipc path; "" for TCP
  std::set<int> open_;    // descriptors of the connections libzmq holds
  uint64_t refused_ = 0;
  bool pruned_ = false;  // open_ was checked for stale descriptors in this drain
  std::function<void()> on_disconnect_;
};

}  // namespace kvpool::daemon

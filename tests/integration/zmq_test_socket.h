// ZmqSocket: a test's ZeroMQ socket (its own context), connected to a daemon's endpoint (or bound
// to one the daemon connects to).
#pragma once

#include <zmq.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/hardening_util.h"

namespace kvpool::testing {

// A ZeroMQ context and one socket, closed without lingering.
class ZmqSocket {
 public:
  enum class Mode { connect, bind };
  // `before_connect` sets options that must precede the connection (e.g. ZMQ_RCVHWM).
  ZmqSocket(int type, const std::string& endpoint, void (*before_connect)(void*) = nullptr,
            Mode mode = Mode::connect) {
    context_ = zmq_ctx_new();
    socket_ = zmq_socket(context_, type);
    if (before_connect != nullptr) before_connect(socket_);
    const int linger = 0;
    zmq_setsockopt(socket_, ZMQ_LINGER, &linger, sizeof linger);
    const int timeout_ms = 5000;
    zmq_setsockopt(socket_, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    if (type == ZMQ_SUB) zmq_setsockopt(socket_, ZMQ_SUBSCRIBE, "", 0);
    const int rc = mode == Mode::bind ? zmq_bind(socket_, endpoint.c_str())
                                      : zmq_connect(socket_, endpoint.c_str());
    EXPECT_EQ(rc, 0) << zmq_strerror(zmq_errno());
  }
  ~ZmqSocket() {
    zmq_close(socket_);
    zmq_ctx_term(context_);
  }
  void* get() const { return socket_; }

  // The frames of the next message; empty when none came within the receive timeout.
  std::vector<std::string> receive() {
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, socket_, 0) < 0) {
        zmq_msg_close(&msg);
        return {};
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      const bool more = zmq_msg_more(&msg) != 0;
      zmq_msg_close(&msg);
      if (!more) return frames;
    }
  }
  // Whether a message is waiting within `ms`.
  bool readable(int ms) {
    zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&item, 1, ms) == 1;
  }

 private:
  void* context_ = nullptr;
  void* socket_ = nullptr;
};

// A SUB socket's subscription reaches the publisher asynchronously (ZeroMQ's "slow joiner") and
// PUB drops what nobody has subscribed to yet: give it time (more in the sanitizer trees) before
// anything is published, so that the test sees batch 0.
inline void let_subscription_arrive() {
  std::this_thread::sleep_for(std::chrono::milliseconds(kSanitizedBuild ? 1500 : 500));
}

}  // namespace kvpool::testing

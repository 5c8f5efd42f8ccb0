// A bare Unix-socket ping-pong: the baseline kvpoold's round trips are measured against.
//
// The peer is a forked process blocking in recv() that answers each message
// [u32 request bytes][u32 reply bytes][...] with one send() of the asked reply size: the least
// any daemon on a Unix stream socket could do per request.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpool::bench {

struct Percentiles {
  double p50 = 0;
  double p99 = 0;
};

// p50 and p99 of samples (sorted in place); zeros when empty.
Percentiles percentiles(std::vector<double>& samples);

class PingPong {
 public:
  // Starts the peer on a socket at `path` (removed once connected). Exits the process with a
  // message if the socket cannot be set up: a benchmark without its baseline is meaningless.
  explicit PingPong(const std::string& path);
  ~PingPong();
  PingPong(const PingPong&) = delete;
  PingPong& operator=(const PingPong&) = delete;

  // One round trip of `request` bytes out and `reply` bytes back; returns microseconds.
  double round_trip(uint32_t request, uint32_t reply);
  // `n` round trips; their percentiles.
  Percentiles measure(uint32_t request, uint32_t reply, size_t n);

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::vector<char> out_, in_;
};

}  // namespace kvpool::bench

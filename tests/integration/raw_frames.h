// Raw frames on a socket, for the tests that send what a well-behaved client never would
// (malformed frames, idle or flooding connections, requests whose replies are left unread).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/wire/protocol.h"

namespace kvpool::testing {

struct RawReply {
  bool closed = false;  // the connection ended (or the timeout passed) before a whole frame
  wire::FrameHeader header;
  std::optional<wire::Error> error;
};

// Reads one reply frame; waits at most timeout_ms for each part (-1 = no limit).
RawReply read_raw_reply(int fd, int timeout_ms = -1);
// True when the peer closed the connection (recv returns 0, after any bytes still queued).
bool peer_closed(int fd);
// True when bytes (or the close) arrive within timeout_ms.
bool readable_within(int fd, int timeout_ms);
// A connected Unix socket to `path`, or -1 (errno set).
int connect_raw(const std::string& path);
// One encoded request frame.
std::vector<std::byte> frame(const wire::Request& r, uint32_t id = 77);
// Sends all of `b` (blocking); false on an error.
bool send_all(int fd, const std::vector<std::byte>& b);

}  // namespace kvpool::testing

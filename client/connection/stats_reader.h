// Reading kvpoold's stats segment (daemon/telemetry/stats_segment.h) without a round trip to the
// daemon.
//
// The segment is the file "<socket path>.stats". It is used only when it can be trusted to be
// the live daemon's: a regular file owned by the socket's owner, of a size and layout this build
// knows, whose writer process is still running and published less than kMaxAge ago (the daemon
// republishes at least every 100 ms). Anything else is reported, and callers fall back to the
// snapshot op, which also says clearly when the daemon is not running at all.
//
// Thread-safety: a pure function of the file. Error policy: a reason string, never an exception.
#pragma once

#include <chrono>
#include <string>

#include "common/stats_layout.h"

namespace kvpool::client {

inline constexpr std::chrono::seconds kMaxSegmentAge{5};

// "" and `out` filled, or why the segment of `socket_path` cannot be used.
std::string read_stats_segment(const std::string& socket_path, stats::Snapshot& out);

}  // namespace kvpool::client

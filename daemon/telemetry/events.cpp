#include "daemon/telemetry/events.h"

#include <algorithm>

namespace kvpool::daemon {

EventLog::EventLog(uint32_t capacity, uint64_t stream_id)
    : ring_(std::max(capacity, kMinCapacity)), stream_id_(stream_id) {}

uint64_t EventLog::append(const LoggedEvent& e) {
  ring_[next_ % ring_.size()] = e;
  return next_++;
}

}  // namespace kvpool::daemon

// EventLog: the daemon's recent prefix-index events in a bounded ring, for subscribers.
//
// Every change of a pool's prefix index becomes one event with the next sequence number
// (1, 2, 3, ...): stored (a block hash was published), removed (it left the index: evicted or
// flushed) and cleared (a flush left the pool's index empty: one event instead of one removal
// per block). The ring keeps the newest `capacity` events; appending never blocks and never
// allocates, so the log costs the same with any number of subscribers, fast or stalled.
//
// A Subscription is a cursor into the sequence plus what its holder may see (one pool; one
// tenant's namespace unless it is an admin; pool-wide events always). drain() hands a subscriber
// the events after its cursor; when the cursor has fallen behind the oldest event the ring still
// holds, it first reports a gap (how many sequence numbers were lost, where it resumes) and moves
// the cursor up: a slow subscriber loses events, it never holds memory or the daemon back.
//
// Thread-safety: none; the event loop owns the log.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/block_hash.h"
#include "common/types.h"
#include "common/wire/protocol.h"

namespace kvpool::daemon {

struct LoggedEvent {
  BlockHash hash;      // stored, removed
  uint64_t count = 0;  // cleared: blocks removed
  PageId page = kNoPage;
  Namespace ns = 0;  // the tenant namespace; 0 for pool-wide events (cleared)
  uint16_t pool = 0;
  uint8_t kind = wire::Event::kStored;  // wire::Event::Kind
  uint8_t cause = wire::Event::kNone;   // wire::Event::Cause
};
static_assert(sizeof(LoggedEvent) == 40);  // the ring's cost per event, as the config documents

struct Subscription {
  uint64_t cursor = 1;  // the next sequence number to look at
  uint16_t pool = 0;
  Namespace ns = 0;  // 0 = every tenant's events (admins)
  uint32_t request_id = 0;
};

class EventLog {
 public:
  static constexpr uint32_t kMinCapacity = 16;

  EventLog(uint32_t capacity, uint64_t stream_id);

  // Appends `e` and returns its sequence number.
  uint64_t append(const LoggedEvent& e);

  uint64_t next_seq() const { return next_; }
  // The oldest sequence number still held (= next_seq() when the log is empty).
  uint64_t oldest_seq() const { return next_ - held(); }
  uint32_t capacity() const { return static_cast<uint32_t>(ring_.size()); }
  uint64_t stream_id() const { return stream_id_; }
  // Sequence numbers skipped by the gaps drain() reported, over all subscribers.
  uint64_t lost() const { return lost_; }

  // Visits, from sub.cursor on, up to `max` events `sub` may see: on_event(seq, event). If the
  // cursor is older than the ring, on_gap(lost, resume_seq) comes first (and counts as one of
  // the `max`). Advances sub.cursor past everything looked at.
  template <typename OnEvent, typename OnGap>
  void drain(Subscription& sub, size_t max, OnEvent&& on_event, OnGap&& on_gap) {
    size_t given = 0;
    if (sub.cursor < oldest_seq()) {
      const uint64_t resume = oldest_seq();
      lost_ += resume - sub.cursor;
      on_gap(resume - sub.cursor, resume);
      sub.cursor = resume;
      ++given;
    }
    for (; given < max && sub.cursor < next_; ++sub.cursor) {
      const LoggedEvent& e = ring_[sub.cursor % ring_.size()];
      if (e.pool != sub.pool || (sub.ns != 0 && e.ns != 0 && e.ns != sub.ns)) continue;
      on_event(sub.cursor, e);
      ++given;
    }
  }

 private:
  uint64_t held() const { return std::min<uint64_t>(next_ - 1, ring_.size()); }

  std::vector<LoggedEvent> ring_;  // event of sequence s at s % capacity
  uint64_t next_ = 1;
  uint64_t stream_id_;
  uint64_t lost_ = 0;
};

}  // namespace kvpool::daemon

// PoolIndexEvents: the observer a pool's core reports index changes to (core::IndexObserver).
//
// Each change becomes an EventLog entry for that pool: a publish is `stored` (and resets the
// page's PrefixStats), an eviction is `removed` (cause evicted). A flush is bracketed by
// begin_flush()/end_flush(): its removals are held back and, when the flush leaves the pool's
// index empty, replaced by one `cleared` event carrying their number (what a KV-aware router
// needs: drop everything of this pool), else logged one by one (cause flushed) because blocks
// still in use stayed indexed.
//
// With KV events for routers on (events.zmq_endpoint), each change also goes to the pool's
// KvEventBatcher, in the same order and with the same flush rule (a flush that empties the
// index is one AllBlocksCleared).
//
// Thread-safety: none; called on the event loop from inside pool operations.
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/core/index_observer.h"
#include "daemon/telemetry/events.h"
#include "daemon/telemetry/kv_event_encoder.h"
#include "daemon/telemetry/prefix_stats.h"

namespace kvpool::daemon {

class PoolIndexEvents final : public core::IndexObserver {
 public:
  // `now` is read at each event: the Service keeps it current (seconds since start + 1).
  // `kv_events`: the pool's batch for the ZeroMQ publisher, or null when that is off.
  PoolIndexEvents(uint16_t pool, EventLog& log, PrefixStats& prefix_stats, const uint32_t& now,
                  KvEventBatcher* kv_events = nullptr)
      : pool_(pool), log_(log), prefix_stats_(prefix_stats), now_(now), kv_events_(kv_events) {}

  void stored(Namespace ns, const BlockHash& hash, PageId page) override;
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override;

  void begin_flush();
  // `index_empty`: the pool's index holds nothing after the flush.
  void end_flush(bool index_empty);

 private:
  uint16_t pool_;
  EventLog& log_;
  PrefixStats& prefix_stats_;
  const uint32_t& now_;
  KvEventBatcher* kv_events_;
  bool flushing_ = false;
  std::vector<LoggedEvent> held_;  // a flush's removals, until end_flush
};

}  // namespace kvpool::daemon

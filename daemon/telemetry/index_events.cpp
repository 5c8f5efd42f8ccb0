#include "daemon/telemetry/index_events.h"

namespace kvpool::daemon {

void PoolIndexEvents::stored(Namespace ns, const BlockHash& hash, PageId page) {
  prefix_stats_.stored(page, now_);
  log_.append(LoggedEvent{hash, 0, page, ns, pool_, wire::Event::kStored, wire::Event::kNone});
  if (kv_events_ != nullptr) kv_events_->stored(hash);
}

void PoolIndexEvents::removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) {
  const uint8_t cause = why == Removal::flushed ? wire::Event::kFlushed : wire::Event::kEvicted;
  const LoggedEvent e{hash, 0, page, ns, pool_, wire::Event::kRemoved, cause};
  if (flushing_) {
    held_.push_back(e);
  } else {
    log_.append(e);
    if (kv_events_ != nullptr) kv_events_->removed(hash);
  }
}

void PoolIndexEvents::begin_flush() {
  flushing_ = true;
  held_.clear();
}

void PoolIndexEvents::end_flush(bool index_empty) {
  flushing_ = false;
  if (index_empty) {
    log_.append(LoggedEvent{BlockHash{}, held_.size(), kNoPage, 0, pool_, wire::Event::kCleared,
                            wire::Event::kFlushed});
    if (kv_events_ != nullptr) kv_events_->cleared();
  } else {
    for (const LoggedEvent& e : held_) {
      log_.append(e);
      if (kv_events_ != nullptr) kv_events_->removed(e.hash);
    }
  }
  held_.clear();
  held_.shrink_to_fit();  // a flush of a large pool should not pin its scratch
}

}  // namespace kvpool::daemon

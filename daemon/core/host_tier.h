// HostTier: the second tier of a pool's prefix cache. A fixed number of slots, each holding the
// bytes of one page that the device tier evicted, under that page's (namespace, hash), so that a
// later lookup can bring the page back (promote) instead of recomputing it.
//
// The tiers are exclusive: a demotion moves a block down (the device page it came from is reused),
// a promotion moves it back up (the slot is freed once its bytes are copied into a device page).
// A lookup therefore resolves a hash to (tier, slot) by asking the device index first and this
// tier's index second, and a block is counted once in the pool's combined capacity.
//
// Slots are kept in LRU order of demotion: admit() takes a free slot, else drops the slot demoted
// longest ago (a device tier evicts a chain's tail before its head, so a host tier fed by it drops
// tails first too). A slot being promoted is neither indexed nor queued: begin_promote() takes it
// out, so that demotions which the promotion's own device allocation causes cannot take it, and
// end_promote() frees it (or cancel_promote() puts it back, most recent).
//
// Slot states: FREE (on the free stack), HELD (indexed and queued; its key in keys_), PROMOTING
// (neither). Invariants, verified by check_invariants():
//   H1  free + held + promoting = capacity;
//   H2  every HELD slot is in the index exactly once under its own key, and queued once;
//   H3  the free stack holds exactly the FREE slots.
// Every operation is O(1) (an index probe, a list link or unlink, a stack push or pop).
//
// No I/O and no bytes: the daemon (daemon/memory/host_tier_store.h) owns the memory the slots name
// and does the copies; the replay bench drives this class directly.
//
// Thread-safety: none; one thread owns it. Error policy: preconditions (a slot in the wrong state)
// are bugs and abort via KVPOOL_CHECK.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "daemon/core/index_observer.h"
#include "daemon/core/page_lists.h"
#include "daemon/core/prefix_index.h"
#include "daemon/core/types.h"

namespace kvpool::core {

using SlotId = uint32_t;
inline constexpr SlotId kNoSlot = kNoPage;

struct HostTierCounters {
  uint64_t demoted = 0;     // blocks admitted (bytes copied down)
  uint64_t refreshed = 0;   // admissions of a block already held (no copy needed)
  uint64_t promoted = 0;    // blocks handed back to the device tier
  uint64_t dropped = 0;     // blocks evicted to make room, or dropped (drop())
  uint64_t flushed = 0;     // blocks dropped by flush()
  uint64_t superseded = 0;  // copies dropped because the device tier holds the block again
};

class HostTier {
 public:
  // `slots` may be 0 (the tier then admits nothing).
  // index_seed 0 picks a random one.
  HostTier(uint32_t slots, uint64_t index_seed);

  struct Admission {
    SlotId slot = kNoSlot;  // kNoSlot: nothing admitted (no slot free or evictable)
    bool copy = false;      // the caller must copy the page's bytes into the slot
    bool dropped = false;   // an older block left the tier to make room
    Namespace dropped_ns = 0;
    BlockHash dropped_hash;
  };
  // A slot for a device page evicted under (ns, hash). A block the tier holds already is moved to
  // most recent and needs no copy (equal hashes name equal bytes).
  Admission admit(Namespace ns, const BlockHash& hash);

  // The HELD slot of (ns, hash), or kNoSlot.
  SlotId find(Namespace ns, const BlockHash& hash) const;
  // HELD → PROMOTING: out of the index and the queue; the caller copies its bytes to a device
  // page, then calls end_promote (freed) or cancel_promote (HELD again, most recent).
  void begin_promote(SlotId slot);
  void end_promote(SlotId slot);
  void cancel_promote(SlotId slot);
  // A cancelled promotion whose slot's bytes may be bad (a demotion into it failed): the slot
  // is freed, its block lost.
  void drop_promote(SlotId slot);
  // Drops the block (ns, hash) if the tier holds it: the device tier has it again (a worker
  // published it afresh), and the tiers stay exclusive. Returns whether it was there.
  bool erase(Namespace ns, const BlockHash& hash);
  // Drops the block (ns, hash) if the tier holds it, counted as dropped: a hybrid model's other
  // group lost it, so no hit can use it (PoolSet::drop_group_evictions). Whether it was there.
  bool drop(Namespace ns, const BlockHash& hash);
  // Drops a HELD slot whose bytes could not be copied in (it must never be promoted); a slot in
  // any other state is left alone.
  void discard(SlotId slot);
  // Drops every HELD slot; returns how many.
  uint32_t flush();

  // Reports every block that becomes findable here or stops being to `o` (may be null).
  void set_observer(IndexObserver* o) { observer_ = o; }

  uint32_t capacity() const { return static_cast<uint32_t>(keys_.size()); }
  uint32_t held() const { return index_.size(); }
  uint32_t promoting() const { return promoting_; }
  const HostTierCounters& counters() const { return counters_; }
  // The key of a HELD or PROMOTING slot.
  Namespace slot_namespace(SlotId slot) const { return keys_[slot].ns; }
  const BlockHash& slot_hash(SlotId slot) const { return keys_[slot].hash; }

  // H1–H3; empty when they hold, else the first violation. O(capacity).
  std::string check_invariants() const;

 private:
  enum class SlotState : uint8_t { free, held, promoting };
  struct Key {
    Namespace ns = 0;
    BlockHash hash;
    SlotState state = SlotState::free;
  };
  void make_held(SlotId slot, Namespace ns, const BlockHash& hash);
  // A HELD slot leaves the index and the queue and becomes `next` (FREE: back on the stack).
  void unhold(SlotId slot, SlotState next);
  // Frees the HELD slot of (ns, hash), if any, counting it in `counter`; whether there was one.
  bool free_held(Namespace ns, const BlockHash& hash, uint64_t& counter);

  std::vector<Key> keys_;
  std::vector<SlotId> free_;
  PrefixIndex index_;
  PageLists<1> lru_;  // HELD slots, least recently demoted first
  uint32_t promoting_ = 0;
  HostTierCounters counters_;
  IndexObserver* observer_ = nullptr;
};

}  // namespace kvpool::core

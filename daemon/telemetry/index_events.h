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
// KvEventBatcher, in the same order and with the same flush rule (a flush that empties both
// tiers is one AllBlocksCleared), and so do the host tier's: a demotion is BlockRemoved of the
// pool's medium then BlockStored of the host tier's, a promotion the reverse. The remote tier
// reports the blocks this daemon wrote to its cluster (BlockStored, medium REMOTE) and their
// end as far as it can know it (BlockRemoved REMOTE: the TTL passed, or a read found the key
// gone). A flush leaves the cluster as it is, and AllBlocksCleared would make a router forget
// the pool's REMOTE blocks too: while any REMOTE block is announced and not announced gone, a
// flush that empties the pool's tiers sends a BlockRemoved per device and host block instead.
//
// What a worker told of a block on publish (parent, token ids, adapter: wire::PublishRequest's
// chain) is kept, in a pool with a host tier, while the block is in either tier, so that its
// demotion and promotion events carry it too (about 100 bytes and 4 a token per block), and in
// both pools of a conversion between precisions (convert_evictions_to), whose BlockStored in the
// other pool carries it (carry()). Invariant:
// an entry of described_ is in a tier, or in gone_ until end_turn(); a demotion's host_stored()
// comes in the turn of its eviction, so the entry survives the move. A promotion whose copy runs
// off the loop ends in a later turn: its BlockStored then says nothing of the block (nil parent, no
// token ids), as one the worker did not describe.
//
// Thread-safety: none; called on the event loop from inside pool operations.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/wire/protocol.h"
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
  void host_stored(Namespace ns, const BlockHash& hash) override;
  void host_removed(Namespace ns, const BlockHash& hash, bool promoting) override;
  void remote_stored(Namespace ns, const BlockHash& hash) override;
  void remote_removed(Namespace ns, const BlockHash& hash) override;

  // While one lives, the publish `r` is under way: its stored() calls take their chain from it
  // (its token ids are tokens_per_page per item: Service::publish checks).
  class PublishScope {
   public:
    PublishScope(PoolIndexEvents& events, const wire::PublishRequest& r, uint32_t tokens_per_page)
        : events_(events) {
      events_.begin_publish(r, tokens_per_page);
    }
    ~PublishScope() { events_.publish_ = nullptr; }
    PublishScope(const PublishScope&) = delete;
    PublishScope& operator=(const PublishScope&) = delete;

   private:
    PoolIndexEvents& events_;
  };
  // Keep what blocks were published with for the host tier's events (a pool with a host tier;
  // without one nothing reads it). Token ids only when they are sent (events.zmq_token_ids).
  void set_keep_chains(bool keep) { keep_chains_ = keep; }
  void set_keep_token_ids(bool keep) { keep_token_ids_ = keep; }

  void begin_flush();
  // `index_empty`: the pool's index, and its host tier's, hold nothing after the flush.
  void end_flush(bool index_empty);

  // A block of a namespace, as the chains kept here (and the converter's in flight) are keyed.
  struct Key {
    Namespace ns = 0;
    BlockHash hash;
    friend bool operator==(const Key&, const Key&) = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return k.hash.lo ^ (uint64_t{k.ns} * 0x9e3779b97f4a7c15);
    }
  };
  // What a block was published with, kept while a tier of this pool holds it (keep_chains).
  struct Described {
    std::optional<BlockHash> parent;
    std::vector<uint32_t> token_ids;
    std::string lora_name;
    uint8_t tiers = 0;  // kDevice | kHost
  };
  // The chain kept for (ns, hash), or null.
  const Described* described_block(Namespace ns, const BlockHash& hash) const;
  // Another pool's chain for (ns, hash), which this pool is about to store without a publish
  // of a worker (a conversion between precisions): its BlockStored carries it. Nothing when
  // this pool keeps no chains; forgotten at the turn's end unless a tier took the block.
  void carry(Namespace ns, const BlockHash& hash, const Described& chain);

  // After each turn of the event loop: forgets the chains of blocks that no tier holds.
  void end_turn();
  // Blocks whose chain is kept (for the stats and the tests).
  size_t described() const { return described_.size(); }

 private:
  static constexpr uint8_t kDevice = 1;
  static constexpr uint8_t kHost = 2;
  void begin_publish(const wire::PublishRequest& r, uint32_t tokens_per_page);
  // The chain the publish under way gives `hash`, or an empty one.
  BlockChainInfo publish_chain(const BlockHash& hash);
  static BlockChainInfo chain_of(const Described& d) {
    return BlockChainInfo{d.parent, d.token_ids, d.lora_name};
  }
  // `tier` left the block (ns, hash): its chain goes at the turn's end unless a tier takes it.
  void leave(Namespace ns, const BlockHash& hash, uint8_t tier);

  uint16_t pool_;
  EventLog& log_;
  PrefixStats& prefix_stats_;
  const uint32_t& now_;
  KvEventBatcher* kv_events_;
  bool flushing_ = false;
  std::vector<LoggedEvent> held_;     // a flush's removals, until end_flush
  std::vector<BlockHash> held_host_;  // a flush's host-tier removals, until end_flush
  // REMOTE blocks announced stored and not yet gone (a removal of a block another node wrote,
  // found gone by a read, may take it below the truth: a flush may then clear them early,
  // never keep one that is gone).
  uint64_t remote_live_ = 0;
  const wire::PublishRequest* publish_ = nullptr;
  bool keep_chains_ = false;
  bool keep_token_ids_ = true;
  uint32_t tokens_per_page_ = 0;
  size_t publish_cursor_ = 0;  // the next item of publish_ a stored() may be
  std::unordered_map<Key, Described, KeyHash> described_;
  std::vector<Key> gone_;  // left their last tier this turn
};

}  // namespace kvpool::daemon

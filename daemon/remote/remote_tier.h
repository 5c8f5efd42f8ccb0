// RemoteTier: a pool's tier on Redis Cluster, below its host tier (or its device tier when it has
// none), shared by every kvpoold that names the same cluster and namespace: a prefix one node
// computed is found by the others' lookups and promoted into their pools, bytes equal.
//
// Keys: NAMESPACE:TENANT:FINGERPRINT:HASH (the geometry fingerprint and the 128-bit block hash
// in hex), so tenants and geometries never meet; a hybrid model's group pool puts its group's
// name before the fingerprint (NAMESPACE:TENANT:GROUP:FINGERPRINT:HASH): two groups of one
// geometry hold different layers of the same block. Values: one page packed as the host tier packs
// it behind a self-describing header (remote_value.h); a value of another geometry, another
// block, or whose checksum fails is counted and never served.
//
// Writes (write: on_publish). Each block a worker publishes (admit: all), or that a lookup hits
// for the first time (admit: reused: one-off prefixes stay out), is held by the tier's own owner
// at once, so nothing reuses its page; plan_store() then takes up to batch_pages of them, with a
// staging slot each, into a RemoteStore that the remote store worker runs: the pages' bytes
// into the slots (the tier's own pinned memory on a GPU), the headers, one pipelined SET batch.
// finish_store(), on the loop, releases the pages and slots. When the staging slots are all
// taken, or the pages held for writes reach an eighth of the pool, further blocks are skipped
// (counted): a slow or full cluster never holds the loop, nor the pages workers need.
//
// Writes (write: on_demote). The tier is the pool's index observer (ahead of the host tier's
// mover, when there is one) and notes each block the device tier evicts. plan_demote(), with
// the call's other tier copies, claims a staging slot for each not known to be in the cluster
// (admit: reused, only those a lookup hit while they were here) and adds the copy page → slot to
// the call's TierCopy, ahead of every other copy there: the page's bytes are intact until then,
// as for a host-tier demotion (the caller whose alloc evicted it waits for the copies; an
// operator's evict hands the pages to the tier's owner until they are done). finish_demote()
// queues the staged values; plan_store() sends them before any offered block. The cluster then
// holds what this node could not keep on its device, and nothing is held for it: writes cost a
// staging copy, never a page. Evictions with no staging slot free are skipped (counted).
//
// Reads. A lookup that misses locally continues its chain here: plan_fetch() claims slots for
// up to batch_pages blocks and the remote fetch worker GETs them in one batch, checking each
// value into its slot; the run that is valid from the first block is promoted (the Service
// allocates its pages, these copies join the call's tier copies, behind its demotions, and the
// pages are published before the reply, tier kTierRemote). While the cluster is unreachable the
// tier is skipped for retry_after (lookups answer locally; counted, logged once).
//
// Thread-safety: fetch() and store() run on the remote workers' threads (one each, one job at a
// time), each with its own ClusterClient; they touch only their job and the staging memory of
// their direction. copy_down() runs with the pool's tier copies (any thread); it and store()
// take turns on the write side's staging memory (store_copy_mutex_, as TierMemory copies one
// batch at a time), on slots of their own: a tier copy run on the loop may wait for one batch's
// copy into staging (batch_pages pages), never for the network.
// Everything else belongs to the event loop. Error policy: create() returns an
// error naming the cause; everything after is a cache's failure: counted, logged, never a
// client's error.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/core/ghost_set.h"
#include "daemon/core/index_observer.h"
#include "daemon/core/page_pool.h"
#include "daemon/memory/host_tier_store.h"
#include "daemon/memory/tier_memory.h"
#include "daemon/remote/cluster_client.h"
#include "daemon/remote/remote_value.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

// After a batch that reached no node, the tier is left alone this long (and the client leaves a
// failed node alone as long).
inline constexpr uint32_t kRemoteRetryAfterMs = 1000;

// One lookup's fetch: made on the loop, run on the fetch worker, finished on the loop.
struct RemoteFetch {
  Namespace space = 0;  // the caller's namespace
  std::vector<std::string> keys;
  std::vector<BlockHash> hashes;
  std::vector<uint32_t> slots;  // staging slots, one per key
  // Set by fetch(): the blocks valid from the first, per key whether its value is valid, what
  // was wrong with the others.
  uint32_t found = 0;
  std::vector<uint8_t> valid;
  uint32_t faults[5] = {};      // by remote::ValueFault
  std::vector<uint8_t> absent;  // per key: the cluster holds no value
  remote::ClusterClient::BatchResult batch;
  uint64_t ns = 0;
};

// One batch of writes: made on the loop, run on the store worker, finished on the loop.
struct RemoteStore {
  std::vector<std::string> keys;
  std::vector<Namespace> namespaces;
  std::vector<BlockHash> hashes;
  std::vector<PageId> pages;  // held by the tier's owner until finish_store
  std::vector<uint32_t> slots;
  std::vector<ByteRun> runs;  // pages → slots' payloads
  // Set by store().
  std::string copy_error;
  std::vector<uint8_t> written;  // per key
  remote::ClusterClient::BatchResult batch;
  uint64_t ns = 0;
};

struct RemoteTierStats {
  uint64_t lookups = 0;        // lookups that asked the cluster
  uint64_t hit_blocks = 0;     // blocks fetched and promoted
  uint64_t miss_lookups = 0;   // lookups that found nothing usable
  uint64_t skipped_down = 0;   // lookups not asked while the cluster was unreachable
  uint64_t rejected = 0;       // values refused: other geometry, other block, bad checksum
  uint64_t stored = 0;         // blocks written
  uint64_t store_skipped = 0;  // blocks not written: no staging slot free (or tenant unknown)
  uint64_t demoted = 0;        // evicted blocks staged for writing (write: on_demote)
  uint64_t store_failed = 0;   // blocks whose write failed
  uint64_t fetch_failed = 0;   // keys whose read failed (node down, timeout)
  uint64_t fetch_bytes = 0, store_bytes = 0;
  uint64_t fetch_ns = 0, store_ns = 0;  // time in batches, in all
  uint64_t fetch_batches = 0, store_batches = 0;
};

class RemoteTier final : private core::IndexObserver {
 public:
  // The tier of pool `label` (geometry, layout, hash scheme of `pc`) over `pool`, its staging
  // memory pinned for CUDA device `device` (−1: host memory); `events` (may be null) is told
  // of the blocks written and of their end (IndexObserver::remote_stored, remote_removed).
  static wire::Result<std::unique_ptr<RemoteTier>> create(core::PagePool& pool,
                                                          const PoolConfig& pc, int device,
                                                          core::IndexObserver* events);
  ~RemoteTier() override;
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  const RemoteTierConfig& config() const { return config_; }

  // Keys name the tenant, calls its namespace: the Service says which is which before a
  // session of the tenant uses the tier (offer, plan_fetch, and the pool's evictions).
  void name_tenant(Namespace ns, const std::string& tenant);

  // Reads. A fetch of the start of `chain` (at most `max` blocks) in namespace `ns`, or null:
  // the cluster is unreachable for now, or no staging slot is free.
  std::unique_ptr<RemoteFetch> plan_fetch(Namespace ns, std::span<const BlockHash> chain,
                                          uint32_t max);
  void fetch(RemoteFetch& f);  // the fetch worker
  // A fetch's staging slots (up to `max`, batch_pages, the slots free) with no keys yet: its
  // caller adds keys and hashes (at most one per slot, block_key's) before fetch(). Null as
  // plan_fetch's.
  std::unique_ptr<RemoteFetch> plan_fetch_slots(Namespace ns, uint32_t max);
  // The key of `hash` in namespace `ns`, or "" while the namespace has no tenant name.
  std::string block_key(Namespace ns, const BlockHash& hash) const { return key(ns, hash); }
  // The copies of f's first pages.size() blocks into `pages`, appended to `runs`.
  void plan_promote(const kernels::PagedKv& kv, const RemoteFetch& f, std::span<const PageId> pages,
                    std::vector<ByteRun>& runs) const;
  // The same for the valid keys `keys` of f (indices into f.keys), in that order.
  void plan_promote(const kernels::PagedKv& kv, const RemoteFetch& f,
                    std::span<const uint32_t> keys, std::span<const PageId> pages,
                    std::vector<ByteRun>& runs) const;
  // Any thread, one at a time (the pool's tier copies): the staged values into the pages.
  std::string copy_up(std::span<const ByteRun> runs) { return fetch_memory_->copy(runs); }
  // The loop, once the fetch ran (and its promotion, of `promoted` blocks, is done): the slots
  // go back and the outcome is counted.
  void finish_fetch(RemoteFetch& f, uint32_t promoted);
  // A fetch planned and never run: its slots go back, nothing is counted.
  void cancel_fetch(RemoteFetch& f);
  // Staging slots free for reads now (the loop).
  uint32_t free_fetch_slots() const { return static_cast<uint32_t>(free_fetch_.size()); }
  // The same when the keys promoted were `promoted_keys` (indices into f.keys).
  void finish_fetch(RemoteFetch& f, std::span<const uint32_t> promoted_keys);

  // Writes. A block published (admit all) or hit for the first time (admit reused): kept for
  // the next plan_store when write is on_publish and a slot is free, its page held until
  // written. With on_demote a hit is only noted (admit reused).
  void offer(Namespace ns, const BlockHash& hash, PageId page, bool published);
  // write: on_demote (see above). The evictions since the last call, into `tier`; the copies
  // (any thread, with the tier's other copies, first); their end, on the loop. Evictions whose
  // pages were handed back FREE before a copy (a rolled-back reservation, a shrink) are dropped.
  void plan_demote(const kernels::PagedKv& kv, TierCopy& tier);
  std::string copy_down(std::span<const ByteRun> runs);
  void finish_demote(TierCopy& tier);
  void drop_pending_demotions() { evicted_.clear(); }
  // An operator's evict on a pool without a host tier holds its victims here until their copy.
  bool holds_evictions() const { return config_.write == RemoteTierConfig::Write::on_demote; }
  core::OwnerId owner() const { return owner_; }
  // The next batch of writes, or null when none is waiting.
  std::unique_ptr<RemoteStore> plan_store(const kernels::PagedKv& kv);
  void store(RemoteStore& s);  // the store worker
  void finish_store(RemoteStore& s);
  // Blocks offered or staged and not yet in a batch.
  uint32_t waiting() const { return static_cast<uint32_t>(offered_.size() + staged_.size()); }

  const RemoteTierStats& stats() const { return stats_; }
  // Asks for the slot map now, on the caller's thread (before the workers start: kvpoold's
  // start, so that its log and status show the cluster); whether a node answered.
  bool refresh_now() { return fetch_client_->refresh(); }
  // The read side's view of the cluster (any thread).
  remote::ClusterView view() const { return fetch_client_->view(); }
  bool reachable() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t staging_pages() const { return config_.staging_pages; }

 private:
  RemoteTier(core::PagePool& pool, const PoolConfig& pc, std::unique_ptr<TierMemory> fetch_memory,
             std::unique_ptr<TierMemory> store_memory, core::IndexObserver* events);
  // The key of `hash` in namespace `ns`, or "" while the namespace has no tenant name.
  std::string key(Namespace ns, const BlockHash& hash) const;
  // Written blocks whose expiry passed (or past the most remembered): their removal events.
  void expire_announced();
  void note_reachable(bool reachable);
  std::byte* store_slot(uint32_t slot) const {
    return store_memory_->base() + uint64_t{slot} * slot_bytes_;
  }

  // IndexObserver (write: on_demote): evictions noted, everything passed on to next_.
  void stored(Namespace ns, const BlockHash& hash, PageId page) override;
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override;
  void host_stored(Namespace ns, const BlockHash& hash) override;
  void host_removed(Namespace ns, const BlockHash& hash, bool promoting) override;

  struct Offer {
    std::string key;
    Namespace ns;
    BlockHash hash;
    PageId page;
  };
  struct Announced {  // a block written, told to events_, until its expiry
    uint64_t expires_ns;
    Namespace ns;
    BlockHash hash;
  };
  struct Eviction {
    Namespace ns;
    BlockHash hash;
    PageId page;
  };
  struct Staged {  // a value in a write staging slot (its payload; the header comes at store)
    std::string key;
    Namespace ns;
    BlockHash hash;
    uint32_t slot;
  };

  core::PagePool& pool_;
  core::OwnerId owner_;  // holds the pages waiting for or in a write
  RemoteTierConfig config_;
  std::string label_;
  std::string group_;  // a hybrid model's group: its name is part of the key ("" otherwise)
  Geometry geometry_;
  KvLayout layout_;
  uint64_t fingerprint_;
  uint64_t payload_bytes_;
  uint64_t slot_bytes_;  // header + payload
  std::unique_ptr<TierMemory> fetch_memory_, store_memory_;
  std::vector<uint32_t> free_fetch_, free_store_;
  std::vector<Offer> offered_;
  IndexObserver* next_ = nullptr;  // the pool's observer before this one (on_demote)
  std::vector<Eviction> evicted_;  // since the last plan_demote
  std::unordered_map<uint64_t, std::vector<Staged>> copying_;  // by TierCopy::remote_down
  uint64_t next_down_ = 1;
  std::vector<Staged> staged_;  // copied, waiting for plan_store
  std::mutex store_copy_mutex_;
  std::vector<std::string> tenants_;  // by namespace − 1; "" not yet named
  core::GhostSet reused_;             // on_demote with admit reused: keys a lookup hit
  uint32_t held_ = 0;                 // pages held for writes: offered, or in a batch in flight
  core::GhostSet written_;            // keys recently offered or found here: not offered again
  std::unique_ptr<remote::ClusterClient> fetch_client_, store_client_;
  core::IndexObserver* events_;      // told of blocks written and gone; may be null
  std::deque<Announced> announced_;  // in write order, so in expiry order (one ttl_s)
  // After a batch that reached no node, the loop skips the tier until then.
  uint64_t down_until_ns_ = 0;
  bool logged_down_ = false;
  RemoteTierStats stats_;
};

}  // namespace kvpool::daemon

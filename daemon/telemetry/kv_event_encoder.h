// KV events in vLLM's wire format: the msgpack payload of one ZeroMQ batch.
//
// vLLM (vllm/distributed/kv_events.py) encodes a KVEventBatch with msgspec, array_like=True and
// omit_defaults=True. A batch is therefore the array
//   [ts, events, data_parallel_rank]      (the rank unless events.data_parallel_rank is none)
// with ts a float64 (seconds since the epoch) and each event a tagged array whose first element
// is the class name and the rest its fields in declaration order:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//    lora_name]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// That is KvPayloadLayout::array. vLLM's main branch has since dropped array_like (its structs
// encode as maps); KvPayloadLayout::map writes that form for routers built against it:
//   {"ts": ts, "events": [...], "data_parallel_rank": rank}
//   {"type": "BlockStored", "block_hashes": ..., "parent_block_hash": ..., "token_ids": [...],
//    "block_size": ..., "lora_id": nil, "medium": ..., "lora_name": ...}
//   {"type": "BlockRemoved", "block_hashes": ..., "medium": ...}
//   {"type": "AllBlocksCleared"}
// (msgspec's tag field "type" first, then the fields in declaration order; extra_keys and
// group_idx, left at their defaults but for a hybrid model's group, omitted as omit_defaults=True
// omits them.)
// vLLM's hashes are `bytes | int`. kvpool's are 128-bit; KvHashFormat::bytes sends each as a
// 16-byte bin (lo as 8 little-endian bytes, then hi: the bytes of BlockHash in memory and in the
// C API), KvHashFormat::uint64 sends the `lo` word as an unsigned integer for routers that take
// integer hashes only. A router must treat them as opaque ids.
//
// What a worker passed with its publish (wire::PublishRequest's chain) fills parent_block_hash,
// token_ids and lora_name; without it they are vLLM's "absent" values (nil, [], nil). lora_id
// is always nil (kvpool names adapters, it does not number them). block_size is the pool's
// tokens_per_page; medium is the pool's ("GPU" for device pools, "CPU" for the host backend) or,
// for its host tier, "CPU", or for what this daemon wrote to its remote tier, "REMOTE" (a
// Redis Cluster the fleet shares: any node can fetch the block). A pool that is a group of a hybrid
// model adds vLLM's group_idx (after extra_keys, nil, in the array form).
//
// KvEventBatcher collects one pool's index changes between flushes: consecutive stores (or
// removals) of one medium become one event with several hashes, as vLLM batches a step's blocks;
// stores with token ids merge only while each block is the previous one's child, so that an
// event's token_ids and parent describe one chain as vLLM's do.
//
// Thread-safety: none; plain values used on the event loop. Error policy: cannot fail (msgpack
// writes into a growing buffer; std::bad_alloc propagates).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/block_hash.h"

namespace kvpool::daemon {

enum class KvHashFormat : uint8_t { bytes, uint64 };
// Which of a pool's tiers an event is about (its medium).
enum class KvTier : uint8_t { pool, host, remote };
enum class KvPayloadLayout : uint8_t { array, map };

struct KvEvent {
  enum class Kind : uint8_t { stored, removed, cleared };
  Kind kind = Kind::stored;
  std::vector<BlockHash> hashes{};  // stored, removed; empty for cleared
  KvTier tier = KvTier::pool;       // the medium: KvEventFormat's for that tier
  // stored: the worker described its blocks (a chain), then the first block's parent (absent:
  // nil, a sequence's first block), every block's token ids (block_size each, or none), the
  // adapter's name. Undescribed blocks need not form one chain.
  bool described = false;
  std::optional<BlockHash> parent{};
  std::vector<uint32_t> token_ids{};
  std::string lora_name{};
};

// What a publish told of one block, for its events (wire::PublishRequest's chain).
struct BlockChainInfo {
  std::optional<BlockHash> parent{};
  std::span<const uint32_t> token_ids{};  // this block's tokens, or empty
  std::string_view lora_name{};
  bool empty() const { return !parent && token_ids.empty() && lora_name.empty(); }
};

// What every event of one pool's batches says besides its hashes.
struct KvEventFormat {
  KvHashFormat hash_format = KvHashFormat::bytes;
  KvPayloadLayout layout = KvPayloadLayout::array;
  uint32_t block_size = 0;                       // the pool's tokens_per_page
  std::string medium{};                          // the pool's: "GPU" or "CPU"
  std::string host_medium = "CPU";               // its host tier's
  std::string remote_medium = "REMOTE";          // its remote tier's
  std::optional<uint32_t> group_idx{};           // a hybrid model's group: its index
  std::optional<uint32_t> data_parallel_rank{};  // sent only when set
  bool token_ids = true;  // false: token_ids always [] (events.zmq_token_ids)
};

// Appends the msgpack encoding of the batch (in format.layout) to `out`.
void encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                           const KvEventFormat& format, std::string& out);

// What the KvEventPublisher has done, for the stats snapshot.
struct KvEventCounters {
  uint64_t batches_published = 0;  // handed to libzmq
  uint64_t batches_dropped = 0;    // refused by libzmq (not sent to anyone)
  uint64_t replay_requests = 0;
};

// One pool's events since the last take(), merged as vLLM merges them.
class KvEventBatcher {
 public:
  // `host`: the block is in (or left) the pool's host tier rather than the pool.
  void stored(const BlockHash& hash, KvTier tier = KvTier::pool, const BlockChainInfo& chain = {});
  void removed(const BlockHash& hash, KvTier tier = KvTier::pool);
  // The pool's index is empty now: earlier events of this batch are superseded but kept (a
  // router replaying them ends in the same state), and the clear follows them.
  void cleared() {
    events_.push_back(KvEvent{KvEvent::Kind::cleared, {}, KvTier::pool, false, {}, {}, {}});
  }

  bool empty() const { return events_.empty(); }
  // Hands over the events collected and starts a new batch.
  std::vector<KvEvent> take() { return std::exchange(events_, {}); }

 private:
  std::vector<KvEvent> events_;
};

}  // namespace kvpool::daemon

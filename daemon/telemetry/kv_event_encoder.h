// KV events in vLLM's wire format: the msgpack payload of one ZeroMQ batch.
//
// vLLM (vllm/distributed/kv_events.py) encodes a KVEventBatch with msgspec, array_like=True and
// omit_defaults=True. A batch is therefore the array
//   [ts, events, data_parallel_rank]      (the rank only when one is configured)
// with ts a float64 (seconds since the epoch) and each event a tagged array whose first element
// is the class name and the rest its fields in declaration order:
//   ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//    lora_name]
//   ["BlockRemoved", block_hashes, medium]
//   ["AllBlocksCleared"]
// That is KvPayloadLayout::array. vLLM's main branch has since dropped array_like (its structs
// encode as maps); KvPayloadLayout::map writes that form for routers built against it:
//   {"ts": ts, "events": [...], "data_parallel_rank": rank}   (the rank only when configured)
//   {"type": "BlockStored", "block_hashes": ..., "parent_block_hash": nil, "token_ids": [],
//    "block_size": ..., "lora_id": nil, "medium": ..., "lora_name": nil}
//   {"type": "BlockRemoved", "block_hashes": ..., "medium": ...}
//   {"type": "AllBlocksCleared"}
// (msgspec's tag field "type" first, then the fields in declaration order; the fields with
// defaults that kvpool leaves at them, such as extra_keys and group_idx, omitted as
// omit_defaults=True omits them.)
// vLLM's hashes are `bytes | int`. kvpool's are 128-bit; KvHashFormat::bytes sends each as a
// 16-byte bin (lo as 8 little-endian bytes, then hi: the bytes of BlockHash in memory and in the
// C API), KvHashFormat::uint64 sends the `lo` word as an unsigned integer for routers that take
// integer hashes only. A router must treat them as opaque ids.
//
// What kvpoold does not know is sent as vLLM's "absent" values: parent_block_hash nil, token_ids
// empty, lora_id nil, lora_name nil. block_size is the pool's tokens_per_page, medium "GPU" for
// device pools and "CPU" for host memory.
//
// KvEventBatcher collects one pool's index changes between flushes: consecutive stores (or
// removals) become one event with several hashes, as vLLM batches a step's blocks.
//
// Thread-safety: none; plain values used on the event loop. Error policy: cannot fail (msgpack
// writes into a growing buffer; std::bad_alloc propagates).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/block_hash.h"

namespace kvpool::daemon {

enum class KvHashFormat : uint8_t { bytes, uint64 };
enum class KvPayloadLayout : uint8_t { array, map };

struct KvEvent {
  enum class Kind : uint8_t { stored, removed, cleared };
  Kind kind = Kind::stored;
  std::vector<BlockHash> hashes;  // stored, removed; empty for cleared
};

// What every event of one pool's batches says besides its hashes.
struct KvEventFormat {
  KvHashFormat hash_format = KvHashFormat::bytes;
  KvPayloadLayout layout = KvPayloadLayout::array;
  uint32_t block_size = 0;                     // the pool's tokens_per_page
  std::string medium;                          // "GPU" or "CPU"
  std::optional<uint32_t> data_parallel_rank;  // sent only when set
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
  void stored(const BlockHash& hash) { add(KvEvent::Kind::stored, hash); }
  void removed(const BlockHash& hash) { add(KvEvent::Kind::removed, hash); }
  // The pool's index is empty now: earlier events of this batch are superseded but kept (a
  // router replaying them ends in the same state), and the clear follows them.
  void cleared() { events_.push_back(KvEvent{KvEvent::Kind::cleared, {}}); }

  bool empty() const { return events_.empty(); }
  // Hands over the events collected and starts a new batch.
  std::vector<KvEvent> take() { return std::exchange(events_, {}); }

 private:
  void add(KvEvent::Kind kind, const BlockHash& hash) {
    if (events_.empty() || events_.back().kind != kind) events_.push_back(KvEvent{kind, {}});
    events_.back().hashes.push_back(hash);
  }

  std::vector<KvEvent> events_;
};

}  // namespace kvpool::daemon

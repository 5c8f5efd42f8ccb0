// The msgpack batches of KV events for routers (daemon/telemetry/kv_event_encoder.h), decoded with
// msgpack-cxx's unpacker and held to vLLM's array_like layout element by element: the batch
// [ts, events(, data_parallel_rank)], each event a tagged array with its fields in declaration
// order, hashes as 16-byte bins (lo then hi, little-endian) or as the lo word; and to the map
// layout of vLLM's main branch, key by key.
#include "daemon/telemetry/kv_event_encoder.h"

#include "daemon/telemetry/kv_event_publisher.h"

#include <gtest/gtest.h>
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include <cstring>
#include <string>
#include <vector>

namespace kvpool::daemon {
namespace {

constexpr BlockHash kA{0x0807060504030201ull, 0x100F0E0D0C0B0A09ull};
constexpr BlockHash kB{0xFFFFFFFFFFFFFFF0ull, 0x1ull};

msgpack::object_handle decode(const std::string& bytes) {
  size_t offset = 0;
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), offset);
  EXPECT_EQ(offset, bytes.size()) << "one msgpack object, nothing after it";
  return oh;
}

const msgpack::object_array& as_array(const msgpack::object& o, uint32_t size) {
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  EXPECT_EQ(o.via.array.size, size);
  return o.via.array;
}

std::string as_str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return o.type == msgpack::type::STR ? std::string(o.via.str.ptr, o.via.str.size) : "";
}

uint64_t as_uint(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::POSITIVE_INTEGER);
  return o.via.u64;
}

std::string bin_of(const BlockHash& h) {
  std::string b(16, '\0');
  std::memcpy(b.data(), &h, 16);  // x86-64: the in-memory bytes are lo, hi little-endian
  return b;
}

KvEventFormat format(KvHashFormat hashes, std::optional<uint32_t> rank = std::nullopt) {
  KvEventFormat f;
  f.hash_format = hashes;
  f.block_size = 16;
  f.medium = "GPU";
  f.data_parallel_rank = rank;
  return f;
}

KvEvent event(KvEvent::Kind kind, std::vector<BlockHash> hashes) {
  KvEvent e;
  e.kind = kind;
  e.hashes = std::move(hashes);
  return e;
}

std::vector<uint32_t> tokens_from(uint32_t first, size_t n) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i)
    t[i] = first + static_cast<uint32_t>(i);
  return t;
}

std::vector<uint64_t> uints_of(const msgpack::object& o) {
  std::vector<uint64_t> v;
  if (o.type != msgpack::type::ARRAY) {
    ADD_FAILURE() << "not an array";
    return v;
  }
  for (uint32_t i = 0; i < o.via.array.size; ++i)
    v.push_back(as_uint(o.via.array.ptr[i]));
  return v;
}

TEST(KvEventEncoder, AllThreeEventKindsWithByteHashes) {
  const std::vector<KvEvent> events = {event(KvEvent::Kind::stored, {kA, kB}),
                                       event(KvEvent::Kind::removed, {kB}),
                                       event(KvEvent::Kind::cleared, {})};
  std::string out;
  encode_kv_event_batch(1764669600.25, events, format(KvHashFormat::bytes), out);
  const msgpack::object_handle oh = decode(out);
  const auto& batch = as_array(oh.get(), 2);  // no rank: omitted, not nil
  EXPECT_EQ(batch.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_DOUBLE_EQ(batch.ptr[0].via.f64, 1764669600.25);
  const auto& evs = as_array(batch.ptr[1], 3);

  const auto& stored = as_array(evs.ptr[0], 8);
  EXPECT_EQ(as_str(stored.ptr[0]), "BlockStored");
  const auto& hashes = as_array(stored.ptr[1], 2);
  ASSERT_EQ(hashes.ptr[0].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hashes.ptr[0].via.bin.ptr, hashes.ptr[0].via.bin.size), bin_of(kA));
  EXPECT_EQ(std::string(hashes.ptr[0].via.bin.ptr, 16),
            std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10", 16));
  ASSERT_EQ(hashes.ptr[1].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hashes.ptr[1].via.bin.ptr, hashes.ptr[1].via.bin.size), bin_of(kB));
  EXPECT_EQ(stored.ptr[2].type, msgpack::type::NIL);  // parent_block_hash
  as_array(stored.ptr[3], 0);                         // token_ids
  EXPECT_EQ(as_uint(stored.ptr[4]), 16u);             // block_size
  EXPECT_EQ(stored.ptr[5].type, msgpack::type::NIL);  // lora_id
  EXPECT_EQ(as_str(stored.ptr[6]), "GPU");            // medium
  EXPECT_EQ(stored.ptr[7].type, msgpack::type::NIL);  // lora_name

  const auto& removed = as_array(evs.ptr[1], 3);
  EXPECT_EQ(as_str(removed.ptr[0]), "BlockRemoved");
  const auto& removed_hashes = as_array(removed.ptr[1], 1);
  ASSERT_EQ(removed_hashes.ptr[0].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(removed_hashes.ptr[0].via.bin.ptr, 16), bin_of(kB));
  EXPECT_EQ(as_str(removed.ptr[2]), "GPU");

  const auto& cleared = as_array(evs.ptr[2], 1);
  EXPECT_EQ(as_str(cleared.ptr[0]), "AllBlocksCleared");
}

TEST(KvEventEncoder, IntegerHashesAreTheLowWordAndTheRankIsTheThirdElement) {
  const std::vector<KvEvent> events = {{KvEvent::Kind::stored, {kA, kB}},
                                       {KvEvent::Kind::removed, {kA}},
                                       {KvEvent::Kind::cleared, {}}};
  KvEventFormat f = format(KvHashFormat::uint64, 5);
  f.medium = "CPU";
  std::string out;
  encode_kv_event_batch(2.5, events, f, out);
  const msgpack::object_handle oh = decode(out);
  const auto& batch = as_array(oh.get(), 3);
  EXPECT_EQ(as_uint(batch.ptr[2]), 5u);
  const auto& evs = as_array(batch.ptr[1], 3);
  const auto& stored = as_array(evs.ptr[0], 8);
  EXPECT_EQ(as_str(stored.ptr[0]), "BlockStored");
  const auto& hashes = as_array(stored.ptr[1], 2);
  EXPECT_EQ(as_uint(hashes.ptr[0]), kA.lo);
  EXPECT_EQ(as_uint(hashes.ptr[1]), kB.lo);  // above 2^63: still an unsigned integer
  EXPECT_EQ(as_str(stored.ptr[6]), "CPU");
  const auto& removed = as_array(evs.ptr[1], 3);
  EXPECT_EQ(as_str(removed.ptr[0]), "BlockRemoved");
  EXPECT_EQ(as_uint(as_array(removed.ptr[1], 1).ptr[0]), kA.lo);
  EXPECT_EQ(as_str(removed.ptr[2]), "CPU");
  EXPECT_EQ(as_str(as_array(evs.ptr[2], 1).ptr[0]), "AllBlocksCleared");
}

TEST(KvEventEncoder, AnEmptyBatchIsAnEmptyEventArray) {
  std::string out;
  encode_kv_event_batch(1.0, {}, format(KvHashFormat::bytes), out);
  const msgpack::object_handle oh = decode(out);
  as_array(as_array(oh.get(), 2).ptr[1], 0);
}

// vLLM main's layout: every struct a map, the tag under "type" first, fields in declaration
// order, defaults omitted.
std::vector<std::string> keys_of(const msgpack::object& o) {
  std::vector<std::string> keys;
  EXPECT_EQ(o.type, msgpack::type::MAP);
  if (o.type != msgpack::type::MAP) return keys;
  for (uint32_t i = 0; i < o.via.map.size; ++i)
    keys.push_back(as_str(o.via.map.ptr[i].key));
  return keys;
}

const msgpack::object& at(const msgpack::object& o, const std::string& key) {
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    if (as_str(o.via.map.ptr[i].key) == key) return o.via.map.ptr[i].val;
  }
  ADD_FAILURE() << "no key " << key;
  return o;
}

TEST(KvEventEncoder, MapLayoutNamesEveryFieldAfterTheTypeTag) {
  const std::vector<KvEvent> events = {event(KvEvent::Kind::stored, {kA}),
                                       event(KvEvent::Kind::removed, {kA, kB}),
                                       event(KvEvent::Kind::cleared, {})};
  KvEventFormat f = format(KvHashFormat::bytes);
  f.layout = KvPayloadLayout::map;
  std::string out;
  encode_kv_event_batch(3.5, events, f, out);
  msgpack::object_handle oh = decode(out);
  const msgpack::object& batch = oh.get();
  EXPECT_EQ(keys_of(batch), (std::vector<std::string>{"ts", "events"}));  // no rank: omitted
  EXPECT_DOUBLE_EQ(at(batch, "ts").via.f64, 3.5);
  const auto& evs = as_array(at(batch, "events"), 3);

  const msgpack::object& stored = evs.ptr[0];
  EXPECT_EQ(keys_of(stored),
            (std::vector<std::string>{"type", "block_hashes", "parent_block_hash", "token_ids",
                                      "block_size", "lora_id", "medium", "lora_name"}));
  EXPECT_EQ(as_str(at(stored, "type")), "BlockStored");
  const auto& hashes = as_array(at(stored, "block_hashes"), 1);
  ASSERT_EQ(hashes.ptr[0].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(hashes.ptr[0].via.bin.ptr, hashes.ptr[0].via.bin.size), bin_of(kA));
  EXPECT_EQ(at(stored, "parent_block_hash").type, msgpack::type::NIL);
  as_array(at(stored, "token_ids"), 0);
  EXPECT_EQ(as_uint(at(stored, "block_size")), 16u);
  EXPECT_EQ(at(stored, "lora_id").type, msgpack::type::NIL);
  EXPECT_EQ(as_str(at(stored, "medium")), "GPU");
  EXPECT_EQ(at(stored, "lora_name").type, msgpack::type::NIL);

  const msgpack::object& removed = evs.ptr[1];
  EXPECT_EQ(keys_of(removed), (std::vector<std::string>{"type", "block_hashes", "medium"}));
  EXPECT_EQ(as_str(at(removed, "type")), "BlockRemoved");
  as_array(at(removed, "block_hashes"), 2);
  EXPECT_EQ(as_str(at(removed, "medium")), "GPU");

  EXPECT_EQ(keys_of(evs.ptr[2]), std::vector<std::string>{"type"});
  EXPECT_EQ(as_str(at(evs.ptr[2], "type")), "AllBlocksCleared");

  // With a rank it is the third entry.
  f.data_parallel_rank = 1;
  out.clear();
  encode_kv_event_batch(3.5, {}, f, out);
  oh = decode(out);
  EXPECT_EQ(keys_of(oh.get()), (std::vector<std::string>{"ts", "events", "data_parallel_rank"}));
  EXPECT_EQ(as_uint(at(oh.get(), "data_parallel_rank")), 1u);
}

TEST(KvEventBatcher, MergesConsecutiveEventsOfOneKindInOrder) {
  KvEventBatcher b;
  EXPECT_TRUE(b.empty());
  b.stored(kA);
  b.stored(kB);
  b.removed(kA);
  b.removed(kB);
  b.stored(kA);
  b.cleared();
  b.cleared();
  const std::vector<KvEvent> events = b.take();
  EXPECT_TRUE(b.empty());
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::stored);
  EXPECT_EQ(events[0].hashes, (std::vector<BlockHash>{kA, kB}));
  EXPECT_EQ(events[1].kind, KvEvent::Kind::removed);
  EXPECT_EQ(events[1].hashes, (std::vector<BlockHash>{kA, kB}));
  EXPECT_EQ(events[2].kind, KvEvent::Kind::stored);
  EXPECT_EQ(events[2].hashes, (std::vector<BlockHash>{kA}));
  EXPECT_EQ(events[3].kind, KvEvent::Kind::cleared);
  EXPECT_EQ(events[4].kind, KvEvent::Kind::cleared);
}

constexpr BlockHash kC{0x3333ull, 0x4444ull};
constexpr BlockHash kRoot{0x5555ull, 0x6666ull};

TEST(KvEventEncoder, DescribedStoresCarryParentTokensAdapterAndTheirMedium) {
  KvEventBatcher b;
  const std::vector<uint32_t> ta = tokens_from(100, 16);
  const std::vector<uint32_t> tb = tokens_from(200, 16);
  b.stored(kA, KvTier::pool, BlockChainInfo{kRoot, ta, "sql-lora"});
  b.stored(kB, KvTier::pool, BlockChainInfo{kA, tb, "sql-lora"});  // kA's child: one event
  b.removed(kA);
  b.stored(kA, KvTier::host, BlockChainInfo{kRoot, ta, "sql-lora"});  // demoted
  std::vector<KvEvent> events = b.take();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].hashes, (std::vector<BlockHash>{kA, kB}));
  EXPECT_EQ(events[0].token_ids.size(), 32u);

  KvEventFormat f = format(KvHashFormat::uint64);
  std::string out;
  encode_kv_event_batch(1.0, events, f, out);
  msgpack::object_handle oh = decode(out);
  const auto& evs = as_array(as_array(oh.get(), 2).ptr[1], 3);
  const auto& stored = as_array(evs.ptr[0], 8);
  EXPECT_EQ(uints_of(stored.ptr[1]), (std::vector<uint64_t>{kA.lo, kB.lo}));
  EXPECT_EQ(as_uint(stored.ptr[2]), kRoot.lo);  // parent_block_hash
  std::vector<uint64_t> want(ta.begin(), ta.end());
  want.insert(want.end(), tb.begin(), tb.end());
  EXPECT_EQ(uints_of(stored.ptr[3]), want);  // token_ids, both blocks in order
  EXPECT_EQ(as_str(stored.ptr[6]), "GPU");
  EXPECT_EQ(as_str(stored.ptr[7]), "sql-lora");  // lora_name
  const auto& removed = as_array(evs.ptr[1], 3);
  EXPECT_EQ(as_str(removed.ptr[2]), "GPU");
  const auto& demoted = as_array(evs.ptr[2], 8);
  EXPECT_EQ(as_str(demoted.ptr[6]), "CPU");  // the host tier's medium
  EXPECT_EQ(uints_of(demoted.ptr[3]), std::vector<uint64_t>(ta.begin(), ta.end()));

  // Token ids off (events.zmq_token_ids: false): the parent stays, the ids go.
  f.token_ids = false;
  out.clear();
  encode_kv_event_batch(1.0, events, f, out);
  oh = decode(out);
  const auto& lean = as_array(as_array(as_array(oh.get(), 2).ptr[1], 3).ptr[0], 8);
  as_array(lean.ptr[3], 0);
  EXPECT_EQ(as_uint(lean.ptr[2]), kRoot.lo);
}

TEST(KvEventEncoder, AGroupOfAHybridModelSendsGroupIdxInBothLayouts) {
  KvEventFormat f = format(KvHashFormat::uint64);
  f.group_idx = 1;
  const std::vector<KvEvent> events = {event(KvEvent::Kind::stored, {kA}),
                                       event(KvEvent::Kind::removed, {kA})};
  std::string out;
  encode_kv_event_batch(1.0, events, f, out);
  msgpack::object_handle oh = decode(out);
  const auto& evs = as_array(as_array(oh.get(), 2).ptr[1], 2);
  const auto& stored = as_array(evs.ptr[0], 10);
  EXPECT_EQ(stored.ptr[8].type, msgpack::type::NIL);  // extra_keys
  EXPECT_EQ(as_uint(stored.ptr[9]), 1u);              // group_idx
  const auto& removed = as_array(evs.ptr[1], 4);
  EXPECT_EQ(as_uint(removed.ptr[3]), 1u);

  f.layout = KvPayloadLayout::map;
  out.clear();
  encode_kv_event_batch(1.0, events, f, out);
  oh = decode(out);
  const auto& mevs = as_array(at(oh.get(), "events"), 2);
  EXPECT_EQ(keys_of(mevs.ptr[0]),
            (std::vector<std::string>{"type", "block_hashes", "parent_block_hash", "token_ids",
                                      "block_size", "lora_id", "medium", "lora_name", "extra_keys",
                                      "group_idx"}));
  EXPECT_EQ(as_uint(at(mevs.ptr[1], "group_idx")), 1u);
}

TEST(KvEventBatcher, DescribedStoresMergeOnlyAlongTheirChain) {
  KvEventBatcher b;
  const std::vector<uint32_t> t = tokens_from(0, 16);
  b.stored(kA, KvTier::pool, BlockChainInfo{std::nullopt, t, ""});  // a sequence's first block
  b.stored(kC, KvTier::pool, BlockChainInfo{kB, t, ""});            // not kA's child
  b.stored(kB, KvTier::pool, BlockChainInfo{kC, {}, ""});           // kC's child, but without ids
  b.stored(kA);                                                     // undescribed
  b.stored(kB);                                                     // merges with the undescribed
  b.stored(kC, KvTier::pool, BlockChainInfo{kB, t, "other"});  // described: not into undescribed
  b.stored(kA, KvTier::host, BlockChainInfo{kC, t, "other"});  // another medium
  const std::vector<KvEvent> events = b.take();
  ASSERT_EQ(events.size(), 6u);
  EXPECT_FALSE(events[0].parent.has_value());
  EXPECT_EQ(events[0].hashes, std::vector<BlockHash>{kA});
  EXPECT_EQ(events[1].hashes, std::vector<BlockHash>{kC});
  EXPECT_EQ(*events[1].parent, kB);
  EXPECT_EQ(events[2].hashes, std::vector<BlockHash>{kB});
  EXPECT_TRUE(events[2].token_ids.empty());
  EXPECT_EQ(events[3].hashes, (std::vector<BlockHash>{kA, kB}));
  EXPECT_FALSE(events[3].parent.has_value());
  EXPECT_EQ(events[4].lora_name, "other");
  EXPECT_EQ(events[5].tier, KvTier::host);

  // A block described by its parent alone never joins undescribed blocks, even its parent's.
  b.stored(kA);
  b.stored(kB, KvTier::pool, BlockChainInfo{kA, {}, ""});
  const std::vector<KvEvent> split = b.take();
  ASSERT_EQ(split.size(), 2u);
  EXPECT_FALSE(split[0].described);
  EXPECT_TRUE(split[1].described);
}

TEST(KvEventPublisher, TokenIdsBoundTheBlocksOfAMessage) {
  KvEventFormat f = format(KvHashFormat::bytes);
  EXPECT_EQ(KvEventPublisher::max_blocks_per_message(f), 4096u);  // 16 tokens a block
  f.block_size = 64;
  EXPECT_EQ(KvEventPublisher::max_blocks_per_message(f), 1024u);
  f.block_size = 1u << 20;
  EXPECT_EQ(KvEventPublisher::max_blocks_per_message(f), 1u);
  f.token_ids = false;  // ids not sent: hashes alone bound it
  EXPECT_EQ(KvEventPublisher::max_blocks_per_message(f), 4096u);
}

}  // namespace
}  // namespace kvpool::daemon

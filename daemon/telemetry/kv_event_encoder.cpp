#include "daemon/telemetry/kv_event_encoder.h"

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST 1  // header-only, without Boost (CMake defines it too)
#endif
#include <msgpack.hpp>

namespace kvpool::daemon {

namespace {

// msgpack::packer writes through any type with write(const char*, size_t).
struct StringSink {
  std::string& out;
  void write(const char* data, size_t size) { out.append(data, size); }
};

void put_u64_le(uint64_t v, char* out) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

void pack_hashes(msgpack::packer<StringSink>& pk, const std::vector<BlockHash>& hashes,
                 KvHashFormat format) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes) {
    if (format == KvHashFormat::uint64) {
      pk.pack_uint64(h.lo);
    } else {
      char bytes[16];
      put_u64_le(h.lo, bytes);
      put_u64_le(h.hi, bytes + 8);
      pk.pack_bin(sizeof bytes);
      pk.pack_bin_body(bytes, sizeof bytes);
    }
  }
}

void pack_str(msgpack::packer<StringSink>& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Writes a struct as vLLM's msgspec does: an array of its values, or a map of its field names to
// them. `key` is called before each value and writes the name in map layout only.
class StructWriter {
 public:
  StructWriter(msgpack::packer<StringSink>& pk, KvPayloadLayout layout, uint32_t fields)
      : pk_(pk), map_(layout == KvPayloadLayout::map) {
    if (map_) {
      pk_.pack_map(fields);
    } else {
      pk_.pack_array(fields);
    }
  }
  msgpack::packer<StringSink>& key(std::string_view name) {
    if (map_) pack_str(pk_, name);
    return pk_;
  }

 private:
  msgpack::packer<StringSink>& pk_;
  bool map_;
};

}  // namespace

void encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                           const KvEventFormat& format, std::string& out) {
  StringSink sink{out};
  msgpack::packer<StringSink> pk(sink);
  StructWriter batch(pk, format.layout, format.data_parallel_rank ? 3 : 2);
  batch.key("ts").pack_double(ts);
  batch.key("events").pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) {
    // The tag: the first element of an array, the "type" entry of a map.
    switch (e.kind) {
      case KvEvent::Kind::stored: {
        StructWriter s(pk, format.layout, 8);
        pack_str(s.key("type"), "BlockStored");
        pack_hashes(s.key("block_hashes"), e.hashes, format.hash_format);
        // The daemon knows neither a block's parent nor its tokens.
        s.key("parent_block_hash").pack_nil();
        s.key("token_ids").pack_array(0);
        s.key("block_size").pack_uint32(format.block_size);
        // Adapters are in the hash chain's root (common/block_hash.h), not named here.
        s.key("lora_id").pack_nil();
        pack_str(s.key("medium"), format.medium);
        s.key("lora_name").pack_nil();
        break;
      }
      case KvEvent::Kind::removed: {
        StructWriter s(pk, format.layout, 3);
        pack_str(s.key("type"), "BlockRemoved");
        pack_hashes(s.key("block_hashes"), e.hashes, format.hash_format);
        pack_str(s.key("medium"), format.medium);
        break;
      }
      case KvEvent::Kind::cleared: {
        StructWriter s(pk, format.layout, 1);
        pack_str(s.key("type"), "AllBlocksCleared");
        break;
      }
    }
  }
  if (format.data_parallel_rank)
    batch.key("data_parallel_rank").pack_uint32(*format.data_parallel_rank);
}

}  // namespace kvpool::daemon

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

void pack_hash(msgpack::packer<StringSink>& pk, const BlockHash& h, KvHashFormat format) {
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

void pack_hashes(msgpack::packer<StringSink>& pk, const std::vector<BlockHash>& hashes,
                 KvHashFormat format) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const BlockHash& h : hashes)
    pack_hash(pk, h, format);
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

void KvEventBatcher::stored(const BlockHash& hash, KvTier tier, const BlockChainInfo& chain) {
  if (!events_.empty()) {
    KvEvent& last = events_.back();
    const bool described = !chain.empty();
    const bool same =
        last.kind == KvEvent::Kind::stored && last.tier == tier && last.described == described;
    // Blocks the worker described merge only into their parent's event, with the same adapter
    // and both with or both without token ids; undescribed blocks only into undescribed ones.
    const bool child = chain.parent && *chain.parent == last.hashes.back() &&
                       chain.lora_name == last.lora_name &&
                       chain.token_ids.empty() == last.token_ids.empty();
    if (same && (!described || child)) {
      last.hashes.push_back(hash);
      last.token_ids.insert(last.token_ids.end(), chain.token_ids.begin(), chain.token_ids.end());
      return;
    }
  }
  KvEvent e{KvEvent::Kind::stored,       {hash}, tier, !chain.empty(), chain.parent, {},
            std::string(chain.lora_name)};
  e.token_ids.assign(chain.token_ids.begin(), chain.token_ids.end());
  events_.push_back(std::move(e));
}

void KvEventBatcher::removed(const BlockHash& hash, KvTier tier) {
  if (events_.empty() || events_.back().kind != KvEvent::Kind::removed ||
      events_.back().tier != tier) {
    events_.push_back(KvEvent{KvEvent::Kind::removed, {}, tier, false, {}, {}, {}});
  }
  events_.back().hashes.push_back(hash);
}

void encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                           const KvEventFormat& format, std::string& out) {
  StringSink sink{out};
  msgpack::packer<StringSink> pk(sink);
  StructWriter batch(pk, format.layout, format.data_parallel_rank ? 3 : 2);
  batch.key("ts").pack_double(ts);
  batch.key("events").pack_array(static_cast<uint32_t>(events.size()));
  const bool grouped = format.group_idx.has_value();
  for (const KvEvent& e : events) {
    const std::string& medium = e.tier == KvTier::host     ? format.host_medium
                                : e.tier == KvTier::remote ? format.remote_medium
                                                           : format.medium;
    // The tag: the first element of an array, the "type" entry of a map.
    switch (e.kind) {
      case KvEvent::Kind::stored: {
        StructWriter s(pk, format.layout, grouped ? 10 : 8);
        pack_str(s.key("type"), "BlockStored");
        pack_hashes(s.key("block_hashes"), e.hashes, format.hash_format);
        if (e.parent) {
          pack_hash(s.key("parent_block_hash"), *e.parent, format.hash_format);
        } else {
          s.key("parent_block_hash").pack_nil();
        }
        const bool tokens = format.token_ids && !e.token_ids.empty();
        s.key("token_ids").pack_array(tokens ? static_cast<uint32_t>(e.token_ids.size()) : 0);
        if (tokens) {
          for (const uint32_t t : e.token_ids)
            pk.pack_uint32(t);
        }
        s.key("block_size").pack_uint32(format.block_size);
        s.key("lora_id").pack_nil();  // kvpool names adapters (lora_name), it does not number them
        pack_str(s.key("medium"), medium);
        if (e.lora_name.empty()) {
          s.key("lora_name").pack_nil();
        } else {
          pack_str(s.key("lora_name"), e.lora_name);
        }
        if (grouped) {
          s.key("extra_keys").pack_nil();
          s.key("group_idx").pack_uint32(*format.group_idx);
        }
        break;
      }
      case KvEvent::Kind::removed: {
        StructWriter s(pk, format.layout, grouped ? 4 : 3);
        pack_str(s.key("type"), "BlockRemoved");
        pack_hashes(s.key("block_hashes"), e.hashes, format.hash_format);
        pack_str(s.key("medium"), medium);
        if (grouped) s.key("group_idx").pack_uint32(*format.group_idx);
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

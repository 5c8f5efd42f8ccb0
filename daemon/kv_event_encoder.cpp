#include "daemon/kv_event_encoder.h"

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

}  // namespace

void encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                           const KvEventFormat& format, std::string& out) {
  StringSink sink{out};
  msgpack::packer<StringSink> pk(sink);
  pk.pack_array(format.data_parallel_rank ? 3 : 2);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) {
    switch (e.kind) {
      case KvEvent::Kind::stored:
        pk.pack_array(8);
        pack_str(pk, "BlockStored");
        pack_hashes(pk, e.hashes, format.hash_format);
        pk.pack_nil();     // parent_block_hash: the daemon does not know a block's parent
        pk.pack_array(0);  // token_ids: nor its tokens
        pk.pack_uint32(format.block_size);
        pk.pack_nil();  // lora_id: adapters are in the hash chain's root (common/block_hash.h)
        pack_str(pk, format.medium);
        pk.pack_nil();  // lora_name
        break;
      case KvEvent::Kind::removed:
        pk.pack_array(3);
        pack_str(pk, "BlockRemoved");
        pack_hashes(pk, e.hashes, format.hash_format);
        pack_str(pk, format.medium);
        break;
      case KvEvent::Kind::cleared:
        pk.pack_array(1);
        pack_str(pk, "AllBlocksCleared");
        break;
    }
  }
  if (format.data_parallel_rank) pk.pack_uint32(*format.data_parallel_rank);
}

}  // namespace kvpool::daemon

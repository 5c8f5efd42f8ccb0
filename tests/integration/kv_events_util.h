// What the KV-event tests share: decoding a batch as vLLM's router does (msgpack-cxx), the
// envelope check, and a one-pool config.
#pragma once

#include <gtest/gtest.h>
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "tests/integration/zmq_test_socket.h"

namespace kvpool::testing {

inline BlockHash hash_of(uint32_t i) {
  return BlockHash{0xA5A5000000000000ull + i, 0x5A5A0000ull * (i + 1)};
}

inline std::string bin_of(const BlockHash& h) {
  std::string b(16, '\0');
  for (int i = 0; i < 8; ++i) {
    b[static_cast<size_t>(i)] = static_cast<char>((h.lo >> (8 * i)) & 0xff);
    b[static_cast<size_t>(8 + i)] = static_cast<char>((h.hi >> (8 * i)) & 0xff);
  }
  return b;
}

inline std::string seq_frame(int64_t seq) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i)
    b[static_cast<size_t>(i)] = static_cast<char>((static_cast<uint64_t>(seq) >> (56 - 8 * i)));
  return b;
}

inline std::string config(const std::string& events) {
  return R"(backend: host
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 16 pages
events:
)" + events;
}

inline msgpack::object_handle decode(const std::string& bytes) {
  size_t offset = 0;
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), offset);
  EXPECT_EQ(offset, bytes.size());
  return oh;
}

inline std::string str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return o.type == msgpack::type::STR ? std::string(o.via.str.ptr, o.via.str.size) : "";
}

inline const msgpack::object_array& array(const msgpack::object& o, uint32_t size) {
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  EXPECT_EQ(o.via.array.size, size);
  return o.via.array;
}

inline std::vector<std::string> bins(const msgpack::object& o) {
  std::vector<std::string> out;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    const msgpack::object& h = o.via.array.ptr[i];
    EXPECT_EQ(h.type, msgpack::type::BIN);
    if (h.type == msgpack::type::BIN) out.emplace_back(h.via.bin.ptr, h.via.bin.size);
  }
  return out;
}

// Receives the next message and checks its envelope: 3 frames, the topic, the sequence number.
inline msgpack::object_handle next_batch(ZmqSocket& sub, const std::string& topic, int64_t seq) {
  const std::vector<std::string> frames = sub.receive();
  EXPECT_EQ(frames.size(), 3u) << "batch " << seq;
  if (frames.size() != 3) return {};
  EXPECT_EQ(frames[0], topic);
  EXPECT_EQ(frames[1], seq_frame(seq)) << "batch " << seq;
  return decode(frames[2]);
}

}  // namespace kvpool::testing

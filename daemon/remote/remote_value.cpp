#include "daemon/remote/remote_value.h"

#include <xxhash.h>

#include <cstring>

namespace kvpool::daemon::remote {

namespace {

template <typename T>
void put(std::span<std::byte> out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64)
}
template <typename T>
T get(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

}  // namespace

uint64_t remote_fingerprint(const Geometry& g, KvLayout layout, const std::string& hash_scheme) {
  const std::string text =
      "kvpool-remote/1 layers=" + std::to_string(g.layers) +
      " kv_heads=" + std::to_string(g.kv_heads) + " head_dim=" + std::to_string(g.head_dim) +
      " tokens_per_page=" + std::to_string(g.tokens_per_page) +
      " dtype=" + std::to_string(static_cast<int>(g.dtype)) +
      " kind=" + std::to_string(static_cast<int>(g.kind)) + " window=" + std::to_string(g.window) +
      " layout=" + std::to_string(static_cast<int>(layout)) + " scheme=" + hash_scheme;
  return XXH3_64bits(text.data(), text.size());
}

const char* value_fault_name(ValueFault f) {
  switch (f) {
    case ValueFault::none:
      return "none";
    case ValueFault::malformed:
      return "malformed";
    case ValueFault::geometry:
      return "geometry";
    case ValueFault::block:
      return "block";
    case ValueFault::checksum:
      return "checksum";
  }
  return "?";
}

void write_value_header(std::span<std::byte> value, uint64_t fingerprint, const Geometry& g,
                        KvLayout layout, const BlockHash& hash) {
  const auto payload = value.subspan(kValueHeaderBytes);
  std::memset(value.data(), 0, kValueHeaderBytes);
  put<uint32_t>(value, 0, kValueMagic);
  put<uint16_t>(value, 4, kValueVersion);
  put<uint16_t>(value, 6, static_cast<uint16_t>(kValueHeaderBytes));
  put<uint64_t>(value, 8, fingerprint);
  put<uint64_t>(value, 16, payload.size());
  put<uint64_t>(value, 24, XXH3_64bits(payload.data(), payload.size()));
  put<uint64_t>(value, 32, hash.lo);
  put<uint64_t>(value, 40, hash.hi);
  put<uint8_t>(value, 48, static_cast<uint8_t>(g.dtype));
  put<uint8_t>(value, 49, static_cast<uint8_t>(layout));
  put<uint8_t>(value, 50, static_cast<uint8_t>(g.kind));
}

ValueFault check_value(std::span<const std::byte> value, uint64_t fingerprint,
                       uint64_t payload_bytes, const BlockHash& hash) {
  if (value.size() < kValueHeaderBytes || get<uint32_t>(value, 0) != kValueMagic ||
      get<uint16_t>(value, 4) != kValueVersion || get<uint16_t>(value, 6) != kValueHeaderBytes) {
    return ValueFault::malformed;
  }
  if (get<uint64_t>(value, 8) != fingerprint) return ValueFault::geometry;
  if (get<uint64_t>(value, 16) != payload_bytes ||
      value.size() != kValueHeaderBytes + payload_bytes) {
    return ValueFault::malformed;
  }
  if (get<uint64_t>(value, 32) != hash.lo || get<uint64_t>(value, 40) != hash.hi) {
    return ValueFault::block;
  }
  const auto payload = value.subspan(kValueHeaderBytes);
  if (get<uint64_t>(value, 24) != XXH3_64bits(payload.data(), payload.size())) {
    return ValueFault::checksum;
  }
  return ValueFault::none;
}

}  // namespace kvpool::daemon::remote

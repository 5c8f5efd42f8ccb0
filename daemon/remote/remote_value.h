// The bytes of one page in the remote tier: a header that describes them, then the page packed
// as the host tier packs it (daemon/memory/host_tier_store.h: the page's runs back to back, then
// its scales). The header makes a value self-describing, so that a reader never serves a page it
// cannot use:
//
//   offset  size  field
//        0     4  magic "KVPR"
//        4     2  version (1)
//        6     2  header bytes (64)
//        8     8  geometry fingerprint: layers, KV heads, head dim, tokens per page, dtype,
//                 attention kind and window, layout, hash scheme (remote_fingerprint())
//       16     8  payload bytes (page data + scales)
//       24     8  checksum: XXH3-64 of the payload
//       32    16  the block hash (lo, hi), so a value stored under another key is refused
//       48     1  dtype, 1 layout, 1 attention kind, 13 zero
// Integers are little-endian. check() refuses, and says why: a short value, another magic or
// version, another fingerprint (a pool of another geometry, dtype or layout wrote it), another
// block, a payload whose checksum does not match (a torn or corrupted write).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/block_hash.h"
#include "common/geometry.h"

namespace kvpool::daemon::remote {

inline constexpr uint32_t kValueMagic = 0x5250564B;  // "KVPR" as little-endian bytes
inline constexpr uint16_t kValueVersion = 1;
inline constexpr size_t kValueHeaderBytes = 64;

// What a pool's values must match: everything that decides what a page's bytes mean.
uint64_t remote_fingerprint(const Geometry& g, KvLayout layout, const std::string& hash_scheme);

// Why a value was refused (none: usable).
enum class ValueFault : uint8_t { none, malformed, geometry, block, checksum };
const char* value_fault_name(ValueFault f);

// Writes the header into out[0, kValueHeaderBytes) for the payload that follows it there.
void write_value_header(std::span<std::byte> value, uint64_t fingerprint, const Geometry& g,
                        KvLayout layout, const BlockHash& hash);
// Checks a value read back against what the reader expects.
ValueFault check_value(std::span<const std::byte> value, uint64_t fingerprint,
                       uint64_t payload_bytes, const BlockHash& hash);

}  // namespace kvpool::daemon::remote

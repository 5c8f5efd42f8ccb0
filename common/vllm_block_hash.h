// vLLM's block hash ("sha256_cbor"), so that a pool's keys and its KV events name blocks exactly
// as a vLLM engine and the routers fed by it do:
//
//   none = SHA-256(CBOR(seed))                       seed: the engine's PYTHONHASHSEED, as text
//   h0   = SHA-256(CBOR([none,   [tokens of block 0], extra_keys]))
//   hi   = SHA-256(CBOR([h(i−1), [tokens of block i], extra_keys]))
//
// CBOR is RFC 8949's deterministic form as Python's cbor2.dumps(..., canonical=True) writes these
// values: the shortest head for every integer and length, definite lengths, a tuple as an array,
// None as null (0xf6), a digest as a byte string. extra_keys is None or a tuple (LoRA name,
// multimodal identifiers, cache salt: vLLM chooses them per block; a cache salt is on block 0
// only). The engine's NONE_HASH is random when PYTHONHASHSEED is unset: a pool shared with vLLM
// needs it set, the same everywhere.
//
// A pool's key of a digest d (32 bytes): lo = d[24..32) and hi = d[16..24) read big-endian, so
// the low word a pool's events send in uint64 mode equals vLLM's own integer hash
// (int.from_bytes(d, "big") & (2^64 − 1), VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). The chain itself
// runs on whole digests: a key (128 bits) cannot be extended, so workers keep the digests.
//
// Invariant checked by tests against cbor2 + hashlib: block() equals vLLM's hash_block_tokens
// with sha256_cbor for every token value and the extra keys CborWriter can write.
// Thread-safety: a VllmBlockHasher owns an OpenSSL digest context; use one per thread.
// Error policy: the constructor throws std::runtime_error when OpenSSL has no SHA-256.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/block_hash.h"

namespace kvpool {

using VllmDigest = std::array<uint8_t, 32>;

// Deterministic CBOR of the values vLLM's extra keys hold: integers, byte and text strings,
// arrays (tuples) and null. Append-only; bytes() is the encoding so far.
class CborWriter {
 public:
  CborWriter& uint(uint64_t v) { return head(0, v); }
  CborWriter& integer(int64_t v);
  CborWriter& bytes(std::span<const uint8_t> b);
  CborWriter& text(std::string_view s);
  CborWriter& array(uint64_t n) { return head(4, n); }  // followed by its n items
  CborWriter& null();
  CborWriter& encoded_item(std::span<const std::byte> item);  // one item another writer encoded
  std::span<const std::byte> encoded() const { return out_; }
  void clear() { out_.clear(); }

 private:
  CborWriter& head(uint8_t major, uint64_t v);
  std::vector<std::byte> out_;
};

class VllmBlockHasher {
 public:
  // `seed`: the engine's PYTHONHASHSEED (vLLM hashes it as a text string to make NONE_HASH).
  explicit VllmBlockHasher(std::string_view seed);
  ~VllmBlockHasher();
  VllmBlockHasher(const VllmBlockHasher&) = delete;
  VllmBlockHasher& operator=(const VllmBlockHasher&) = delete;

  const VllmDigest& none_hash() const { return none_; }
  // The digest of one full block: `parent` null for a sequence's first block (then NONE_HASH),
  // `extra_keys` one CBOR item (CborWriter), empty for None.
  VllmDigest block(const VllmDigest* parent, std::span<const uint32_t> tokens,
                   std::span<const std::byte> extra_keys = {});
  // Digests of every full block of `tokens`, chained from NONE_HASH, each with the same extra
  // keys; writes min(out.size(), tokens.size() / tokens_per_block) and returns that count.
  size_t chain(std::span<const uint32_t> tokens, uint32_t tokens_per_block,
               std::span<VllmDigest> out, std::span<const std::byte> extra_keys = {});

  // The pool key of a digest (header comment).
  static BlockHash key(const VllmDigest& d);
  // "vllm-sha256-cbor/1" and the key of block 0 (tokens 0..15) under seed "0": a worker's hello
  // names it for a pool whose hash_scheme is vLLM's (docs/BLOCK_HASH.md).
  static const HashScheme& scheme();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  VllmDigest none_{};
  CborWriter message_;
};

}  // namespace kvpool

// Prefix block hashing: the hash chain that names a KV page by everything that precedes it.
//
//   root = H('R' ‖ model id ‖ geometry ‖ dtype ‖ adapter id ‖ salt [‖ kind ‖ window])
//                                  (length-prefixed fields; kind and window for a non-full kind)
//   h0   = H('B' ‖ root   ‖ n ‖ tokens of block 0 ‖ |extra| ‖ extra keys)
//   hi   = H('B' ‖ h(i−1) ‖ n ‖ tokens of block i ‖ |extra| ‖ extra keys)
//
// H is SHA-256 from OpenSSL (SHA-NI accelerated where the CPU has it), truncated to 128 bits; the
// alternatives that bench/micro/hash_bench measures are selectable for that comparison. Every
// field is length-prefixed and little-endian, so two different inputs never encode to the same
// message. Two equal hashes therefore mean: same model identity, same tokens in every block up to
// and including this one, same extra keys (e.g. multimodal content hashes, LoRA ids) on the way.
//
// 128 bits: accidental collisions need ~2^64 blocks. Forging one costs ~2^64 hash evaluations and
// gains nothing inside a namespace whose workers are trusted to write their own pages anyway
// (DESIGN §5); namespaces separate tenants, so no forged hash reaches another tenant's pages.
//
// Thread-safety: a BlockHasher owns an OpenSSL digest context; use one per thread.
// Error policy: the constructor throws std::runtime_error when OpenSSL cannot provide the
// algorithm (a broken installation); hashing itself cannot fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/geometry.h"

namespace kvpool {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend constexpr bool operator==(const BlockHash&, const BlockHash&) = default;
};

std::string to_hex(const BlockHash& h);

// What a block chain is rooted in: two pools or models that differ in any of these never share a
// cached page.
struct ModelIdentity {
  std::string_view model_id;
  Geometry geometry;
  std::string_view adapter_id;  // LoRA / adapter name, empty for the base model
  std::string_view salt;        // per-deployment or per-user cache salt, may be empty
};

enum class HashAlgorithm : uint8_t { sha256, sha512_256, blake2s256, blake2b512 };
std::string_view hash_algorithm_name(HashAlgorithm a);

// How a worker names blocks, as its hello tells the daemon: the scheme's name ("kvpool-sha256/1":
// docs/BLOCK_HASH.md, version 1, with H = SHA-256) and `check`, the hash its implementation gives
// that page's first block vector (tokens 0..15 under root 1), which tells two implementations
// of one name apart. A worker whose scheme differs from the daemon's would silently never share
// a block, so the daemon refuses it. An empty name says nothing (no check).
struct HashScheme {
  std::string name{};
  BlockHash check{};
  friend bool operator==(const HashScheme&, const HashScheme&) = default;
};
// The scheme of BlockHasher{} (the library's default), computed once.
const HashScheme& default_hash_scheme();

class BlockHasher {
 public:
  explicit BlockHasher(HashAlgorithm algorithm = HashAlgorithm::sha256);
  ~BlockHasher();
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;
  BlockHasher(BlockHasher&&) noexcept;
  BlockHasher& operator=(BlockHasher&&) noexcept;

  HashAlgorithm algorithm() const { return algorithm_; }
  // This hasher's scheme (HashScheme): its name and its hash of the check vector.
  HashScheme scheme();
  std::string scheme_name() const;  // scheme().name, without hashing anything

  BlockHash root(const ModelIdentity& id);

  // The hash of one block given its parent (the root for block 0).
  BlockHash block(const BlockHash& parent, std::span<const uint32_t> tokens,
                  std::span<const std::byte> extra = {});

  // Hashes of every *full* block of `tokens` (tokens_per_block each), chained from `root`.
  // Writes min(out.size(), tokens.size() / tokens_per_block) hashes and returns that count;
  // a trailing partial block is never hashed (it cannot be shared until it is full).
  size_t chain(const BlockHash& root, std::span<const uint32_t> tokens, uint32_t tokens_per_block,
               std::span<BlockHash> out);

 private:
  struct Impl;
  HashAlgorithm algorithm_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpool

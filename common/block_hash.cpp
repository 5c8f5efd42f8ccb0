#include "common/block_hash.h"

#include <openssl/evp.h>

#include <array>
#include <bit>
#include <cstring>
#include <stdexcept>

namespace kvpool {

static_assert(std::endian::native == std::endian::little,
              "block hashing feeds token ids to the digest in native order; port the encoder");

namespace {

const char* openssl_name(HashAlgorithm a) {
  switch (a) {
    case HashAlgorithm::sha256:
      return "SHA256";
    case HashAlgorithm::sha512_256:
      return "SHA512-256";
    case HashAlgorithm::blake2s256:
      return "BLAKE2S-256";
    case HashAlgorithm::blake2b512:
      return "BLAKE2B-512";
  }
  return "SHA256";
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::string_view hash_algorithm_name(HashAlgorithm a) {
  switch (a) {
    case HashAlgorithm::sha256:
      return "sha256";
    case HashAlgorithm::sha512_256:
      return "sha512_256";
    case HashAlgorithm::blake2s256:
      return "blake2s256";
    case HashAlgorithm::blake2b512:
      return "blake2b512";
  }
  return "unknown";
}

std::string to_hex(const BlockHash& h) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    const uint64_t word = i < 8 ? h.lo : h.hi;
    const auto byte = static_cast<unsigned>((word >> (8 * (i % 8))) & 0xffu);
    out[2 * i] = kDigits[byte >> 4];
    out[2 * i + 1] = kDigits[byte & 0xfu];
  }
  return out;
}

// The digest algorithm is fetched once and the context reused: per-block EVP set-up would cost
// more than hashing a 16-token block.
struct BlockHasher::Impl {
  EVP_MD* md = nullptr;
  EVP_MD_CTX* ctx = nullptr;

  ~Impl() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
  void begin() {
    if (EVP_DigestInit_ex2(ctx, md, nullptr) != 1)
      throw std::runtime_error("EVP_DigestInit failed");
  }
  void update(const void* data, size_t n) {
    if (n != 0) EVP_DigestUpdate(ctx, data, n);
  }
  void update_u32(uint32_t v) { update(&v, sizeof v); }
  void update_field(std::string_view s) {
    update_u32(static_cast<uint32_t>(s.size()));
    update(s.data(), s.size());
  }
  BlockHash finish() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, digest.data(), &len);
    return BlockHash{load_le64(digest.data()), load_le64(digest.data() + 8)};
  }
};

BlockHasher::BlockHasher(HashAlgorithm algorithm)
    : algorithm_(algorithm), impl_(std::make_unique<Impl>()) {
  impl_->md = EVP_MD_fetch(nullptr, openssl_name(algorithm), nullptr);
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->md == nullptr || impl_->ctx == nullptr) {
    throw std::runtime_error(std::string("OpenSSL does not provide digest ") +
                             openssl_name(algorithm));
  }
}

BlockHasher::~BlockHasher() = default;
BlockHasher::BlockHasher(BlockHasher&&) noexcept = default;
BlockHasher& BlockHasher::operator=(BlockHasher&&) noexcept = default;

BlockHash BlockHasher::root(const ModelIdentity& id) {
  impl_->begin();
  impl_->update("R", 1);
  impl_->update_field(id.model_id);
  impl_->update_u32(id.geometry.layers);
  impl_->update_u32(id.geometry.kv_heads);
  impl_->update_u32(id.geometry.head_dim);
  impl_->update_u32(id.geometry.tokens_per_page);
  impl_->update_u32(static_cast<uint32_t>(id.geometry.dtype));
  impl_->update_field(id.adapter_id);
  impl_->update_field(id.salt);
  // A windowed kind's pages hold other contents than a full one's for the same tokens (a
  // worker may let tokens out of its window go), so it roots its own chains. Appended only
  // for those kinds, so full-attention roots are the ones they always were.
  if (id.geometry.kind != AttentionKind::full) {
    impl_->update_u32(static_cast<uint32_t>(id.geometry.kind));
    impl_->update_u32(id.geometry.window);
  }
  return impl_->finish();
}

BlockHash BlockHasher::block(const BlockHash& parent, std::span<const uint32_t> tokens,
                             std::span<const std::byte> extra) {
  // 'B' ‖ parent ‖ n ‖ tokens ‖ |extra| ‖ extra. Small blocks are assembled into one buffer and
  // fed in a single update: each EVP update call costs about as much as hashing 16 bytes.
  const auto n = static_cast<uint32_t>(tokens.size());
  const auto x = static_cast<uint32_t>(extra.size());
  constexpr size_t kHeader = 1 + 16 + 4;
  const size_t total = kHeader + tokens.size_bytes() + 4 + extra.size();
  std::array<unsigned char, 1024> buf;
  unsigned char* header = buf.data();
  header[0] = 'B';
  std::memcpy(header + 1, &parent.lo, 8);
  std::memcpy(header + 9, &parent.hi, 8);
  std::memcpy(header + 17, &n, 4);
  impl_->begin();
  if (total <= buf.size()) {
    unsigned char* p = buf.data() + kHeader;
    if (n != 0) std::memcpy(p, tokens.data(), tokens.size_bytes());
    p += tokens.size_bytes();
    std::memcpy(p, &x, 4);
    if (x != 0) std::memcpy(p + 4, extra.data(), extra.size());
    impl_->update(buf.data(), total);
  } else {
    impl_->update(header, kHeader);
    impl_->update(tokens.data(), tokens.size_bytes());
    impl_->update_u32(x);
    impl_->update(extra.data(), extra.size());
  }
  return impl_->finish();
}

HashScheme BlockHasher::scheme() {
  // docs/BLOCK_HASH.md's root 1 and its block 0: the first vector every implementation checks.
  Geometry g;
  g.layers = 32;
  g.kv_heads = 8;
  g.head_dim = 128;
  g.tokens_per_page = 16;
  g.dtype = KvDtype::bf16;
  const BlockHash r = root(ModelIdentity{"llama-3.1-8b", g, "", ""});
  std::array<uint32_t, 16> tokens{};
  for (uint32_t i = 0; i < tokens.size(); ++i)
    tokens[i] = i;
  return HashScheme{scheme_name(), block(r, tokens)};
}

std::string BlockHasher::scheme_name() const {
  return "kvpool-" + std::string(hash_algorithm_name(algorithm_)) + "/1";
}

const HashScheme& default_hash_scheme() {
  static const HashScheme scheme = BlockHasher().scheme();
  return scheme;
}

size_t BlockHasher::chain(const BlockHash& root, std::span<const uint32_t> tokens,
                          uint32_t tokens_per_block, std::span<BlockHash> out) {
  if (tokens_per_block == 0) return 0;
  size_t n = tokens.size() / tokens_per_block;
  if (n > out.size()) n = out.size();
  BlockHash parent = root;
  for (size_t i = 0; i < n; ++i) {
    parent = block(parent, tokens.subspan(i * tokens_per_block, tokens_per_block));
    out[i] = parent;
  }
  return n;
}

}  // namespace kvpool

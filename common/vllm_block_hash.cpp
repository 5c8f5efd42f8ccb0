#include "common/vllm_block_hash.h"

#include <openssl/evp.h>

#include <algorithm>
#include <stdexcept>

namespace kvpool {

CborWriter& CborWriter::head(uint8_t major, uint64_t v) {
  const auto initial = [&](uint8_t low) {
    out_.push_back(static_cast<std::byte>((major << 5) | low));
  };
  const auto be = [&](int bytes) {
    for (int i = bytes - 1; i >= 0; --i)
      out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xffu));
  };
  if (v < 24) {
    initial(static_cast<uint8_t>(v));
  } else if (v <= 0xff) {
    initial(24);
    be(1);
  } else if (v <= 0xffff) {
    initial(25);
    be(2);
  } else if (v <= 0xffffffffu) {
    initial(26);
    be(4);
  } else {
    initial(27);
    be(8);
  }
  return *this;
}

CborWriter& CborWriter::integer(int64_t v) {
  // A negative n is major type 1 with argument −1 − n.
  return v >= 0 ? head(0, static_cast<uint64_t>(v)) : head(1, ~static_cast<uint64_t>(v));
}

CborWriter& CborWriter::bytes(std::span<const uint8_t> b) {
  head(2, b.size());
  for (const uint8_t c : b)
    out_.push_back(static_cast<std::byte>(c));
  return *this;
}

CborWriter& CborWriter::text(std::string_view s) {
  head(3, s.size());
  for (const char c : s)
    out_.push_back(static_cast<std::byte>(c));
  return *this;
}

CborWriter& CborWriter::null() {
  out_.push_back(std::byte{0xf6});
  return *this;
}

CborWriter& CborWriter::encoded_item(std::span<const std::byte> item) {
  out_.insert(out_.end(), item.begin(), item.end());
  return *this;
}

struct VllmBlockHasher::Impl {
  EVP_MD* md = nullptr;
  EVP_MD_CTX* ctx = nullptr;
  ~Impl() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
  VllmDigest digest(std::span<const std::byte> message) {
    VllmDigest d{};
    unsigned int n = 0;
    if (EVP_DigestInit_ex2(ctx, md, nullptr) != 1 ||
        EVP_DigestUpdate(ctx, message.data(), message.size()) != 1 ||
        EVP_DigestFinal_ex(ctx, d.data(), &n) != 1 || n != d.size()) {
      throw std::runtime_error("SHA-256 failed in OpenSSL");
    }
    return d;
  }
};

VllmBlockHasher::VllmBlockHasher(std::string_view seed) : impl_(std::make_unique<Impl>()) {
  impl_->md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->md == nullptr || impl_->ctx == nullptr) {
    throw std::runtime_error("OpenSSL provides no SHA-256 for vLLM's block hash");
  }
  message_.text(seed);
  none_ = impl_->digest(message_.encoded());
}

VllmBlockHasher::~VllmBlockHasher() = default;

VllmDigest VllmBlockHasher::block(const VllmDigest* parent, std::span<const uint32_t> tokens,
                                  std::span<const std::byte> extra_keys) {
  message_.clear();
  message_.array(3).bytes(parent != nullptr ? *parent : none_).array(tokens.size());
  for (const uint32_t t : tokens)
    message_.uint(t);
  if (extra_keys.empty()) {
    message_.null();
  } else {
    message_.encoded_item(extra_keys);
  }
  return impl_->digest(message_.encoded());
}

size_t VllmBlockHasher::chain(std::span<const uint32_t> tokens, uint32_t tokens_per_block,
                              std::span<VllmDigest> out, std::span<const std::byte> extra_keys) {
  if (tokens_per_block == 0) return 0;
  const size_t n = std::min(out.size(), tokens.size() / tokens_per_block);
  for (size_t i = 0; i < n; ++i) {
    out[i] = block(i == 0 ? nullptr : &out[i - 1],
                   tokens.subspan(i * tokens_per_block, tokens_per_block), extra_keys);
  }
  return n;
}

BlockHash VllmBlockHasher::key(const VllmDigest& d) {
  const auto be64 = [&](size_t at) {
    uint64_t v = 0;
    for (size_t i = 0; i < 8; ++i)
      v = (v << 8) | d[at + i];
    return v;
  };
  return BlockHash{be64(24), be64(16)};
}

const HashScheme& VllmBlockHasher::scheme() {
  static const HashScheme s = [] {
    VllmBlockHasher h("0");
    std::array<uint32_t, 16> tokens{};
    for (uint32_t i = 0; i < tokens.size(); ++i)
      tokens[i] = i;
    return HashScheme{"vllm-sha256-cbor/1", key(h.block(nullptr, tokens))};
  }();
  return s;
}

}  // namespace kvpool

// vLLM's block hash (common/vllm_block_hash.h) against tests/data/vllm_block_hash_vectors.json,
// computed with cbor2 and hashlib (vLLM's own sha256_cbor), not with this code: NONE_HASH of two
// seeds, a first and a chained block, every integer width, extra keys (the LoRA name; nested
// tuples, bytes and negative integers), and the pool key whose low word is vLLM's integer hash.
#include "common/vllm_block_hash.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

std::string hex(std::span<const uint8_t> b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const uint8_t c : b) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::string hex(std::span<const std::byte> b) {
  return hex(std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
}

std::vector<std::byte> unhex(const std::string& s) {
  std::vector<std::byte> out;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    out.push_back(static_cast<std::byte>(std::stoul(s.substr(i, 2), nullptr, 16)));
  return out;
}

nlohmann::json vectors() {
  std::ifstream in(std::string(KVPOOL_TEST_DATA) + "/vllm_block_hash_vectors.json");
  EXPECT_TRUE(in) << "tests/data/vllm_block_hash_vectors.json";
  return nlohmann::json::parse(in);
}

TEST(VllmBlockHash, NoneHashIsTheSha256OfTheSeedAsCborText) {
  const nlohmann::json v = vectors();
  ASSERT_EQ(v["none"].size(), 2u);
  for (const auto& n : v["none"]) {
    VllmBlockHasher h(n["seed"].get<std::string>());
    EXPECT_EQ(hex(h.none_hash()), n["digest"].get<std::string>()) << n["seed"];
  }
}

TEST(VllmBlockHash, TheVectorsOfCbor2AndHashlibHold) {
  const nlohmann::json v = vectors();
  ASSERT_EQ(v["blocks"].size(), 5u);
  for (const auto& b : v["blocks"]) {
    const std::string name = b["name"];
    VllmBlockHasher h(b["seed"].get<std::string>());
    const std::vector<uint32_t> tokens = b["tokens"].get<std::vector<uint32_t>>();
    const std::vector<std::byte> extra = unhex(b["extra_keys"].get<std::string>());
    VllmDigest parent{};
    const std::string parent_hex = b["parent"];
    if (parent_hex != "none") {
      const std::vector<std::byte> p = unhex(parent_hex);
      ASSERT_EQ(p.size(), parent.size()) << name;
      for (size_t i = 0; i < p.size(); ++i)
        parent[i] = static_cast<uint8_t>(p[i]);
    }
    const VllmDigest d = h.block(parent_hex == "none" ? nullptr : &parent, tokens, extra);
    EXPECT_EQ(hex(d), b["digest"].get<std::string>()) << name;
    // The key's low word is what vLLM's events send with integer hashes.
    EXPECT_EQ(VllmBlockHasher::key(d).lo, b["vllm_int_hash"].get<uint64_t>()) << name;
  }
}

TEST(VllmBlockHash, CborWriterWritesTheDeterministicFormCbor2Does) {
  // ("abc", (b"\x01\x02", 7), -3, -1000) as cbor2.dumps(..., canonical=True) writes it.
  CborWriter w;
  const uint8_t two[] = {1, 2};
  w.array(4).text("abc").array(2).bytes(two).uint(7).integer(-3).integer(-1000);
  EXPECT_EQ(hex(w.encoded()), "84636162638242010207223903e7");
  // Every head width: 23 | 24 | 255 | 256 | 65535 | 65536 | 2^32 − 1 | 2^32, and null.
  w.clear();
  for (const uint64_t x :
       {23ull, 24ull, 255ull, 256ull, 65535ull, 65536ull, 4294967295ull, 4294967296ull})
    w.uint(x);
  w.null();
  EXPECT_EQ(hex(w.encoded()),
            "17"
            "1818"
            "18ff"
            "190100"
            "19ffff"
            "1a00010000"
            "1affffffff"
            "1b0000000100000000"
            "f6");
}

TEST(VllmBlockHash, AChainIsBlocksChainedFromNoneHash) {
  VllmBlockHasher h("0");
  std::vector<uint32_t> tokens(40);
  for (uint32_t i = 0; i < tokens.size(); ++i)
    tokens[i] = i;
  std::vector<VllmDigest> chain(5);
  // 40 tokens of 16: two full blocks; the partial third is never hashed.
  ASSERT_EQ(h.chain(tokens, 16, chain), 2u);
  const VllmDigest b0 = h.block(nullptr, std::span(tokens).first(16));
  EXPECT_EQ(chain[0], b0);
  EXPECT_EQ(chain[1], h.block(&b0, std::span(tokens).subspan(16, 16)));
  const nlohmann::json v = vectors();
  EXPECT_EQ(hex(chain[0]), v["blocks"][0]["digest"].get<std::string>());
  EXPECT_EQ(hex(chain[1]), v["blocks"][4]["digest"].get<std::string>());
}

TEST(VllmBlockHash, TheSchemeIsNamedAndCheckedByItsFirstVector) {
  const HashScheme& s = VllmBlockHasher::scheme();
  EXPECT_EQ(s.name, "vllm-sha256-cbor/1");
  VllmBlockHasher h("0");
  std::vector<uint32_t> tokens(16);
  for (uint32_t i = 0; i < tokens.size(); ++i)
    tokens[i] = i;
  EXPECT_EQ(s.check, VllmBlockHasher::key(h.block(nullptr, tokens)));
  EXPECT_NE(s.name, default_hash_scheme().name);
}

}  // namespace
}  // namespace kvpool

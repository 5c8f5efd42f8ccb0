#include "common/block_hash.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kvpool {
namespace {

const Geometry kGeom{32, 8, 128, 16, KvDtype::bf16};

// The block encoding of block_hash.h, built independently: 'B' ‖ parent ‖ n ‖ tokens ‖ |x| ‖ x.
BlockHash reference_block(const BlockHash& parent, const std::vector<uint32_t>& tokens,
                          const std::vector<std::byte>& extra = {}) {
  std::vector<unsigned char> msg;
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    msg.insert(msg.end(), b, b + n);
  };
  msg.push_back('B');
  put(&parent.lo, 8);
  put(&parent.hi, 8);
  const auto n = static_cast<uint32_t>(tokens.size());
  put(&n, 4);
  put(tokens.data(), tokens.size() * 4);
  const auto x = static_cast<uint32_t>(extra.size());
  put(&x, 4);
  put(extra.data(), extra.size());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(msg.data(), msg.size(), digest, &len, EVP_sha256(), nullptr), 1);
  BlockHash h;
  std::memcpy(&h.lo, digest, 8);
  std::memcpy(&h.hi, digest + 8, 8);
  return h;
}

// The root encoding of block_hash.h for a full geometry, built independently: 'R' ‖ |model| ‖
// model ‖ layers ‖ kv_heads ‖ head_dim ‖ tokens_per_page ‖ dtype ‖ |adapter| ‖ |salt| (both empty).
BlockHash reference_root(const std::string& model, const Geometry& g) {
  std::vector<unsigned char> msg{'R'};
  auto put_u32 = [&](uint32_t v) {
    const auto* b = reinterpret_cast<const unsigned char*>(&v);
    msg.insert(msg.end(), b, b + 4);
  };
  put_u32(static_cast<uint32_t>(model.size()));
  msg.insert(msg.end(), model.begin(), model.end());
  for (uint32_t v : {g.layers, g.kv_heads, g.head_dim, g.tokens_per_page,
                     static_cast<uint32_t>(g.dtype), 0u, 0u})
    put_u32(v);
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(msg.data(), msg.size(), digest, &len, EVP_sha256(), nullptr), 1);
  BlockHash h;
  std::memcpy(&h.lo, digest, 8);
  std::memcpy(&h.hi, digest + 8, 8);
  return h;
}

std::vector<uint32_t> tokens(size_t n, uint32_t start = 1000) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(BlockHash, MatchesTheDocumentedEncodingOfSha256) {
  BlockHasher hasher;
  const BlockHash root = hasher.root({"llama-3-8b", kGeom, "", ""});
  const auto t = tokens(48);
  std::vector<BlockHash> chain(3);
  ASSERT_EQ(hasher.chain(root, t, 16, chain), 3u);
  BlockHash parent = root;
  for (size_t i = 0; i < 3; ++i) {
    const auto block = std::span(t).subspan(16 * i, 16);
    parent = reference_block(parent, std::vector<uint32_t>(block.begin(), block.end()));
    EXPECT_EQ(chain[i], parent) << "block " << i;
  }
  const std::vector<std::byte> extra{std::byte{1}, std::byte{2}};
  EXPECT_EQ(hasher.block(root, std::vector<uint32_t>(16, 7), extra),
            reference_block(root, std::vector<uint32_t>(16, 7), extra));
}

TEST(BlockHash, RootDependsOnEveryIdentityField) {
  BlockHasher hasher;
  const ModelIdentity base{"m", kGeom, "", ""};
  std::set<std::string> roots;
  roots.insert(to_hex(hasher.root(base)));
  roots.insert(to_hex(hasher.root({"m2", kGeom, "", ""})));
  roots.insert(to_hex(hasher.root({"m", {33, 8, 128, 16, KvDtype::bf16}, "", ""})));
  roots.insert(to_hex(hasher.root({"m", {32, 4, 128, 16, KvDtype::bf16}, "", ""})));
  roots.insert(to_hex(hasher.root({"m", {32, 8, 64, 16, KvDtype::bf16}, "", ""})));
  roots.insert(to_hex(hasher.root({"m", {32, 8, 128, 32, KvDtype::bf16}, "", ""})));
  roots.insert(to_hex(hasher.root({"m", {32, 8, 128, 16, KvDtype::fp8_e4m3}, "", ""})));
  roots.insert(to_hex(hasher.root({"m", kGeom, "lora-a", ""})));
  roots.insert(to_hex(hasher.root({"m", kGeom, "", "salt"})));
  // Length prefixes keep field boundaries: moving a byte between fields changes the root.
  roots.insert(to_hex(hasher.root({"m", kGeom, "ab", ""})));
  roots.insert(to_hex(hasher.root({"m", kGeom, "a", "b"})));
  EXPECT_EQ(roots.size(), 11u);
  EXPECT_EQ(hasher.root(base), BlockHasher().root(base));  // deterministic across instances
}

TEST(BlockHash, RootNamesTheAttentionKindAndWindow) {
  BlockHasher hasher;
  std::set<std::string> roots;
  for (auto [kind, window] :
       {std::pair{AttentionKind::full, 0u}, std::pair{AttentionKind::sliding, 4096u},
        std::pair{AttentionKind::sliding, 1024u}, std::pair{AttentionKind::chunked, 4096u}}) {
    Geometry g = kGeom;
    g.kind = kind;
    g.window = window;
    roots.insert(to_hex(hasher.root({"m", g, "", ""})));
  }
  EXPECT_EQ(roots.size(), 4u);
  // A full geometry's root is the one it always was: nothing of the kind goes into it.
  EXPECT_EQ(hasher.root({"m", kGeom, "", ""}), reference_root("m", kGeom));
}

TEST(BlockHash, ChangingOneTokenChangesThatBlockAndEveryLaterOne) {
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", kGeom, "", ""});
  auto a = tokens(64);
  auto b = a;
  b[20] ^= 1;  // inside block 1
  std::vector<BlockHash> ha(4), hb(4);
  hasher.chain(root, a, 16, ha);
  hasher.chain(root, b, 16, hb);
  EXPECT_EQ(ha[0], hb[0]);
  for (size_t i = 1; i < 4; ++i)
    EXPECT_NE(ha[i], hb[i]) << "block " << i;
}

TEST(BlockHash, SameTokensUnderDifferentRootsNeverMatch) {
  BlockHasher hasher;
  const auto t = tokens(16);
  EXPECT_NE(hasher.block(hasher.root({"m", kGeom, "", ""}), t),
            hasher.block(hasher.root({"m", kGeom, "", "tenant-b"}), t));
}

TEST(BlockHash, PartialTrailingBlockIsNotHashed) {
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", kGeom, "", ""});
  std::vector<BlockHash> out(8);
  EXPECT_EQ(hasher.chain(root, tokens(47), 16, out), 2u);
  EXPECT_EQ(hasher.chain(root, tokens(15), 16, out), 0u);
  EXPECT_EQ(hasher.chain(root, tokens(64), 16, std::span<BlockHash>(out).first(3)), 3u);
  EXPECT_EQ(hasher.chain(root, tokens(64), 0, out), 0u);
}

TEST(BlockHash, ExtraKeysAndBlockLengthAreBound) {
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", kGeom, "", ""});
  const auto t = tokens(16);
  const std::vector<std::byte> img{std::byte{0xab}};
  EXPECT_NE(hasher.block(root, t), hasher.block(root, t, img));
  // 16 tokens with no extra vs 15 tokens whose 16th token's bytes pose as extra keys.
  std::vector<std::byte> fake(4);
  std::memcpy(fake.data(), &t[15], 4);
  EXPECT_NE(hasher.block(root, t), hasher.block(root, std::span(t).first(15), fake));
}

TEST(BlockHash, EveryAlgorithmWorksAndTheyDiffer) {
  std::set<std::string> seen;
  for (HashAlgorithm a : {HashAlgorithm::sha256, HashAlgorithm::sha512_256,
                          HashAlgorithm::blake2s256, HashAlgorithm::blake2b512}) {
    BlockHasher hasher(a);
    EXPECT_EQ(hasher.algorithm(), a);
    const BlockHash h = hasher.block(BlockHash{}, tokens(16));
    EXPECT_NE(h, BlockHash{}) << hash_algorithm_name(a);
    seen.insert(to_hex(h));
  }
  EXPECT_EQ(seen.size(), 4u);
}

// The scheme hello carries: the algorithm's name and its hash of docs/BLOCK_HASH.md's first
// block vector (block 0 of tokens 0..15 under root 1), whose SHA-256 value the page prints.
TEST(BlockHash, TheSchemeNamesTheAlgorithmAndChecksTheFirstBlockVector) {
  const HashScheme& ours = default_hash_scheme();
  EXPECT_EQ(ours.name, "kvpool-sha256/1");
  EXPECT_EQ(to_hex(ours.check), "2177765eb5319c61ee270a6eb3074e5d");
  BlockHasher blake(HashAlgorithm::blake2s256);
  const HashScheme other = blake.scheme();
  EXPECT_EQ(other.name, "kvpool-blake2s256/1");
  EXPECT_NE(other.check, ours.check);
  EXPECT_EQ(BlockHasher().scheme(), ours);
}

TEST(BlockHash, HexIsLittleEndianBytes) {
  EXPECT_EQ(to_hex(BlockHash{0x0123456789abcdefull, 0x1ull}),
            "efcdab8967452301"
            "0100000000000000");
}

// The test vectors of docs/BLOCK_HASH.md (tests/data/block_hash_vectors.json, computed from the
// spec with Python's hashlib, not with this code): roots of every attention kind, with and
// without adapter and salt, a chain, extra keys and the largest token id.
TEST(BlockHashSpec, TheDocumentedVectorsHold) {
  std::ifstream in(std::string(KVPOOL_TEST_DATA) + "/block_hash_vectors.json");
  ASSERT_TRUE(in) << "tests/data/block_hash_vectors.json";
  const nlohmann::json v = nlohmann::json::parse(in);
  BlockHasher hasher;
  ASSERT_EQ(v["roots"].size(), 5u);
  for (const auto& r : v["roots"]) {
    Geometry g{r["layers"].get<uint32_t>(), r["kv_heads"].get<uint32_t>(),
               r["head_dim"].get<uint32_t>(), r["tokens_per_page"].get<uint32_t>(),
               *parse_dtype(r["dtype"].get<std::string>())};
    g.kind = *parse_attention_kind(r["kind"].get<std::string>());
    g.window = r["window"].get<uint32_t>();
    // ModelIdentity holds views: the strings live here.
    const std::string model = r["model"], adapter = r["adapter"], salt = r["salt"];
    const ModelIdentity id{model, g, adapter, salt};
    EXPECT_EQ(to_hex(hasher.root(id)), r["hash"].get<std::string>()) << id.model_id;
  }
  ASSERT_EQ(v["blocks"].size(), 5u);
  for (const auto& b : v["blocks"]) {
    const std::string parent_hex = b["parent"];
    BlockHash parent;
    for (size_t i = 0; i < 16; ++i) {
      const auto byte = static_cast<uint64_t>(std::stoul(parent_hex.substr(2 * i, 2), nullptr, 16));
      (i < 8 ? parent.lo : parent.hi) |= byte << (8 * (i % 8));
    }
    const std::vector<uint32_t> tokens = b["tokens"].get<std::vector<uint32_t>>();
    const std::string extra_hex = b["extra"];
    std::vector<std::byte> extra;
    for (size_t i = 0; i < extra_hex.size(); i += 2)
      extra.push_back(static_cast<std::byte>(std::stoul(extra_hex.substr(i, 2), nullptr, 16)));
    EXPECT_EQ(to_hex(hasher.block(parent, tokens, extra)), b["hash"].get<std::string>());
  }
}

}  // namespace
}  // namespace kvpool

// The remote tier's pieces that need no cluster: Redis Cluster key slots (CRC16/XMODEM and hash
// tags, as the cluster specification gives them), node addresses, the page values' header and
// checksum, and the config's remote_tier keys.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/config/node_address.h"
#include "daemon/remote/key_slot.h"
#include "daemon/remote/remote_value.h"

namespace kvpool::daemon {
namespace {

using remote::check_value;
using remote::key_slot;
using remote::ValueFault;

TEST(KeySlot, MatchesTheClusterSpecification) {
  // CRC16/XMODEM's check value, and slots the specification and CLUSTER KEYSLOT give.
  EXPECT_EQ(remote::crc16("123456789"), 0x31C3);
  EXPECT_EQ(key_slot("foo"), 12182);
  EXPECT_EQ(key_slot("bar"), 5061);
  EXPECT_EQ(key_slot(""), 0);
  // A hash tag: only what is inside the first {...} counts, when it is not empty.
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(key_slot("foo{}{bar}"), remote::crc16("foo{}{bar}") % remote::kClusterSlots);
  EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
  EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
}

TEST(KeySlot, SpreadsKeysOverTheSlots) {
  std::vector<int> per_third(3, 0);
  for (int i = 0; i < 3000; ++i)
    ++per_third[size_t{key_slot("kvpool:t:" + std::to_string(i))} * 3 / remote::kClusterSlots];
  for (const int n : per_third) {
    EXPECT_GT(n, 850);
    EXPECT_LT(n, 1150);
  }
}

TEST(NodeAddress, ParsesHostsAndPorts) {
  auto a = parse_node_address("127.0.0.1:7000");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7000);
  EXPECT_EQ(a->text(), "127.0.0.1:7000");
  auto v6 = parse_node_address("[::1]:6379");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "::1");
  auto name = parse_node_address("redis-0.cache.svc:6379");
  ASSERT_TRUE(name);
  EXPECT_EQ(name->host, "redis-0.cache.svc");
  for (const char* bad :
       {"", "7000", ":7000", "host:", "host:0", "host:65536", "host:7x", "[::1:7", "[]:7000"}) {
    EXPECT_FALSE(parse_node_address(bad)) << bad;
  }
}

class RemoteValue : public ::testing::Test {
 protected:
  Geometry g{2, 2, 64, 16, KvDtype::bf16};
  uint64_t fp = remote::remote_fingerprint(g, KvLayout::page_major, "kvpool-sha256/1");
  BlockHash hash{0x1234, 0x5678};
  std::vector<std::byte> value = make(64 * 1024);

  std::vector<std::byte> make(size_t payload) {
    std::vector<std::byte> v(remote::kValueHeaderBytes + payload);
    for (size_t i = remote::kValueHeaderBytes; i < v.size(); ++i)
      v[i] = static_cast<std::byte>(i * 31 + 7);
    remote::write_value_header(v, fp, g, KvLayout::page_major, hash);
    return v;
  }
  ValueFault check(const std::vector<std::byte>& v) const {
    return check_value(v, fp, 64 * 1024, hash);
  }
};

TEST_F(RemoteValue, ARoundTripChecks) {
  EXPECT_EQ(check(value), ValueFault::none);
  EXPECT_EQ(std::memcmp(value.data(), "KVPR", 4), 0);
}

TEST_F(RemoteValue, AnyChangedPayloadByteFailsTheChecksum) {
  for (const size_t at : {size_t{0}, size_t{1}, size_t{4095}, size_t{64 * 1024 - 1}}) {
    auto v = value;
    v[remote::kValueHeaderBytes + at] ^= std::byte{0x01};
    EXPECT_EQ(check(v), ValueFault::checksum) << at;
  }
}

TEST_F(RemoteValue, OtherGeometriesBlocksAndShapesAreRefused) {
  // Every field of the fingerprint matters.
  const std::string scheme = "kvpool-sha256/1";
  for (const Geometry& other :
       {Geometry{3, 2, 64, 16, KvDtype::bf16}, Geometry{2, 1, 64, 16, KvDtype::bf16},
        Geometry{2, 2, 128, 16, KvDtype::bf16}, Geometry{2, 2, 64, 32, KvDtype::bf16},
        Geometry{2, 2, 64, 16, KvDtype::fp16},
        Geometry{2, 2, 64, 16, KvDtype::bf16, AttentionKind::sliding, 64}}) {
    EXPECT_NE(remote::remote_fingerprint(other, KvLayout::page_major, scheme), fp);
  }
  EXPECT_NE(remote::remote_fingerprint(g, KvLayout::layer_major, scheme), fp);
  EXPECT_NE(remote::remote_fingerprint(g, KvLayout::page_major, "vllm-sha256-cbor/1"), fp);
  EXPECT_EQ(check_value(value, fp + 1, 64 * 1024, hash), ValueFault::geometry);
  EXPECT_EQ(check_value(value, fp, 64 * 1024, BlockHash{0x1234, 0x5679}), ValueFault::block);
  EXPECT_EQ(check_value(value, fp, 32 * 1024, hash), ValueFault::malformed);
  auto short_value = value;
  short_value.pop_back();
  EXPECT_EQ(check(short_value), ValueFault::malformed);
  EXPECT_EQ(check(std::vector<std::byte>(10)), ValueFault::malformed);
  auto other_version = value;
  other_version[4] = std::byte{2};
  EXPECT_EQ(check(other_version), ValueFault::malformed);
}

// The config -------------------------------------------------------------------------------

std::string pool_with(const std::string& remote) {
  return "backend: host\npools:\n  - name: a\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
         "tokens_per_page: 16, dtype: fp16}\n    remote_tier: " +
         remote + "\n";
}

TEST(RemoteTierConfig, DefaultsAndValues) {
  auto c = parse_config(pool_with("{cluster: [\"127.0.0.1:7000\", \"r1:7001\"]}"), "k.yaml");
  ASSERT_TRUE(c.ok()) << c.error().message;
  const auto& r = c.value().pools[0].remote_tier;
  ASSERT_TRUE(r);
  EXPECT_EQ(r->cluster, (std::vector<std::string>{"127.0.0.1:7000", "r1:7001"}));
  EXPECT_EQ(r->key_namespace, "kvpool");
  EXPECT_EQ(r->ttl_s, 86400u);
  EXPECT_EQ(r->write, RemoteTierConfig::Write::on_publish);
  EXPECT_EQ(r->admit, RemoteTierConfig::Admit::all);
  EXPECT_EQ(r->batch_pages, 32u);
  auto d = parse_config(pool_with("{cluster: [\"h:1\"], namespace: fleet, ttl_s: 0, write: off, "
                                  "admit: reused, timeout_ms: 5, batch_pages: 8, "
                                  "staging_pages: 16}"),
                        "k.yaml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  const auto& e = *d.value().pools[0].remote_tier;
  EXPECT_EQ(e.key_namespace, "fleet");
  EXPECT_EQ(e.ttl_s, 0u);
  EXPECT_EQ(e.write, RemoteTierConfig::Write::off);
  EXPECT_EQ(e.admit, RemoteTierConfig::Admit::reused);
  EXPECT_EQ(e.timeout_ms, 5u);
  EXPECT_EQ(e.staging_pages, 16u);
  auto demote = parse_config(pool_with("{cluster: [\"h:1\"], write: on_demote}"), "k.yaml");
  ASSERT_TRUE(demote.ok()) << demote.error().message;
  EXPECT_EQ(demote.value().pools[0].remote_tier->write, RemoteTierConfig::Write::on_demote);
}

TEST(RemoteTierConfig, BadValuesAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{namespace: x}", "pools[0].remote_tier: missing required key \"cluster\""},
      {"{cluster: []}", "at least one node"},
      {"{cluster: [\"nohost\"]}", "is not HOST:PORT"},
      {"{cluster: [\"h:99999\"]}", "is not HOST:PORT"},
      {"{cluster: [\"h:1\"], namespace: \"a:b\"}", "pools[0].remote_tier.namespace"},
      {"{cluster: [\"h:1\"], namespace: \"\"}", "pools[0].remote_tier.namespace"},
      {"{cluster: [\"h:1\"], write: always}", "pools[0].remote_tier.write"},
      {"{cluster: [\"h:1\"], admit: some}", "pools[0].remote_tier.admit"},
      {"{cluster: [\"h:1\"], timeout_ms: 0}", "pools[0].remote_tier.timeout_ms"},
      {"{cluster: [\"h:1\"], batch_pages: 64, staging_pages: 32}", "exceeds staging_pages"},
      {"{cluster: [\"h:1\"], colour: red}", "colour"},
  };
  for (const auto& [yaml, want] : bad) {
    auto c = parse_config(pool_with(yaml), "k.yaml");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_NE(c.error().message.find(want), std::string::npos) << yaml << ": " << c.error().message;
  }
}

// A hybrid model's groups each get the model's remote tier; on_demote does not suit one (a full
// group's eviction makes the others drop their blocks uncopied).
TEST(RemoteTierConfig, GroupsTakeItWrittenOnPublishOnly) {
  const auto model = [](const std::string& write) {
    return parse_config(
        "backend: host\npools:\n  - name: m\n    capacity: 1MiB\n    segment_size: 64KiB\n    "
        "geometry: {layers: 2, "
        "kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n    remote_tier: {cluster: "
        "[\"h:1\"], write: " +
            write +
            "}\n    groups:\n      - {name: g, layers: 1, kind: sliding, window: 64}\n"
            "      - {name: h}\n",
        "k.yaml");
  };
  auto ok = model("on_publish");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  ASSERT_EQ(ok.value().pools.size(), 2u);
  for (const PoolConfig& p : ok.value().pools) {
    ASSERT_TRUE(p.remote_tier.has_value()) << p.name;
    EXPECT_EQ(p.remote_tier->cluster, std::vector<std::string>{"h:1"});
  }
  auto demote = model("on_demote");
  ASSERT_FALSE(demote.ok());
  EXPECT_NE(demote.error().message.find("pools[0].remote_tier"), std::string::npos)
      << demote.error().message;
  EXPECT_NE(demote.error().message.find("on_publish"), std::string::npos) << demote.error().message;
}

// A sliding group's window is fetched in one batch: batch_pages left at its default rises to
// the blocks two windows span (2 × (window 1024 / 16 tokens + 1) = 130); given smaller than one
// window's 65, it is refused; given at least that, it is kept.
TEST(RemoteTierConfig, AGroupsWindowFitsOneBatch) {
  const auto model = [](const std::string& extra) {
    return parse_config(
        "backend: host\npools:\n  - name: m\n    capacity: 8MiB\n    segment_size: 64KiB\n"
        "    geometry: {layers: 2, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n"
        "    remote_tier: {cluster: [\"h:1\"]" +
            extra +
            "}\n    groups:\n      - {name: local, layers: 1, kind: sliding, window: 1024}\n"
            "      - {name: global}\n",
        "k.yaml");
  };
  auto raised = model("");
  ASSERT_TRUE(raised.ok()) << raised.error().message;
  for (const PoolConfig& p : raised.value().pools) {
    EXPECT_EQ(p.remote_tier->batch_pages, 130u) << p.name;
    EXPECT_GE(p.remote_tier->staging_pages, 130u) << p.name;
  }
  auto kept = model(", batch_pages: 80");
  ASSERT_TRUE(kept.ok()) << kept.error().message;
  EXPECT_EQ(kept.value().pools[0].remote_tier->batch_pages, 80u);
  auto small = model(", batch_pages: 32");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message.find("pools[0].remote_tier.batch_pages"), std::string::npos)
      << small.error().message;
  EXPECT_NE(small.error().message.find("\"local\""), std::string::npos) << small.error().message;
  EXPECT_NE(small.error().message.find("65"), std::string::npos) << small.error().message;
}

TEST(RemoteTierConfig, NotWithConversions) {
  auto convert = parse_config(
      "backend: host\npools:\n  - name: a\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
      "tokens_per_page: 16, dtype: bf16}\n    convert_evictions_to: b\n    remote_tier: "
      "{cluster: [\"h:1\"]}\n  - name: b\n    geometry: {layers: 1, kv_heads: 1, head_dim: 8, "
      "tokens_per_page: 16, dtype: fp8_e4m3}\n",
      "k.yaml");
  ASSERT_FALSE(convert.ok());
  EXPECT_NE(convert.error().message.find("convert_evictions_to"), std::string::npos)
      << convert.error().message;
}

}  // namespace
}  // namespace kvpool::daemon

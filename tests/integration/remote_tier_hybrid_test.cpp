// Integration: the remote tier of a hybrid model (pools[].groups with pools[].remote_tier), with
// a real Redis Cluster and two real kvpoold processes. Every group pool writes its own blocks
// under its group's name; a lookup_groups on the other daemon fetches what each group needs (a
// sliding group only its window), copies it up and answers tier kTierRemote, bytes equal. A
// block a group's window needs that the cluster lost shortens the hit to what every group can
// serve, one before it costs nothing; a group that holds its part locally asks nothing. Label
// `remote`.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "client/connection/model_connection.h"
#include "common/block_hash.h"
#include "kernels/pool_view.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/redis_cluster.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::ModelConnection;
using Clock = std::chrono::steady_clock;

constexpr size_t kLocal = 0;
constexpr size_t kGlobal = 1;
constexpr uint32_t kBlocks = 8;  // a 128-token prompt
// The next query, at 128, sees keys 65..128 in the local group (window 64): blocks 4..7.
constexpr uint32_t kWindowFirst = 4;

// local: 2 layers, sliding window 64; global: 4 layers. Remote tier under namespace `ns`.
std::string model_config(const RedisCluster& cluster, const std::string& ns) {
  return "backend: host\npools:\n  - name: m\n    capacity: 4MiB\n    segment_size: 256KiB\n"
         "    geometry: {layers: 4, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n"
         "    remote_tier: {cluster: " +
         cluster.seeds() + ", namespace: " + ns +
         ", timeout_ms: 500}\n"
         "    groups:\n"
         "      - {name: local, layers: 2, kind: sliding, window: 64}\n"
         "      - {name: global}\n";
}

BlockHash block(uint32_t i) {
  return BlockHash{0x4859'0000 + i, 11};
}

std::vector<BlockHash> chain() {
  std::vector<BlockHash> out;
  for (uint32_t i = 0; i < kBlocks; ++i)
    out.push_back(block(i));
  return out;
}

uint8_t tag(size_t group, uint32_t i) {
  return static_cast<uint8_t>(0x20 + group * 16 + i);
}

template <typename Fn>
void for_each_run(const Connection& c, PageId p, Fn&& fn) {
  const kernels::PageChunks ch = kernels::page_chunks(kernels::paged_kv_of(c.pool(), c.base()));
  for (uint32_t k = 0; k < ch.chunks; ++k)
    fn(c.base() + ch.at(p) + uint64_t{k} * ch.chunk, ch.chunk_bytes);
}

// How many of page p's bytes are not v.
uint64_t wrong_bytes(const Connection& c, PageId p, uint8_t v) {
  uint64_t wrong = 0;
  for_each_run(c, p, [&](const std::byte* run, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i)
      wrong += run[i] != std::byte{v};
  });
  return wrong;
}

// Publishes every block of the chain in `group`, each page filled with its tag, and lets go.
std::string publish_all(Connection& c, size_t group) {
  auto pages = c.alloc(kBlocks);
  if (!pages.ok()) return "alloc: " + pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    const PageId p = pages.value()[i];
    for_each_run(c, p, [&](std::byte* run, uint64_t n) { std::memset(run, tag(group, i), n); });
    items.push_back({p, block(i)});
  }
  if (auto pub = c.publish(items); !pub.ok()) return "publish: " + pub.error().message;
  auto rel = c.release(pages.value());
  return rel.ok() ? "" : "release: " + rel.error().message;
}

class RemoteTierHybrid : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<RedisCluster>(cluster_base_port(0));
    ASSERT_TRUE(cluster_->started()) << cluster_->output();
  }
  // Waits (up to 10 s) until the cluster holds n keys that start with `prefix`.
  bool wait_keys(const std::string& prefix, size_t n) const {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (cluster_->keys(prefix).size() < n && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return cluster_->keys(prefix).size() >= n;
  }
  // Daemon A publishes the whole chain in both groups and the cluster holds it.
  void publish_on(Daemon& a, const std::string& ns) {
    auto m = ModelConnection::attach(a.socket(), "writer", "m");
    ASSERT_TRUE(m.ok()) << m.error().message;
    for (size_t g = 0; g < 2; ++g)
      ASSERT_EQ(publish_all(m.value()->group(g), g), "");
    ASSERT_TRUE(wait_keys(ns + ":default:local:", kBlocks)) << a.log();
    ASSERT_TRUE(wait_keys(ns + ":default:global:", kBlocks)) << a.log();
  }
  std::unique_ptr<RedisCluster> cluster_;
};

TEST_F(RemoteTierHybrid, EachGroupFetchesWhatTheHitNeedsFromAnotherDaemon) {
  Daemon a(model_config(*cluster_, "hyb"));
  Daemon b(model_config(*cluster_, "hyb"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  publish_on(a, "hyb");
  EXPECT_EQ(cluster_->keys("hyb:default:").size(), 2 * kBlocks);

  auto m = ModelConnection::attach(b.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::vector<BlockHash> c = chain();
  auto hit = m.value()->lookup(c);
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  const wire::LookupReply& local = hit.value().groups[kLocal];
  const wire::LookupReply& global = hit.value().groups[kGlobal];
  ASSERT_EQ(global.pages.size(), kBlocks) << b.log();
  ASSERT_EQ(local.pages.size(), kBlocks) << b.log();
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(global.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kGlobal), global.pages[i], tag(kGlobal, i)), 0u) << i;
    if (i < kWindowFirst) {  // before the window: not fetched, not held
      EXPECT_EQ(local.pages[i], kNoPage) << i;
      EXPECT_EQ(local.tiers[i], wire::kTierNone) << i;
      continue;
    }
    EXPECT_EQ(local.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kLocal), local.pages[i], tag(kLocal, i)), 0u) << i;
  }
  // The local group copied up its window's blocks only.
  const stats::PoolStats sl = pool_stats(m.value()->group(kLocal), kLocal);
  const stats::PoolStats sg = pool_stats(m.value()->group(kGlobal), kGlobal);
  EXPECT_EQ(sl.remote_hits, kBlocks - kWindowFirst);
  EXPECT_EQ(sg.remote_hits, kBlocks);
  for (size_t g = 0; g < 2; ++g) {
    std::vector<PageId> held;
    for (const PageId p : hit.value().groups[g].pages) {
      if (p != kNoPage) held.push_back(p);
    }
    ASSERT_TRUE(m.value()->group(g).release(held).ok());
  }
  // Promoted and published: the next lookup hits B's own device tier in both groups.
  auto again = m.value()->lookup(c);
  ASSERT_TRUE(again.ok()) << again.error().message;
  ASSERT_EQ(again.value().groups[kGlobal].pages.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(again.value().groups[kGlobal].tiers[i], wire::kTierDevice) << i;
    if (i >= kWindowFirst) {
      EXPECT_EQ(again.value().groups[kLocal].tiers[i], wire::kTierDevice) << i;
    }
  }
  EXPECT_EQ(pool_stats(m.value()->group(kLocal), kLocal).remote_lookups, sl.remote_lookups);
}

// The common case: the new prompt goes on past what any node computed. The hit ends where the
// full group's run in the cluster ends, and the sliding group's window there (not at the end of
// the chain) comes up with it.
TEST_F(RemoteTierHybrid, AChainLongerThanAnyoneComputedHitsWhatTheClusterHolds) {
  Daemon a(model_config(*cluster_, "longer"));
  Daemon b(model_config(*cluster_, "longer"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  publish_on(a, "longer");
  auto m = ModelConnection::attach(b.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::vector<BlockHash> c = chain();
  for (uint32_t i = kBlocks; i < 3 * kBlocks; ++i)
    c.push_back(block(i));
  auto hit = m.value()->lookup(c);
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  const wire::LookupReply& local = hit.value().groups[kLocal];
  ASSERT_EQ(hit.value().groups[kGlobal].pages.size(), kBlocks) << b.log();
  ASSERT_EQ(local.pages.size(), kBlocks);
  for (uint32_t i = kWindowFirst; i < kBlocks; ++i) {
    EXPECT_EQ(local.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kLocal), local.pages[i], tag(kLocal, i)), 0u) << i;
  }
}

// Deletes group `group`'s value of block i from the cluster.
void lose(const RedisCluster& cluster, const std::string& ns, const std::string& group,
          uint32_t i) {
  const std::string hex = to_hex(block(i));
  std::string victim;
  for (const std::string& k : cluster.keys(ns + ":default:" + group + ":")) {
    if (k.size() >= hex.size() && k.compare(k.size() - hex.size(), hex.size(), hex) == 0) {
      victim = k;
    }
  }
  ASSERT_FALSE(victim.empty()) << group << " " << i;
  EXPECT_NE(cluster.cli(0, "DEL " + victim).find('1'), std::string::npos);
}

TEST_F(RemoteTierHybrid, ABlockTheWindowNeedsThatTheClusterLostShortensTheHit) {
  Daemon a(model_config(*cluster_, "lost"));
  Daemon b(model_config(*cluster_, "lost"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  publish_on(a, "lost");
  // The local group's last block goes: a hit of 8 lacks it, a hit of 7 (window 3..6) does not.
  lose(*cluster_, "lost", "local", kBlocks - 1);

  auto m = ModelConnection::attach(b.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto hit = m.value()->lookup(chain());
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  const wire::LookupReply& local = hit.value().groups[kLocal];
  const wire::LookupReply& global = hit.value().groups[kGlobal];
  ASSERT_EQ(global.pages.size(), kBlocks - 1) << b.log();
  ASSERT_EQ(local.pages.size(), kBlocks - 1);
  for (uint32_t i = 0; i < kBlocks - 1; ++i) {
    EXPECT_EQ(global.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kGlobal), global.pages[i], tag(kGlobal, i)), 0u) << i;
    if (i < kWindowFirst - 1) continue;
    EXPECT_EQ(local.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kLocal), local.pages[i], tag(kLocal, i)), 0u) << i;
  }
}

// A sliding group's block before the window of the whole chain is lost: the hit of 8 does not
// need it (each value is checked on its own, not as a run from the first).
TEST_F(RemoteTierHybrid, ABlockBeforeTheWindowThatTheClusterLostCostsNothing) {
  Daemon a(model_config(*cluster_, "early"));
  Daemon b(model_config(*cluster_, "early"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  publish_on(a, "early");
  lose(*cluster_, "early", "local", 1);
  auto m = ModelConnection::attach(b.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  auto hit = m.value()->lookup(chain());
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  const wire::LookupReply& local = hit.value().groups[kLocal];
  ASSERT_EQ(hit.value().groups[kGlobal].pages.size(), kBlocks) << b.log();
  ASSERT_EQ(local.pages.size(), kBlocks);
  for (uint32_t i = kWindowFirst; i < kBlocks; ++i) {
    EXPECT_EQ(local.tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kLocal), local.pages[i], tag(kLocal, i)), 0u) << i;
  }
  EXPECT_EQ(pool_stats(m.value()->group(kLocal), kLocal).remote_hits, kBlocks - kWindowFirst);
}

TEST_F(RemoteTierHybrid, AGroupThatHoldsItsPartLocallyAsksNothing) {
  Daemon a(model_config(*cluster_, "part"));
  Daemon b(model_config(*cluster_, "part"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  publish_on(a, "part");
  auto m = ModelConnection::attach(b.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  // B computed the global group's blocks itself; the local group's come from the cluster.
  ASSERT_EQ(publish_all(m.value()->group(kGlobal), kGlobal), "");
  auto hit = m.value()->lookup(chain());
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_EQ(hit.value().groups[kGlobal].pages.size(), kBlocks) << b.log();
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(hit.value().groups[kGlobal].tiers[i], wire::kTierDevice) << i;
    if (i < kWindowFirst) continue;
    EXPECT_EQ(hit.value().groups[kLocal].tiers[i], wire::kTierRemote) << i;
    EXPECT_EQ(
        wrong_bytes(m.value()->group(kLocal), hit.value().groups[kLocal].pages[i], tag(kLocal, i)),
        0u)
        << i;
  }
  EXPECT_EQ(pool_stats(m.value()->group(kGlobal), kGlobal).remote_lookups, 0u);
  EXPECT_EQ(pool_stats(m.value()->group(kLocal), kLocal).remote_lookups, 1u);
}

}  // namespace
}  // namespace kvpool::testing

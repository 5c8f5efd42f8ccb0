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
#include "tests/integration/page_bytes.h"
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

// Publishes every block of the chain in `group`, each page filled with its tag, and lets go.
std::string publish_all(Connection& c, size_t group) {
  auto pages = c.alloc(kBlocks);
  if (!pages.ok()) return "alloc: " + pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    const PageId p = pages.value()[i];
    set_page(c, p, tag(group, i));
    items.push_back({p, block(i)});
  }
  if (auto pub = c.publish(items); !pub.ok()) return "publish: " + pub.error().message;
  auto rel = c.release(pages.value());
  return rel.ok() ? "" : "release: " + rel.error().message;
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
  // Daemons A and B under namespace `ns`; A publishes the whole chain in both groups and the
  // cluster holds it; then B's reader attaches (reader_). ns_ names the keys.
  void share(const std::string& ns) {
    ns_ = ns;
    a_ = std::make_unique<Daemon>(model_config(*cluster_, ns));
    b_ = std::make_unique<Daemon>(model_config(*cluster_, ns));
    ASSERT_TRUE(a_->start()) << a_->log();
    ASSERT_TRUE(b_->start()) << b_->log();
    {
      auto w = ModelConnection::attach(a_->socket(), "writer", "m");
      ASSERT_TRUE(w.ok()) << w.error().message;
      for (size_t g = 0; g < 2; ++g)
        ASSERT_EQ(publish_all(w.value()->group(g), g), "");
    }
    ASSERT_TRUE(wait_keys(ns + ":default:local:", kBlocks)) << a_->log();
    ASSERT_TRUE(wait_keys(ns + ":default:global:", kBlocks)) << a_->log();
    auto r = ModelConnection::attach(b_->socket(), "reader", "m");
    ASSERT_TRUE(r.ok()) << r.error().message;
    reader_ = std::move(r.value());
  }
  // The reader's lookup of `c`, expected to hit n blocks (a test failure otherwise).
  wire::GroupLookupReply lookup(const std::vector<BlockHash>& c, uint32_t n) {
    auto hit = reader_->lookup(c);
    EXPECT_TRUE(hit.ok()) << (hit.ok() ? "" : hit.error().message);
    if (!hit.ok()) return {};
    EXPECT_EQ(hit.value().groups[kGlobal].pages.size(), n) << b_->log();
    EXPECT_EQ(hit.value().groups[kLocal].pages.size(), n);
    return hit.value();
  }
  // Group g's blocks [from, to) of `hit` came from the cluster, bytes equal.
  void expect_remote(const wire::GroupLookupReply& hit, size_t g, uint32_t from, uint32_t to) {
    const wire::LookupReply& l = hit.groups[g];
    for (uint32_t i = from; i < to && i < l.pages.size(); ++i) {
      EXPECT_EQ(l.tiers[i], wire::kTierRemote) << "group " << g << " block " << i;
      EXPECT_EQ(wrong_bytes(reader_->group(g), l.pages[i], tag(g, i)), 0u)
          << "group " << g << " block " << i;
    }
  }
  stats::PoolStats group_stats(size_t g) { return pool_stats(reader_->group(g), g); }

  std::unique_ptr<RedisCluster> cluster_;
  std::string ns_;
  std::unique_ptr<Daemon> a_, b_;
  std::unique_ptr<ModelConnection> reader_;
};

TEST_F(RemoteTierHybrid, EachGroupFetchesWhatTheHitNeedsFromAnotherDaemon) {
  share("hyb");
  EXPECT_EQ(cluster_->keys("hyb:default:").size(), 2 * kBlocks);
  const std::vector<BlockHash> c = chain();
  const wire::GroupLookupReply hit = lookup(c, kBlocks);
  ASSERT_EQ(hit.groups[kLocal].pages.size(), kBlocks);
  expect_remote(hit, kGlobal, 0, kBlocks);
  expect_remote(hit, kLocal, kWindowFirst, kBlocks);
  for (uint32_t i = 0; i < kWindowFirst; ++i) {  // before the window: not fetched, not held
    EXPECT_EQ(hit.groups[kLocal].pages[i], kNoPage) << i;
    EXPECT_EQ(hit.groups[kLocal].tiers[i], wire::kTierNone) << i;
  }
  // The local group copied up its window's blocks only.
  const stats::PoolStats sl = group_stats(kLocal);
  EXPECT_EQ(sl.remote_hits, kBlocks - kWindowFirst);
  EXPECT_EQ(group_stats(kGlobal).remote_hits, kBlocks);
  for (size_t g = 0; g < 2; ++g) {
    std::vector<PageId> held;
    for (const PageId p : hit.groups[g].pages) {
      if (p != kNoPage) held.push_back(p);
    }
    ASSERT_TRUE(reader_->group(g).release(held).ok());
  }
  // Promoted and published: the next lookup hits B's own device tier in both groups.
  const wire::GroupLookupReply again = lookup(c, kBlocks);
  ASSERT_EQ(again.groups[kGlobal].pages.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(again.groups[kGlobal].tiers[i], wire::kTierDevice) << i;
    if (i >= kWindowFirst) {
      EXPECT_EQ(again.groups[kLocal].tiers[i], wire::kTierDevice) << i;
    }
  }
  EXPECT_EQ(group_stats(kLocal).remote_lookups, sl.remote_lookups);
}

// The common case: the new prompt goes on past what any node computed. The hit ends where the
// full group's run in the cluster ends, and the sliding group's window there (not at the end of
// the chain) comes up with it.
TEST_F(RemoteTierHybrid, AChainLongerThanAnyoneComputedHitsWhatTheClusterHolds) {
  share("longer");
  std::vector<BlockHash> c = chain();
  for (uint32_t i = kBlocks; i < 3 * kBlocks; ++i)
    c.push_back(block(i));
  const wire::GroupLookupReply hit = lookup(c, kBlocks);
  expect_remote(hit, kGlobal, 0, kBlocks);
  expect_remote(hit, kLocal, kWindowFirst, kBlocks);
}

TEST_F(RemoteTierHybrid, ABlockTheWindowNeedsThatTheClusterLostShortensTheHit) {
  share("lost");
  // The local group's last block goes: a hit of 8 lacks it, a hit of 7 (window 3..6) does not.
  lose(*cluster_, "lost", "local", kBlocks - 1);
  const wire::GroupLookupReply hit = lookup(chain(), kBlocks - 1);
  expect_remote(hit, kGlobal, 0, kBlocks - 1);
  expect_remote(hit, kLocal, kWindowFirst - 1, kBlocks - 1);
}

// A sliding group's block before the window of the whole chain is lost: the hit of 8 does not
// need it (each value is checked on its own, not as a run from the first).
TEST_F(RemoteTierHybrid, ABlockBeforeTheWindowThatTheClusterLostCostsNothing) {
  share("early");
  lose(*cluster_, "early", "local", 1);
  const wire::GroupLookupReply hit = lookup(chain(), kBlocks);
  expect_remote(hit, kLocal, kWindowFirst, kBlocks);
  EXPECT_EQ(group_stats(kLocal).remote_hits, kBlocks - kWindowFirst);
}

TEST_F(RemoteTierHybrid, AGroupThatHoldsItsPartLocallyAsksNothing) {
  share("part");
  // B computed the global group's blocks itself; the local group's come from the cluster.
  ASSERT_EQ(publish_all(reader_->group(kGlobal), kGlobal), "");
  const wire::GroupLookupReply hit = lookup(chain(), kBlocks);
  ASSERT_EQ(hit.groups[kGlobal].tiers.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i)
    EXPECT_EQ(hit.groups[kGlobal].tiers[i], wire::kTierDevice) << i;
  expect_remote(hit, kLocal, kWindowFirst, kBlocks);
  EXPECT_EQ(group_stats(kGlobal).remote_lookups, 0u);
  EXPECT_EQ(group_stats(kLocal).remote_lookups, 1u);
}

}  // namespace
}  // namespace kvpool::testing

// Integration: a hybrid model (pools[].groups) with a host tier (pools[].host_tier), in a real
// kvpoold with real worker processes. Each group keeps as many host blocks as the config says
// (split_host_tier); a group's device evictions go down to its own tier, and a lookup_groups
// whose hit needs them promotes them in every group (tier "host"), bytes intact, with the
// sliding group's blocks before its window left out. A full group that loses a block from both
// of its tiers makes the other groups drop their copies (no hit could use them); a demotion is
// not such a loss. Every test runs in both layouts (a layer_major model's groups are segmented).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/connection/model_connection.h"
#include "kernels/pool_view.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/page_bytes.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::ModelConnection;

constexpr size_t kLocal = 0;
constexpr size_t kGlobal = 1;
constexpr uint32_t kBlocks = 6;  // a 96-token prompt

// local: 2 layers, sliding window 64 (1 KiB pages, 16 a segment); global: 4 layers (2 KiB pages,
// 8 a segment). The model's 32 KiB hold one segment of each and no more, so allocs evict.
std::string model_config(uint32_t host_blocks, const std::string& layout) {
  return "backend: host\npools:\n  - name: m\n    layout: " + layout +
         "\n    capacity: 32KiB\n"
         "    segment_size: 16KiB\n    grow_ahead: false\n    host_tier: " +
         std::to_string(host_blocks) +
         " pages\n"
         "    geometry: {layers: 4, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n"
         "    groups:\n"
         "      - {name: local, layers: 2, kind: sliding, window: 64}\n"
         "      - {name: global}\n";
}

BlockHash block(uint32_t i) {
  return BlockHash{0x4854'0000 + i, 3};
}

uint8_t tag(size_t group, uint32_t i) {
  return static_cast<uint8_t>(0x40 + group * 16 + i);
}

// Publishes blocks [from, kBlocks) in `group`, each page filled with its tag, and releases them
// tail first (cached).
void publish_all(Connection& c, size_t group, uint32_t from = 0) {
  auto pages = c.alloc(kBlocks - from);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = from; i < kBlocks; ++i) {
    const PageId p = pages.value()[i - from];
    set_page(c, p, tag(group, i));
    items.push_back({p, block(i)});
  }
  ASSERT_TRUE(c.publish(items).ok());
  std::vector<PageId> tail_first(pages.value().rbegin(), pages.value().rend());
  ASSERT_TRUE(c.release(tail_first).ok());
}

// Takes every page of the group's pool (evicting its cached blocks) and gives them back unused.
void push_out(Connection& c) {
  auto all = c.alloc(c.pool().num_pages);
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_TRUE(c.release(all.value()).ok());
}

std::vector<BlockHash> chain() {
  std::vector<BlockHash> out;
  for (uint32_t i = 0; i < kBlocks; ++i)
    out.push_back(block(i));
  return out;
}

class HybridHostTier : public ::testing::TestWithParam<const char*> {};

TEST_P(HybridHostTier, AHitInBothGroupsHostTiersComesBackByteForByte) {
  Daemon d(model_config(8, GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  const int writer = run_worker([&] {
    auto m = ModelConnection::attach(d.socket(), "writer", "m");
    if (!m.ok()) return 1;
    for (size_t g = 0; g < 2; ++g) {
      publish_all(m.value()->group(g), g);
      push_out(m.value()->group(g));
    }
    return ::testing::Test::HasFailure() ? 2 : 0;
  });
  ASSERT_EQ(writer, 0);

  auto m = ModelConnection::attach(d.socket(), "reader", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  const std::vector<BlockHash> c = chain();
  auto hit = m.value()->lookup(c);
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_EQ(hit.value().groups.size(), 2u);
  // The next query, at 96, sees keys 33..96: the local group needs blocks 2..5 only.
  const wire::LookupReply& local = hit.value().groups[kLocal];
  const wire::LookupReply& global = hit.value().groups[kGlobal];
  ASSERT_EQ(global.pages.size(), kBlocks);
  ASSERT_EQ(local.pages.size(), kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(global.tiers[i], wire::kTierHost) << i;
    ASSERT_NE(global.pages[i], kNoPage) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kGlobal), global.pages[i], tag(kGlobal, i)), 0u) << i;
    if (i < 2) {
      EXPECT_EQ(local.pages[i], kNoPage) << i;
      EXPECT_EQ(local.tiers[i], wire::kTierNone) << i;
      continue;
    }
    EXPECT_EQ(local.tiers[i], wire::kTierHost) << i;
    ASSERT_NE(local.pages[i], kNoPage) << i;
    EXPECT_EQ(wrong_bytes(m.value()->group(kLocal), local.pages[i], tag(kLocal, i)), 0u) << i;
  }
  // Promoted, they are device blocks again.
  for (size_t g = 0; g < 2; ++g) {
    std::vector<PageId> held;
    for (const PageId p : hit.value().groups[g].pages) {
      if (p != kNoPage) held.push_back(p);
    }
    ASSERT_TRUE(m.value()->group(g).release(held).ok());
  }
  auto again = m.value()->lookup(c);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again.value().groups[kGlobal].tiers, std::vector<uint8_t>(kBlocks, wire::kTierDevice));
  const stats::PoolStats gs = pool_stats(m.value()->group(0), kGlobal);
  EXPECT_EQ(gs.host_promoted, kBlocks);
  EXPECT_EQ(pool_stats(m.value()->group(0), kLocal).host_promoted, kBlocks - 2);
}

TEST_P(HybridHostTier, AFullGroupsLossFromBothTiersDropsTheOtherGroupsCopies) {
  // Host tiers of 4 blocks: the global group's 6 evictions keep 4 below and lose 2.
  Daemon d(model_config(4, GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  auto m = ModelConnection::attach(d.socket(), "w", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  Connection& local = m.value()->group(kLocal);
  Connection& global = m.value()->group(kGlobal);
  publish_all(local, kLocal);
  publish_all(global, kGlobal);
  ASSERT_EQ(pool_stats(local, kLocal).indexed, kBlocks);
  // Only the global group's device tier is pushed out; its demotions are no loss, but its host
  // tier keeps 4 of the 6 and the 2 it drops leave the local group too.
  push_out(global);
  const stats::PoolStats g = pool_stats(local, kGlobal);
  EXPECT_EQ(g.indexed, 0u);
  EXPECT_EQ(g.host_held, 4u);
  EXPECT_EQ(pool_stats(local, kLocal).indexed, 4u);
  // The hybrid hit is the 4 blocks both still hold (blocks lost are the tail's, which the
  // device tier evicted first), the global ones promoted.
  auto hit = m.value()->lookup(chain());
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_EQ(hit.value().groups[kGlobal].pages.size(), 4u);
  EXPECT_EQ(hit.value().groups[kGlobal].tiers, std::vector<uint8_t>(4, wire::kTierHost));
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(wrong_bytes(global, hit.value().groups[kGlobal].pages[i], tag(kGlobal, i)), 0u) << i;
  }
}

TEST_P(HybridHostTier, AGroupsPartMayAlternateBetweenItsTiers) {
  // The local group's blocks 2..5 are below but 4 and 5 were computed again (on the device): its
  // part of the hit is host, host, device, device, one lookup.
  Daemon d(model_config(8, GetParam()));
  ASSERT_TRUE(d.start()) << d.log();
  auto m = ModelConnection::attach(d.socket(), "w", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  Connection& local = m.value()->group(kLocal);
  publish_all(local, kLocal);
  push_out(local);
  publish_all(local, kLocal, 4);
  publish_all(m.value()->group(kGlobal), kGlobal);
  auto hit = m.value()->lookup(chain());
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  const wire::LookupReply& l = hit.value().groups[kLocal];
  ASSERT_EQ(l.pages.size(), kBlocks);
  EXPECT_EQ(l.tiers, (std::vector<uint8_t>{wire::kTierNone, wire::kTierNone, wire::kTierHost,
                                           wire::kTierHost, wire::kTierDevice, wire::kTierDevice}));
  for (uint32_t i = 2; i < kBlocks; ++i) {
    EXPECT_EQ(wrong_bytes(local, l.pages[i], tag(kLocal, i)), 0u) << i;
  }
  EXPECT_EQ(hit.value().groups[kGlobal].tiers, std::vector<uint8_t>(kBlocks, wire::kTierDevice));
}

INSTANTIATE_TEST_SUITE_P(Layouts, HybridHostTier, ::testing::Values("page_major", "layer_major"));

}  // namespace
}  // namespace kvpool::testing

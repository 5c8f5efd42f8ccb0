// Integration: a hybrid model (pools[].groups) in a real kvpoold with real worker processes. A
// model with a sliding-window group ("local", window 64 tokens) and a full-attention group
// ("global") on the host backend:
//   - one lookup_groups answers the hit every group can serve, checked against a brute-force
//     oracle over random and hand-picked presence patterns (a block missing before, inside and
//     after the window, in either group), with the pages the publisher put there;
//   - a block the full group evicts leaves the sliding group too (a hybrid hit can no longer use
//     it), so the sliding group never keeps a half-usable prefix;
//   - the groups share one budget: one group may take nearly all of it, and the other takes
//     segments back when it needs them;
//   - linking and lookup_groups refuse what does not fit, naming why.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/connection/model_connection.h"
#include "client/worker/hybrid_sequence.h"
#include "common/block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::ModelConnection;

constexpr uint32_t kTokens = 16;  // tokens per page
constexpr uint32_t kWindow = 64;  // the local group's window
constexpr size_t kLocal = 0;
constexpr size_t kGlobal = 1;

// local: 2 layers (1 KiB pages), global: 4 layers (2 KiB pages); 16 KiB segments.
std::string model_config(const std::string& capacity, const std::string& extra_pools = "") {
  return "backend: host\npools:\n  - name: m\n    capacity: " + capacity +
         "\n    segment_size: 16KiB\n    grow_ahead: false\n"
         "    geometry: {layers: 4, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n"
         "    groups:\n"
         "      - {name: local, layers: 2, kind: sliding, window: 64}\n"
         "      - {name: global}\n" +
         extra_pools;
}

// The first block a query resuming after n blocks reads in the local group (its window).
uint32_t first_needed_local(uint32_t n) {
  if (n == 0) return 0;
  const uint64_t p = uint64_t{n} * kTokens;  // the next query's position
  const uint64_t first_key = p + 1 > kWindow ? p + 1 - kWindow : 0;
  return std::min<uint32_t>(static_cast<uint32_t>(first_key / kTokens), n - 1);
}

// The hybrid hit by brute force: the largest n with every global block in [0, n) and every
// local block in [first_needed_local(n), n).
uint32_t oracle(const std::vector<bool>& local, const std::vector<bool>& global) {
  for (auto n = static_cast<uint32_t>(local.size()); n > 0; --n) {
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; ++i)
      ok = global[i];
    for (uint32_t i = first_needed_local(n); i < n && ok; ++i)
      ok = local[i];
    if (ok) return n;
  }
  return 0;
}

BlockHash block(uint32_t chain, uint32_t i) {
  return BlockHash{0x4859'0000'0000ull + chain * 1000 + i, chain};
}

std::unique_ptr<ModelConnection> attach_model(const Daemon& d, const std::string& name,
                                              const std::string& model = "m") {
  auto m = ModelConnection::attach(d.socket(), name, model);
  if (!m.ok()) {
    ADD_FAILURE() << "attach " << name << ": " << m.error().message;
    return nullptr;
  }
  return std::move(m.value());
}

// Publishes, in `group`, the blocks of `chain` whose bit is set, then releases them tail first
// (cached). Returns the page of each published block (kNoPage for the others).
std::vector<PageId> publish(Connection& c, uint32_t chain, const std::vector<bool>& present) {
  std::vector<PageId> page(present.size(), kNoPage);
  uint32_t count = 0;
  for (const bool p : present)
    count += p ? 1u : 0u;
  if (count == 0) return page;
  auto pages = c.alloc(count);
  EXPECT_TRUE(pages.ok()) << pages.error().message;
  if (!pages.ok()) return page;
  std::vector<PublishItem> items;
  uint32_t k = 0;
  for (uint32_t i = 0; i < present.size(); ++i) {
    if (!present[i]) continue;
    page[i] = pages.value()[k++];
    items.push_back({page[i], block(chain, i)});
  }
  EXPECT_TRUE(c.publish(items).ok());
  std::vector<PageId> tail_first(pages.value().rbegin(), pages.value().rend());
  EXPECT_TRUE(c.release(tail_first).ok());
  return page;
}

void release_hit(ModelConnection& m, const wire::GroupLookupReply& r) {
  for (size_t g = 0; g < r.groups.size(); ++g) {
    std::vector<PageId> held;
    for (auto it = r.groups[g].pages.rbegin(); it != r.groups[g].pages.rend(); ++it) {
      if (*it != kNoPage) held.push_back(*it);
    }
    ASSERT_TRUE(m.group(g).release(held).ok());
  }
}

TEST(HybridModel, OneLookupAnswersTheHitEveryGroupCanServe) {
  Daemon d(model_config("3MiB"));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach_model(d, "publisher");
  auto b = attach_model(d, "reader", "m/global");  // any group's name finds the model
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->num_groups(), 2u);
  EXPECT_EQ(a->group_names(), (std::vector<std::string>{"local", "global"}));
  EXPECT_EQ(a->group(kLocal).pool().pool_name, "m/local");
  EXPECT_EQ(a->group(kLocal).pool().geometry.kind, AttentionKind::sliding);
  EXPECT_EQ(a->group(kGlobal).pool().geometry.layers, 4u);
  EXPECT_EQ(b->group(kLocal).pool().geometry.layers, 2u);

  constexpr uint32_t kBlocks = 10;
  const auto all = std::vector<bool>(kBlocks, true);
  auto with_hole = [&](uint32_t hole) {
    std::vector<bool> v = all;
    v[hole] = false;
    return v;
  };
  // Hand-picked: a local hole before, at the edge of, and inside the window of a full hit; a
  // global hole; both; then random patterns.
  std::vector<std::pair<std::vector<bool>, std::vector<bool>>> cases = {
      {all, all},          {with_hole(2), all}, {with_hole(5), all}, {with_hole(6), all},
      {with_hole(7), all}, {with_hole(9), all}, {all, with_hole(6)}, {with_hole(3), with_hole(8)},
      {with_hole(0), all}, {all, with_hole(0)},
  };
  std::mt19937 rng(24);
  std::bernoulli_distribution present(0.8);
  while (cases.size() < 60) {
    std::vector<bool> local(kBlocks), global(kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) {
      local[i] = present(rng);
      global[i] = present(rng) || i < 3;
    }
    cases.emplace_back(local, global);
  }
  uint32_t window_only = 0;  // hits the local group served without its head
  for (uint32_t c = 0; c < cases.size(); ++c) {
    const auto& [local, global] = cases[c];
    const std::vector<PageId> local_pages = publish(a->group(kLocal), c, local);
    const std::vector<PageId> global_pages = publish(a->group(kGlobal), c, global);
    std::vector<BlockHash> chain;
    for (uint32_t i = 0; i < kBlocks; ++i)
      chain.push_back(block(c, i));
    auto r = b->lookup(chain);
    ASSERT_TRUE(r.ok()) << r.error().message;
    const uint32_t want = oracle(local, global);
    ASSERT_EQ(r.value().hits(), want) << "case " << c;
    const auto& lp = r.value().groups[kLocal].pages;
    const auto& gp = r.value().groups[kGlobal].pages;
    for (uint32_t i = 0; i < want; ++i) {
      EXPECT_EQ(gp[i], global_pages[i]) << "case " << c << " block " << i;
      EXPECT_EQ(r.value().groups[kGlobal].tiers[i], wire::kTierDevice);
      const bool needed = i >= first_needed_local(want);
      EXPECT_EQ(lp[i], needed ? local_pages[i] : kNoPage) << "case " << c << " block " << i;
      EXPECT_EQ(r.value().groups[kLocal].tiers[i], needed ? wire::kTierDevice : wire::kTierNone);
    }
    if (want != 0 && !local[0]) ++window_only;
    release_hit(*b, r.value());
  }
  EXPECT_GT(window_only, 0u);  // the patterns did reach hits past a missing local head
  // Everything went back: the reader holds nothing, the pages stay cached.
  for (size_t g = 0; g < 2; ++g) {
    auto s = b->group(g).stats();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s.value().session_held_pages, 0u);
    EXPECT_EQ(s.value().in_use, 0u);
  }
}

TEST(HybridModel, AFullGroupsEvictionLeavesTheOtherGroupsToo) {
  Daemon d(model_config("3MiB"));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach_model(d, "a");
  ASSERT_TRUE(a);
  const std::vector<bool> all(6, true);
  publish(a->group(kLocal), 1, all);
  publish(a->group(kGlobal), 1, all);
  // The operator evicts two pages of the global group: its tail, blocks 5 and 4.
  auto evicted = a->group(kGlobal).evict(2);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  ASSERT_EQ(evicted.value(), 2u);
  auto local_stats = a->group(kLocal).stats();
  ASSERT_TRUE(local_stats.ok());
  EXPECT_EQ(local_stats.value().cached, 4u);  // the local group dropped the same two blocks
  for (uint32_t i = 0; i < 6; ++i) {
    const BlockHash h = block(1, i);
    auto hit = a->group(kLocal).lookup(std::span(&h, 1));
    ASSERT_TRUE(hit.ok());
    EXPECT_EQ(hit.value().size(), i < 4 ? 1u : 0u) << "block " << i;
    if (!hit.value().empty()) {
      ASSERT_TRUE(a->group(kLocal).release(hit.value()).ok());
    }
  }
  // The other way round changes nothing: a sliding group's block is not needed by every hit.
  ASSERT_EQ(a->group(kLocal).evict(1).value(), 1u);
  auto global_stats = a->group(kGlobal).stats();
  ASSERT_TRUE(global_stats.ok());
  EXPECT_EQ(global_stats.value().cached, 4u);
}

TEST(HybridModel, GroupsShareOneBudgetWithoutASplit) {
  Daemon d(model_config("128KiB"));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach_model(d, "a");
  ASSERT_TRUE(a);
  Connection& local = a->group(kLocal);
  Connection& global = a->group(kGlobal);
  // Each group starts with one 16 KiB segment: 16 local pages, 8 global ones.
  EXPECT_EQ(local.num_pages(), 16u);
  EXPECT_EQ(global.num_pages(), 8u);
  // The global group takes all the budget but the local group's segment: 112 KiB, 56 pages.
  auto big = global.alloc(56);
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(global.bytes() + local.bytes(), 128u << 10);
  auto more = global.alloc(1);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.error().status.code(), Errc::out_of_pages) << more.error().message;
  EXPECT_NE(more.error().message.find("pool m"), std::string::npos) << more.error().message;
  // Once the global group's pages are back (free), the local group grows into their room.
  ASSERT_TRUE(global.release(big.value()).ok());
  auto local_pages = local.alloc(100);
  ASSERT_TRUE(local_pages.ok()) << local_pages.error().message;
  EXPECT_GE(local.num_pages(), 100u);
  ASSERT_TRUE(global.sync_segments().ok());
  EXPECT_LE(global.bytes() + local.bytes(), 128u << 10);
  EXPECT_GE(global.bytes(), 16u << 10);  // never below its first segment
}

// A hybrid hit needs its block in every group, so memory goes to the group that caches fewer
// blocks: here the local group, with no hits, takes a segment from the global group, whose
// cached pages earn hits, instead of evicting its own cache (a plain pool would not give).
TEST(HybridModel, TheGroupCachingFewerBlocksTakesMemoryFromTheOther) {
  Daemon d(model_config("128KiB"));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach_model(d, "a");
  ASSERT_TRUE(a);
  Connection& local = a->group(kLocal);
  Connection& global = a->group(kGlobal);
  // The global group caches 56 blocks (all the budget but the local group's segment) that
  // lookups hit; the local group caches 16.
  publish(global, 5, std::vector<bool>(56, true));
  publish(local, 6, std::vector<bool>(16, true));
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < 56; ++i)
    chain.push_back(block(5, i));
  for (int k = 0; k < 3; ++k) {
    auto hit = global.lookup(chain);
    ASSERT_TRUE(hit.ok());
    ASSERT_TRUE(global.release(hit.value()).ok());
  }
  ASSERT_EQ(local.num_pages(), 16u);
  auto pages = local.alloc(4);  // its own 16 cached pages could serve this
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  EXPECT_GT(local.num_pages(), 16u);
  ASSERT_TRUE(global.sync_segments().ok());
  EXPECT_LT(global.num_pages(), 56u);
  EXPECT_LE(global.bytes() + local.bytes(), 128u << 10);
}

// Two workers' HybridSequences (a SequenceCache per group, begun from one lookup_groups): B begins
// A's prompt from everything A published, the global group with every block, the local group
// with its window's only, and reads A's bytes in them.
TEST(HybridModel, ASecondWorkerResumesAHybridSequenceFromOneLookup) {
  Daemon d(model_config("3MiB"));
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach_model(d, "a");
  auto b = attach_model(d, "b");
  ASSERT_TRUE(a && b);
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", a->group(kLocal).pool().geometry, "", ""});
  std::vector<uint32_t> prompt(160);  // 10 blocks
  for (uint32_t t = 0; t < prompt.size(); ++t)
    prompt[t] = 500 + t;
  auto fill = [](Connection& c, PageId p, uint32_t tag) {
    std::memset(c.page(p), static_cast<int>(tag & 0xff), c.pool().page_stride);
  };

  client::HybridSequence sa(*a, hasher, root);
  ASSERT_EQ(sa.begin(prompt).value(), 0u);
  for (size_t g = 0; g < 2; ++g) {
    const auto& table = sa.group(g).block_table();
    ASSERT_EQ(table.size(), 10u);
    for (uint32_t blk = 0; blk < 10; ++blk)
      fill(a->group(g), table[blk], static_cast<uint32_t>(g * 16 + blk));
  }
  ASSERT_EQ(sa.publish_full().value(), 0u);
  // The next query, at 160, sees keys 97..160: the local group keeps blocks 6..9 only.
  for (uint32_t blk = 0; blk < 10; ++blk) {
    EXPECT_EQ(sa.group(kLocal).block_table()[blk] == kNoPage, blk < 6) << blk;
    EXPECT_NE(sa.group(kGlobal).block_table()[blk], kNoPage) << blk;
  }

  client::HybridSequence sb(*b, hasher, root);
  auto cached = sb.begin(prompt);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), 160u);
  EXPECT_EQ(sb.group(kGlobal).block_table(), sa.group(kGlobal).block_table());
  EXPECT_EQ(sb.group(kLocal).block_table(), sa.group(kLocal).block_table());
  for (size_t g = 0; g < 2; ++g) {
    for (uint32_t blk = 0; blk < 10; ++blk) {
      const PageId p = sb.group(g).block_table()[blk];
      if (p == kNoPage) continue;
      const auto* bytes = reinterpret_cast<const uint8_t*>(b->group(g).page(p));
      EXPECT_EQ(bytes[0], g * 16 + blk);
      EXPECT_EQ(bytes[b->group(g).pool().page_stride - 1], g * 16 + blk);
    }
  }
  // The next token takes a new block in both groups.
  ASSERT_TRUE(sb.append(9).ok());
  EXPECT_EQ(sb.group(kLocal).block_table().size(), 11u);
  EXPECT_EQ(sb.group(kGlobal).block_table().size(), 11u);
  ASSERT_TRUE(sb.release().ok());
  ASSERT_TRUE(sa.release().ok());
  for (size_t g = 0; g < 2; ++g) {
    auto s = a->group(g).stats();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s.value().in_use, 0u);
  }
}

TEST(HybridModel, LinksAndGroupLookupsRefuseWhatDoesNotFit) {
  const std::string plain =
      "  - name: plain\n    capacity: 64KiB\n"
      "    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n";
  Daemon d(model_config("3MiB", plain));
  ASSERT_TRUE(d.start()) << d.log();
  const std::vector<BlockHash> chain = {block(9, 0), block(9, 1)};

  // A plain pool has no groups.
  auto p = attach(d, "p", "plain");
  ASSERT_TRUE(p);
  auto r = p->lookup_groups(chain);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status.code(), Errc::invalid_argument);
  EXPECT_NE(r.error().message.find("not a group of a hybrid model"), std::string::npos);
  // A link from a plain pool, or to a session that does not exist, is refused.
  auto bad =
      Connection::attach(d.socket(), "x", "plain", Connection::Memory::none, p->session_id());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not a group of a hybrid model"), std::string::npos);
  bad = Connection::attach(d.socket(), "x", "m/global", Connection::Memory::none, 987654321);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("is not an attached session"), std::string::npos);
  bad = Connection::attach(d.socket(), "x", "m/global", Connection::Memory::none, p->session_id());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("not to a group of model m"), std::string::npos);

  // A group session with no session of the other group linked cannot look up the model.
  auto lone = attach(d, "lone", "m/local");
  ASSERT_TRUE(lone);
  r = lone->lookup_groups(chain);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("group global of model m has no session"), std::string::npos)
      << r.error().message;
  // Two sessions of one group in one link are refused.
  bad =
      Connection::attach(d.socket(), "x", "m/local", Connection::Memory::none, lone->session_id());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("already has a session of group local"), std::string::npos);
  // Another process may not join this one's sessions.
  const uint64_t id = lone->session_id();
  EXPECT_EQ(run_worker([&] {
              auto c =
                  Connection::attach(d.socket(), "other", "m/global", Connection::Memory::none, id);
              return !c.ok() && c.error().status.code() == Errc::permission_denied ? 0 : 1;
            }),
            0);
  // Linked properly, the same lookup answers (nothing is cached: no hit).
  auto linked = Connection::attach(d.socket(), "x", "m/global", Connection::Memory::none, id);
  ASSERT_TRUE(linked.ok()) << linked.error().message;
  r = lone->lookup_groups(chain);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().hits(), 0u);
  EXPECT_EQ(r.value().groups.size(), 2u);
}

}  // namespace
}  // namespace kvpool::testing

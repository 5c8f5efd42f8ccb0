// SequenceCache against a real kvpoold.

#include "client/worker/sequence_cache.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "client/capi/kvpool.h"
#include "common/geometry.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using client::SequenceCache;

// 16 tokens per page, 32 pages.
constexpr char kPool[] = R"(
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}
    capacity: 32 pages
)";

std::vector<uint32_t> tokens(size_t n, uint32_t start) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

class SequenceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.start()) << daemon_.log();
    conn_ = connect("w1");
    ASSERT_NE(conn_, nullptr);
    root_ = hasher_.root({"test-model", conn_->pool().geometry, "", ""});
  }
  std::unique_ptr<Connection> connect(const std::string& name) {
    auto c = Connection::attach(daemon_.socket(), name);
    if (!c.ok()) {
      ADD_FAILURE() << c.error().message;
      return nullptr;
    }
    return std::move(c.value());
  }
  wire::StatsReply stats() {
    // The daemon handles a connection's close asynchronously: let it settle first.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return conn_->stats().value();
  }

  Daemon daemon_{kPool};
  BlockHasher hasher_;
  BlockHash root_;
  std::unique_ptr<Connection> conn_;
};

TEST_F(SequenceCacheTest, SecondSequenceReusesThePublishedPrefix) {
  const auto prompt = tokens(40, 100);  // 2 full blocks + 8 tokens
  SequenceCache a(*conn_, hasher_, root_);
  auto cached = a.begin(prompt);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), 0u);
  ASSERT_EQ(a.block_table().size(), 3u);
  auto adopted = a.publish_full();
  ASSERT_TRUE(adopted.ok());
  EXPECT_EQ(adopted.value(), 0u);
  EXPECT_EQ(a.published_blocks(), 2u);

  // Same first 32 tokens, then different ones: 2 blocks cached.
  auto other = connect("w2");
  auto prompt_b = tokens(32, 100);
  const auto tail = tokens(20, 9000);
  prompt_b.insert(prompt_b.end(), tail.begin(), tail.end());
  SequenceCache b(*other, hasher_, root_);
  auto cached_b = b.begin(prompt_b);
  ASSERT_TRUE(cached_b.ok());
  EXPECT_EQ(cached_b.value(), 32u);
  EXPECT_EQ(b.block_table()[0], a.block_table()[0]);
  EXPECT_EQ(b.block_table()[1], a.block_table()[1]);
  EXPECT_NE(b.block_table()[2], a.block_table()[2]);
  EXPECT_EQ(b.block_table().size(), 4u);  // 52 tokens
}

TEST_F(SequenceCacheTest, RacingPublishersConvergeOnOnePage) {
  const auto prompt = tokens(48, 7);
  auto other = connect("w2");
  SequenceCache a(*conn_, hasher_, root_);
  SequenceCache b(*other, hasher_, root_);
  ASSERT_TRUE(a.begin(prompt).ok());
  ASSERT_TRUE(b.begin(prompt).ok());  // both miss: nothing published yet
  EXPECT_EQ(stats().in_use, 6u);
  ASSERT_EQ(a.publish_full().value(), 0u);
  ASSERT_EQ(b.publish_full().value(), 3u);  // b adopts a's three pages
  EXPECT_EQ(a.block_table(), b.block_table());
  EXPECT_EQ(stats().in_use, 3u);  // b's own copies went back
}

TEST_F(SequenceCacheTest, AppendAllocatesAtBlockBoundaries) {
  SequenceCache s(*conn_, hasher_, root_);
  ASSERT_TRUE(s.begin(tokens(15, 1)).ok());
  EXPECT_EQ(s.block_table().size(), 1u);
  auto slot = s.append(99);  // token 15 fills block 0
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(slot.value().offset, 15u);
  EXPECT_EQ(s.block_table().size(), 1u);
  slot = s.append(100);  // token 16 opens block 1
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(s.block_table().size(), 2u);
  EXPECT_EQ(slot.value().page, s.block_table()[1]);
  EXPECT_EQ(slot.value().offset, 0u);
  EXPECT_EQ(s.slot(3).page, s.block_table()[0]);
  EXPECT_EQ(s.block_hashes().size(), 1u);
}

TEST_F(SequenceCacheTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  SequenceCache parent(*conn_, hasher_, root_);
  ASSERT_TRUE(parent.begin(tokens(40, 3)).ok());
  const PageId partial = parent.block_table()[2];
  std::memset(conn_->page(partial), 0x5a, conn_->pool().page_stride);
  auto child = parent.fork();
  ASSERT_TRUE(child.ok()) << child.error().message;
  SequenceCache& c = *child.value();
  EXPECT_EQ(c.tokens(), 40u);
  EXPECT_EQ(c.block_table()[0], parent.block_table()[0]);
  EXPECT_EQ(c.block_table()[1], parent.block_table()[1]);
  ASSERT_NE(c.block_table()[2], partial);
  EXPECT_EQ(
      std::memcmp(conn_->page(c.block_table()[2]), conn_->page(partial), conn_->pool().page_stride),
      0);
  // Writing the child's copy leaves the parent's page alone.
  std::memset(conn_->page(c.block_table()[2]), 0x11, 8);
  EXPECT_EQ(static_cast<unsigned char>(*conn_->page(partial)), 0x5a);
  EXPECT_EQ(stats().session_held_pages, 4u);  // 2 shared + 2 partial copies
  ASSERT_TRUE(c.release().ok());
  EXPECT_EQ(stats().session_held_pages, 3u);
}

TEST(SequenceCacheInt8, ForkCopiesThePartialPagesScales) {
  Daemon d(R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 8, tokens_per_page: 16, dtype: int8}
    capacity: 16 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  auto conn = Connection::attach(d.socket(), "w");
  ASSERT_TRUE(conn.ok());
  Connection& c = *conn.value();
  BlockHasher hasher;
  const BlockHash root = hasher.root({"m", c.pool().geometry, "", ""});
  SequenceCache parent(c, hasher, root);
  ASSERT_TRUE(parent.begin(tokens(20, 1)).ok());  // one full block and 4 tokens
  const PageId partial = parent.block_table()[1];
  float* scales = c.page_scales(partial);
  ASSERT_NE(scales, nullptr);
  const size_t n = page_scale_bytes(c.pool().geometry) / sizeof(float);
  for (size_t i = 0; i < n; ++i)
    scales[i] = 0.5f + static_cast<float>(i);
  auto child = parent.fork();
  ASSERT_TRUE(child.ok()) << child.error().message;
  const PageId copy = child.value()->block_table()[1];
  ASSERT_NE(copy, partial);
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(c.page_scales(copy)[i], scales[i]) << i;
}

TEST_F(SequenceCacheTest, WindowDropsPagesThatLeftIt) {
  SequenceCache s(*conn_, hasher_, root_);
  ASSERT_TRUE(s.begin(tokens(64, 1)).ok());  // 4 full blocks
  ASSERT_TRUE(s.apply_window(20).ok());      // keeps tokens 44..63: blocks 2 and 3
  EXPECT_EQ(s.block_table()[0], kNoPage);
  EXPECT_EQ(s.block_table()[1], kNoPage);
  EXPECT_NE(s.block_table()[2], kNoPage);
  EXPECT_EQ(stats().session_held_pages, 2u);
  ASSERT_TRUE(s.append(5).ok());
  ASSERT_TRUE(s.publish_full().ok());  // dropped blocks are skipped
  EXPECT_EQ(stats().counter("published"), 2u);
}

TEST_F(SequenceCacheTest, ReleaseGivesEverythingBackTailFirst) {
  {
    SequenceCache s(*conn_, hasher_, root_);
    ASSERT_TRUE(s.begin(tokens(32 * 16, 1)).ok());  // the whole pool, 32 blocks
    ASSERT_TRUE(s.publish_full().ok());
  }  // destructor releases, tail first
  auto st = stats();
  EXPECT_EQ(st.in_use, 0u);
  EXPECT_EQ(st.cached, 32u);
  // One fresh page must evict the least recently released: the tail (block 31), so the
  // 31-block prefix stays whole.
  {
    SequenceCache t(*conn_, hasher_, root_);
    ASSERT_TRUE(t.begin(tokens(1, 77777)).ok());
  }  // its unpublished page goes back FREE
  SequenceCache again(*conn_, hasher_, root_);
  auto cached = again.begin(tokens(32 * 16, 1));
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), 31u * 16);
}

// A pool whose geometry is sliding or chunked: the cache lets go of what the next query can no
// longer see, as the sequence grows, without the worker asking; the pool keeps it cached.
struct WindowCase {
  const char* kind;
  uint32_t window;
};

class SequenceCacheWindowTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(SequenceCacheWindowTest, PublishedBlocksOutOfTheWindowGoBackCached) {
  const WindowCase& w = GetParam();
  Daemon d(std::string(R"(
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16,
               kind: )") +
           w.kind + ", window: " + std::to_string(w.window) + R"(}
    capacity: 32 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  auto conn = Connection::attach(d.socket(), "w");
  ASSERT_TRUE(conn.ok()) << conn.error().message;
  Connection& c = *conn.value();
  EXPECT_EQ(attention_kind_name(c.pool().geometry.kind), w.kind);
  EXPECT_EQ(c.pool().geometry.window, w.window);
  kvpool_conn* capi = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c", nullptr, &capi, err, sizeof err), 0) << err;
  uint8_t kind = 0;
  uint32_t window = 0;
  kvpool_get_pool_attention(capi, &kind, &window);
  kvpool_detach(capi);
  EXPECT_EQ(kind, static_cast<uint8_t>(c.pool().geometry.kind));
  EXPECT_EQ(window, w.window);
  BlockHasher hasher;
  SequenceCache s(c, hasher, hasher.root({"m", c.pool().geometry, "", ""}));
  ASSERT_TRUE(s.begin(tokens(100, 1)).ok());  // 6 full blocks and 4 tokens: 7 pages
  // Nothing is published yet: every page stays, whatever the window.
  EXPECT_EQ(c.stats().value().session_held_pages, 7u);
  ASSERT_TRUE(s.publish_full().ok());
  // The next query sits at position 100 and sees tokens [first_visible, 100].
  const uint32_t first = s.first_visible();
  const uint32_t expected_first =
      std::string(w.kind) == "sliding" ? 100 - w.window + 1 : 100 - 100 % w.window;
  EXPECT_EQ(first, expected_first);
  for (uint32_t b = 0; b < 7; ++b) {
    const bool gone = (b + 1) * 16 <= first;  // every token of block b before `first`
    EXPECT_EQ(s.block_table()[b] == kNoPage, gone) << "block " << b << ", first " << first;
  }
  const uint32_t held = 7 - first / 16;
  auto st = c.stats().value();
  EXPECT_EQ(st.session_held_pages, held);
  EXPECT_EQ(st.cached, 7 - held);  // released published blocks stay in the prefix index
  // Growing moves the window on: 60 more tokens, published as they fill.
  for (uint32_t i = 0; i < 60; ++i) {
    ASSERT_TRUE(s.append(1000 + i).ok());
    if (s.tokens() % 16 == 0) {
      ASSERT_TRUE(s.publish_full().ok());
    }
  }
  ASSERT_TRUE(s.publish_full().ok());
  const uint32_t later = s.first_visible();
  for (uint32_t b = 0; b < s.tokens() / 16; ++b)
    EXPECT_EQ(s.block_table()[b] == kNoPage, (b + 1) * 16 <= later) << "block " << b;
  // A second sequence of the same prompt finds the released blocks cached.
  SequenceCache t(c, hasher, hasher.root({"m", c.pool().geometry, "", ""}));
  auto hit = t.begin(tokens(100, 1));
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  EXPECT_EQ(hit.value(), 96u);
}

INSTANTIATE_TEST_SUITE_P(Kinds, SequenceCacheWindowTest,
                         ::testing::Values(WindowCase{"sliding", 40}, WindowCase{"sliding", 1},
                                           WindowCase{"chunked", 32}, WindowCase{"chunked", 24}),
                         [](const ::testing::TestParamInfo<WindowCase>& p) {
                           return std::string(p.param.kind) + std::to_string(p.param.window);
                         });

TEST_F(SequenceCacheTest, AFullPoolKeepsEveryPage) {
  SequenceCache s(*conn_, hasher_, root_);
  ASSERT_TRUE(s.begin(tokens(100, 1)).ok());
  ASSERT_TRUE(s.publish_full().ok());
  EXPECT_EQ(s.first_visible(), 0u);
  EXPECT_EQ(stats().session_held_pages, 7u);
}

}  // namespace
}  // namespace kvpool::testing

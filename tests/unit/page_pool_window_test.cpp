// PagePool::lookup_window: a prefix hit on a sliding or chunked pool needs only the blocks its
// last block's window covers (common/geometry.h, first_needed_block). A chain of 8 blocks of 4
// tokens with some blocks cached; the hit point lands before, inside and after the window, with
// holes at every boundary. Each answer is compared with the rule's, and the pool must hold
// exactly the retained pages and count one lookup.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/core/page_pool.h"

namespace kvpool::core {
namespace {

constexpr uint32_t kBlocks = 8, kT = 4;
constexpr Namespace kNs = 1;

BlockHash H(uint64_t id) {
  return BlockHash{0x5100ull + id, id * 0x9E3779B97F4A7C15ull};
}

Geometry geometry(AttentionKind kind, uint32_t window) {
  return Geometry{2, 1, 8, kT, KvDtype::fp16, kind, window};
}

std::vector<BlockHash> chain() {
  std::vector<BlockHash> c;
  for (uint32_t i = 0; i < kBlocks; ++i)
    c.push_back(H(i));
  return c;
}

// A pool whose blocks `cached` of the chain are CACHED (published by another owner, released).
struct Cached {
  explicit Cached(const std::set<uint32_t>& cached) : pool(options()) {
    const OwnerId a = pool.open_owner();
    std::vector<PageId> pages(cached.size(), kNoPage);
    EXPECT_TRUE(pool.alloc(a, pages).ok());
    std::vector<PublishItem> items;
    size_t k = 0;
    for (const uint32_t b : cached) {
      items.push_back({pages[k], H(b)});
      page_of[b] = pages[k++];
    }
    std::vector<PublishResult> out(items.size());
    EXPECT_TRUE(pool.publish(a, kNs, items, out).ok());
    EXPECT_TRUE(pool.release(a, pages).ok());
    EXPECT_TRUE(pool.close_owner(a).ok());
  }
  static PoolOptions options() {
    PoolOptions o;
    o.num_pages = 16;
    o.index_seed = 3;
    return o;
  }
  PagePool pool;
  PageId page_of[kBlocks] = {kNoPage, kNoPage, kNoPage, kNoPage,
                             kNoPage, kNoPage, kNoPage, kNoPage};
};

struct Answer {
  uint32_t hits = 0;
  std::vector<PageId> pages;  // out[0..hits)
};

Answer look(Cached& c, OwnerId b, const Geometry& g, uint32_t allowed = PagePool::kUnlimited) {
  const std::vector<BlockHash> ch = chain();
  std::vector<PageId> out(ch.size(), 7777);
  Answer a;
  EXPECT_TRUE(c.pool.lookup_window(b, kNs, ch, g, out, a.hits, allowed).ok());
  a.pages.assign(out.begin(), out.begin() + a.hits);
  return a;
}

// What the rule answers: the longest n whose blocks [first_needed_block(n), n) are cached, at
// least the contiguous prefix; holes (kNoPage) before the window when n passes the prefix.
std::vector<PageId> expected(const Cached& c, const Geometry& g) {
  uint32_t prefix = 0;
  while (prefix < kBlocks && c.page_of[prefix] != kNoPage)
    ++prefix;
  uint32_t best = prefix;
  for (uint32_t n = prefix + 1; n <= kBlocks; ++n) {
    bool all = true;
    for (uint64_t i = first_needed_block(g, n); i < n; ++i)
      all = all && c.page_of[i] != kNoPage;
    if (all) best = n;
  }
  std::vector<PageId> out(best, kNoPage);
  const uint64_t from = best > prefix ? first_needed_block(g, best) : 0;
  for (uint64_t i = from; i < best; ++i)
    out[i] = c.page_of[i];
  return out;
}

struct WindowCase {
  std::string name;
  AttentionKind kind;
  uint32_t window;
  std::set<uint32_t> cached;
  uint32_t hits;  // what the rule gives, spelled out
};

class LookupWindow : public testing::TestWithParam<WindowCase> {};

TEST_P(LookupWindow, AnswersTheRule) {
  const WindowCase& wc = GetParam();
  Cached c(wc.cached);
  const Geometry g = geometry(wc.kind, wc.window);
  const OwnerId b = c.pool.open_owner();
  const PoolCounters before = c.pool.stats().counters;
  const Answer a = look(c, b, g);
  const std::vector<PageId> want = expected(c, g);
  EXPECT_EQ(a.hits, wc.hits);
  EXPECT_EQ(a.pages, want);
  // B holds exactly the pages answered, once each; nothing else changed hands.
  uint32_t held = 0;
  for (const PageId p : a.pages) {
    if (p == kNoPage) continue;
    EXPECT_EQ(c.pool.held(b, p), 1u) << "page " << p;
    ++held;
  }
  EXPECT_EQ(c.pool.stats().in_use, held);
  const PoolCounters after = c.pool.stats().counters;
  EXPECT_EQ(after.lookups, before.lookups + 1);
  EXPECT_EQ(after.lookup_blocks, before.lookup_blocks + kBlocks);
  EXPECT_EQ(after.hit_blocks, before.hit_blocks + held);
  EXPECT_EQ(c.pool.check_invariants(), "");
}

// Sliding W = 10 tokens over 4-token blocks: a hit of n blocks needs blocks
// [(4n − 9) / 4, n), the last three once n ≥ 4 (n = 8: blocks 5, 6, 7).
INSTANTIATE_TEST_SUITE_P(
    Boundaries, LookupWindow,
    testing::Values(
        WindowCase{"all_cached", AttentionKind::sliding, 10, {0, 1, 2, 3, 4, 5, 6, 7}, 8},
        WindowCase{"head_evicted", AttentionKind::sliding, 10, {3, 4, 5, 6, 7}, 8},
        WindowCase{"hole_before_window", AttentionKind::sliding, 10, {0, 1, 2, 3, 5, 6, 7}, 8},
        WindowCase{"hole_at_window_start", AttentionKind::sliding, 10, {0, 1, 2, 3, 4, 6, 7}, 5},
        WindowCase{"hole_inside_window", AttentionKind::sliding, 10, {0, 1, 2, 3, 4, 5, 7}, 6},
        WindowCase{"hit_point_before_the_end", AttentionKind::sliding, 10, {2, 3, 4, 5}, 6},
        WindowCase{
            "window_wider_than_the_chain", AttentionKind::sliding, 100, {0, 2, 3, 4, 5, 6, 7}, 1},
        WindowCase{"window_of_one_token", AttentionKind::sliding, 1, {6}, 7},
        WindowCase{"nothing_cached", AttentionKind::sliding, 10, {}, 0},
        WindowCase{"chunked_needs_its_chunk", AttentionKind::chunked, 8, {1, 3, 5}, 6},
        WindowCase{"full_needs_everything", AttentionKind::full, 0, {1, 2, 3, 4, 5, 6, 7}, 0}),
    [](const testing::TestParamInfo<WindowCase>& p) { return p.param.name; });

// A window whose pages would pass the owner's quota is not taken: the contiguous prefix answers,
// as lookup() would.
TEST(LookupWindowQuota, AWindowPastTheQuotaFallsBackToThePrefix) {
  Cached c({0, 3, 4, 5, 6, 7});
  const Geometry g = geometry(AttentionKind::sliding, 10);
  const OwnerId b = c.pool.open_owner();
  const Answer a = look(c, b, g, 2);  // the window needs blocks 5, 6, 7: three new pages
  EXPECT_EQ(a.hits, 1u);
  EXPECT_EQ(a.pages, std::vector<PageId>{c.page_of[0]});
  const Answer more = look(c, b, g, 3);  // page 0 is held already: three new ones fit
  EXPECT_EQ(more.hits, 8u);
  EXPECT_EQ(more.pages[7], c.page_of[7]);
  EXPECT_EQ(c.pool.check_invariants(), "");
}

// Pins on a window hit: within the account's limit the window's pages are pinned; past it the
// call fails and the pool is as it was (the references the pre-scan promised were never taken).
TEST(LookupWindowPins, APinPastTheLimitChangesNothing) {
  Cached c({3, 4, 5, 6, 7});
  const Geometry g = geometry(AttentionKind::sliding, 10);
  const OwnerId b = c.pool.open_owner();
  const std::vector<BlockHash> ch = chain();
  std::vector<PageId> out(ch.size(), 7777);
  uint32_t hits = 0;
  CallHints pin;
  pin.hints.pin_ttl_ms = 60'000;
  pin.pin_limit = 2;  // the window needs three pages
  const PoolStats before = c.pool.stats();
  EXPECT_EQ(c.pool.lookup_window(b, kNs, ch, g, out, hits, PagePool::kUnlimited, pin).code(),
            Errc::pin_limit_exceeded);
  EXPECT_EQ(hits, 0u);
  EXPECT_EQ(c.pool.stats().in_use, before.in_use);
  EXPECT_EQ(c.pool.stats().counters.lookups, before.counters.lookups);
  pin.pin_limit = 3;
  ASSERT_TRUE(c.pool.lookup_window(b, kNs, ch, g, out, hits, PagePool::kUnlimited, pin).ok());
  EXPECT_EQ(hits, 8u);
  EXPECT_EQ(c.pool.stats().in_use, 3u);
  EXPECT_EQ(c.pool.check_invariants(), "");
}

// A chain naming one hash twice (only a broken or hostile client sends one) is answered without
// harm: each page answered holds one reference per time the answer names it, as lookup()'s does.
TEST(LookupWindowPins, AChainNamingAHashTwiceIsAnsweredSafely) {
  for (const uint32_t twice : {1u, 5u, 6u}) {
    Cached c({0, 1, 3, 4, 5, 6, 7});
    const Geometry g = geometry(AttentionKind::sliding, 10);
    const OwnerId b = c.pool.open_owner();
    std::vector<BlockHash> ch = chain();
    ch[twice + 1] = ch[twice];
    std::vector<PageId> out(ch.size(), 7777);
    uint32_t hits = 0;
    ASSERT_TRUE(c.pool.lookup_window(b, kNs, ch, g, out, hits).ok());
    std::map<PageId, uint32_t> named;
    for (uint32_t i = 0; i < hits; ++i) {
      if (out[i] != kNoPage) ++named[out[i]];
    }
    for (const auto& [page, n] : named)
      EXPECT_EQ(c.pool.held(b, page), n) << "block " << twice << " twice, page " << page;
    EXPECT_EQ(c.pool.stats().in_use, named.size());
    EXPECT_EQ(c.pool.check_invariants(), "");
  }
}

// The rule itself (common/geometry.h).
TEST(FirstNeededBlock, FollowsTheWindowAndTheChunk) {
  const Geometry sliding = geometry(AttentionKind::sliding, 10);
  EXPECT_EQ(first_needed_block(sliding, 1), 0u);
  EXPECT_EQ(first_needed_block(sliding, 2), 0u);  // p = 8 sees keys from 0
  EXPECT_EQ(first_needed_block(sliding, 3), 0u);  // p = 12 from 3
  EXPECT_EQ(first_needed_block(sliding, 4), 1u);  // p = 16 from 7
  EXPECT_EQ(first_needed_block(sliding, 8), 5u);  // p = 32 from 23
  const Geometry one = geometry(AttentionKind::sliding, 1);
  EXPECT_EQ(first_needed_block(one, 5), 4u);  // sees only itself: the last block, by the clamp
  const Geometry chunked = geometry(AttentionKind::chunked, 12);
  EXPECT_EQ(first_needed_block(chunked, 3), 2u);  // p = 12 starts a chunk: clamp to n − 1
  EXPECT_EQ(first_needed_block(chunked, 4), 3u);  // p = 16 in chunk [12, 24): block 3
  EXPECT_EQ(first_needed_block(chunked, 5), 3u);  // p = 20 in chunk [12, 24): block 3
  EXPECT_EQ(first_needed_block(geometry(AttentionKind::full, 0), 8), 0u);
  EXPECT_EQ(first_needed_block(sliding, 0), 0u);
}

}  // namespace
}  // namespace kvpool::core

// Integration: mixed precision on pools whose queries see a window of keys (MixedSequence over a
// bf16 and an fp8 pool of one sliding or chunked shape, a real kvpoold and real worker
// processes). Blocks before the first query's window or chunk are let go rather than converted;
// the window's blocks older than recent_tokens go down to fp8; a second worker resumes from both
// pools and decodes the same bits; a hit is never longer than what its first query can read.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/mixed_sequence.h"
#include "client/worker/pool_kernels.h"
#include "common/block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/mixed_precision_util.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing::mixed {
namespace {

// Publishes blocks `which` of `chain` in `c` on fresh pages and leaves them cached (their bytes
// are never read: no query of these tests reaches them).
void publish_cached(Connection& c, const std::vector<BlockHash>& chain,
                    const std::vector<uint32_t>& which) {
  auto pages = c.alloc(static_cast<uint32_t>(which.size()));
  ASSERT_TRUE(pages.ok());
  std::vector<PublishItem> items;
  for (size_t i = 0; i < which.size(); ++i)
    items.push_back({pages.value()[i], chain[which[i]]});
  ASSERT_TRUE(c.publish(items).ok());
  ASSERT_TRUE(c.release(pages.value()).ok());
}

// An extend over the sequence's tokens [from, tokens()) (layer 1), mixed when it has older pages.
std::string extend_new_tokens(Worker& w, const MixedSequence& s, uint32_t from) {
  const uint32_t n_new = s.tokens() - from;
  std::vector<float> q(size_t{n_new} * kQHeads * kDim, 0.5f), out(q.size());
  const uint32_t ctx = s.tokens(), older = s.older_pages();
  const uint32_t offsets[2] = {0, n_new};
  kernels::ExtendArgs e;
  e.layer = 1;
  e.num_seqs = 1;
  e.num_q_heads = kQHeads;
  e.q = q.data();
  e.out = out.data();
  e.q_offsets = offsets;
  e.block_tables = s.block_table().data();
  e.block_table_stride = static_cast<uint32_t>(s.block_table().size());
  e.context_lens = &ctx;
  e.scale = 0.125f;
  if (older == 0) return w.rk->extend(e, n_new);
  return w.rk->extend_mixed(e, *w.ok_, &older, n_new);
}

// A sliding window of 64 tokens: at 100 tokens the next query reads keys 36..99, blocks 2..6.
// Publishing lets go of blocks 0 and 1 (before the window) and converts 2 and 3 (older than 32
// tokens); a second worker finds the window's blocks, adopts the first's fp8 pages when it ages
// its own, and decodes the same bits, within fp8's error of a bf16 decode.
TEST(MixedPrecision, ASlidingSequenceLetsGoBeforeItsWindowAndAgesTheRest) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  TempDir dir;
  const std::string first = dir.file("first"), bf16 = dir.file("bf16"), second = dir.file("second");
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "a", "slide", "slide8");
              if (!w.ok()) return 10;
              auto s = w.sequence();
              if (!s) return 11;
              if (auto c = s->begin(prompt()); !c.ok() || c.value() != 0) return 12;
              if (!write_tokens(*w.rk, *s, 0, kPrompt).empty()) return 13;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(bf16, out)) return 14;
              auto converted = s->publish_full();
              if (!converted.ok() || converted.value() != 2 || s->older_pages() != 4) return 15;
              const std::vector<PageId>& t = s->block_table();
              if (t[0] != kNoPage || t[1] != kNoPage || t[2] == kNoPage) return 16;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(first, out)) return 17;
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 18;
              return 0;
            }),
            0);
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "b", "slide", "slide8");
              if (!w.ok()) return 20;
              auto s = w.sequence();
              if (!s) return 21;
              auto cached = s->begin(prompt());
              if (!cached.ok() || cached.value() != 96) return 22;
              if (s->older_pages() != 4 || s->adopted() != 2 || s->converted() != 0) return 23;
              if (!write_tokens(*w.rk, *s, 96, kPrompt).empty()) return 24;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(second, out)) return 25;
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 26;
              return 0;
            }),
            0);
  expect_same_mixed_decode(first, second, bf16);
}

// A sliding sequence that resumes from a short hit keeps what its prompt's new tokens still
// read: the first new token (32) sees keys 0..32, so blocks 0 and 1 stay (in 8 bits: older than
// recent_tokens), though the prompt's last token sees only keys 68 on; an extend over the new
// tokens reads them.
TEST(MixedPrecision, ASlidingSequenceKeepsWhatItsPromptsNewTokensRead) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "a", "slide", "slide8");
              if (!w.ok()) return 10;
              auto s = w.sequence();
              if (!s || !s->begin(prompt()).ok()) return 11;
              if (!write_tokens(*w.rk, *s, 0, kPrompt).empty()) return 12;
              return s->publish_full().ok() ? 0 : 13;
            }),
            0);
  Worker w(d, "b", "slide", "slide8");
  ASSERT_TRUE(w.ok());
  auto s = w.sequence();
  ASSERT_TRUE(s);
  std::vector<uint32_t> p = prompt();
  p.resize(size_t{2} * kT);  // A's first two blocks, then 100 tokens of its own
  for (uint32_t i = 0; i < 100; ++i)
    p.push_back(50000 + i);
  auto cached = s->begin(p);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  ASSERT_EQ(cached.value(), 2 * kT);
  ASSERT_EQ(s->older_pages(), 2u);
  EXPECT_NE(s->block_table()[0], kNoPage);
  EXPECT_NE(s->block_table()[1], kNoPage);
  ASSERT_EQ(write_tokens(*w.rk, *s, 2 * kT, s->tokens()), "");
  EXPECT_EQ(extend_new_tokens(w, *s, 2 * kT), "");
}

// Chunks of 64 tokens (4 blocks) and a 120-token prompt (7 full blocks): the last token's chunk
// is tokens 64..127. Publishing lets go of blocks 0–3 (earlier chunks) and converts block 4 (its
// last token 79 is 40 behind the head; blocks 5–6 are within recent_tokens). A second worker
// finds block 4 in fp8 (the fp8 pool's lookup needs nothing before the chunk) and 5–6 in bf16,
// and decodes the same bits, within fp8's error of a bf16 decode.
TEST(MixedPrecision, AChunkedSequenceLetsGoOfEarlierChunksAndAgesItsOwn) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  TempDir dir;
  const std::string first = dir.file("first"), bf16 = dir.file("bf16"), second = dir.file("second");
  constexpr uint32_t kLen = 120;
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "a", "chunk", "chunk8");
              if (!w.ok()) return 10;
              auto s = w.sequence();
              if (!s) return 11;
              if (auto c = s->begin(prompt(kLen)); !c.ok() || c.value() != 0) return 12;
              if (!write_tokens(*w.rk, *s, 0, kLen).empty()) return 13;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(bf16, out)) return 14;
              auto converted = s->publish_full();
              if (!converted.ok() || converted.value() != 1 || s->older_pages() != 5) return 15;
              const std::vector<PageId>& t = s->block_table();
              for (uint32_t b = 0; b < 4; ++b) {
                if (t[b] != kNoPage) return 16;
              }
              if (t[4] == kNoPage || t[5] == kNoPage) return 17;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(first, out)) return 18;
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 19;
              return 0;
            }),
            0);
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "b", "chunk", "chunk8");
              if (!w.ok()) return 20;
              auto s = w.sequence();
              if (!s) return 21;
              auto cached = s->begin(prompt(kLen));
              if (!cached.ok() || cached.value() != 7 * kT) return 22;
              if (s->older_pages() != 5 || s->adopted() != 0 || s->converted() != 0) return 23;
              if (!write_tokens(*w.rk, *s, 7 * kT, kLen).empty()) return 24;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(second, out)) return 25;
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 26;
              return 0;
            }),
            0);
  expect_same_mixed_decode(first, second, bf16);
}

// Each pool's lookup judges its own blocks, and the bf16 pool's counts chunks from the first
// block the fp8 pool lacks. Here the fp8 pool holds blocks 0–4 and the bf16 pool 5, 7, 8 and 9
// (not 6) of a 170-token prompt. The bf16 lookup of blocks 5–9, counting chunks from block 5,
// answers them with 5–8 as holes (only block 9 is in its last chunk); but the sequence's own
// chunk from token 160 starts at block 8, a hole. The hit is cut to 8 blocks, where the next
// query (token 128) reads nothing cached, and an extend over the prompt's new tokens runs.
TEST(MixedPrecision, AChunkedHitIsCutWhereItsChunkHasAHole) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  constexpr uint32_t kLen = 170;  // 10 full blocks
  const std::vector<uint32_t> p = prompt(kLen);
  const std::vector<BlockHash> chain = chain_of(p);
  Worker setup(d, "setup", "chunk", "chunk8");
  ASSERT_TRUE(setup.ok());
  publish_cached(*setup.older, chain, {0, 1, 2, 3, 4});
  publish_cached(*setup.recent, chain, {5, 7, 8, 9});

  Worker w(d, "b", "chunk", "chunk8");
  ASSERT_TRUE(w.ok());
  auto s = w.sequence();
  ASSERT_TRUE(s);
  auto cached = s->begin(p);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), 8 * kT);
  for (uint32_t b = 8; b < s->block_table().size(); ++b)
    EXPECT_NE(s->block_table()[b], kNoPage) << "block " << b;
  ASSERT_EQ(write_tokens(*w.rk, *s, cached.value(), kLen), "");
  EXPECT_EQ(extend_new_tokens(w, *s, cached.value()), "");
  // Only the sequence's own pages are held: the cut hit's block 9 and the earlier chunks' went
  // back.
  EXPECT_EQ(held(*w.recent), 3u);
  EXPECT_EQ(held(*w.older), 0u);
  s.reset();
  EXPECT_EQ(held(*w.recent), 0u);
}

// A prompt that ends where a chunk ends (128 tokens, chunks of 64), cached whole: the bf16 pool
// holds its last chunk (blocks 4–7), earlier chunks are gone. The hit serves the next token's
// query (position 128, a new chunk: it reads no cached key), so all 128 tokens count as cached,
// nothing before the next chunk is kept, and the next token decodes.
TEST(MixedPrecision, AChunkedPromptCachedWholeServesItsNextToken) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  constexpr uint32_t kLen = 128;
  const std::vector<uint32_t> p = prompt(kLen);
  Worker setup(d, "setup", "chunk", "chunk8");
  ASSERT_TRUE(setup.ok());
  publish_cached(*setup.recent, chain_of(p), {4, 5, 6, 7});

  Worker w(d, "b", "chunk", "chunk8");
  ASSERT_TRUE(w.ok());
  auto s = w.sequence();
  ASSERT_TRUE(s);
  auto cached = s->begin(p);
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), kLen);
  EXPECT_EQ(held(*w.recent), 0u);  // the whole prompt is before the next query's chunk
  auto slot = s->append(7);
  ASSERT_TRUE(slot.ok()) << slot.error().message;
  ASSERT_EQ(write_tokens(*w.rk, *s, kLen, kLen + 1), "");
  std::vector<float> out;
  EXPECT_EQ(decode(*w.rk, *w.ok_, *s, out), "");
  EXPECT_EQ(held(*w.recent), 1u);
  s.reset();
  EXPECT_EQ(held(*w.recent), 0u);
  EXPECT_EQ(held(*w.older), 0u);
}

}  // namespace
}  // namespace kvpool::testing::mixed

// Integration: mixed precision with a real kvpoold and real worker processes (MixedSequence over a
// bf16 pool and an fp8 pool of one shape; docs/ARCHITECTURE.md, "Mixed precision"). A worker's
// blocks older than recent_tokens go down to fp8 when it publishes; a second worker begins the same
// prompt, finds the old blocks in the fp8 pool and the newer ones in the bf16 pool, and decodes
// bit for bit what the first one decoded, within fp8's error of an all-bf16 decode. While a
// worker converts, others find only the bf16 block (the fp8 page is published whole or not at
// all); a worker killed mid-conversion leaves no page held and no block in the fp8 index. Pools
// that cannot pair are refused by name. Sliding and chunked pools:
// mixed_precision_window_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
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

// The older pool holds two pages: four aged blocks cannot all go down at once.
constexpr const char* kSmallOlderConfig = R"(
backend: host
pools:
  - name: recent
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16}
    capacity: 32 pages
  - name: older
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp8_e4m3}
    capacity: 2 pages
)";

TEST(MixedPrecision, AgedBlocksGoToFp8AndAnotherWorkerDecodesTheSameBits) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  TempDir dir;
  const std::string first = dir.file("first"), bf16 = dir.file("bf16"), second = dir.file("second");
  // Worker A: computes the prompt, decodes in bf16, publishes (aging 4 blocks), decodes mixed.
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "a");
              if (!w.ok()) return 10;
              auto s = w.sequence();
              if (!s) return 11;
              auto cached = s->begin(prompt());
              if (!cached.ok() || cached.value() != 0) return 12;
              if (!write_tokens(*w.rk, *s, 0, kPrompt).empty()) return 13;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(bf16, out)) return 14;
              auto converted = s->publish_full();
              if (!converted.ok() || converted.value() != 4 || s->older_pages() != 4) return 15;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(first, out)) return 16;
              // The sequence gives back every reference it took (the connections stay open, so
              // the daemon's cleanup at exit does not hide a leak).
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 17;
              return 0;
            }),
            0);
  // Worker B: the same prompt is cached, 4 blocks in fp8 and 2 in bf16; only the last 4 tokens
  // are computed.
  ASSERT_EQ(run_worker([&] {
              Worker w(d, "b");
              if (!w.ok()) return 20;
              auto s = w.sequence();
              if (!s) return 21;
              auto cached = s->begin(prompt());
              if (!cached.ok()) return 22;
              if (cached.value() != 96 || s->older_pages() != 4 || s->converted() != 0) return 23;
              if (!write_tokens(*w.rk, *s, 96, kPrompt).empty()) return 24;
              std::vector<float> out;
              if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(second, out)) return 25;
              s.reset();
              if (held(*w.recent) != 0 || held(*w.older) != 0) return 26;
              return 0;
            }),
            0);
  expect_same_mixed_decode(first, second, bf16);

  // Nothing is held once both workers are gone; the blocks stay cached in their pools.
  auto probe = attach(d, "probe", "older");
  auto probe_recent = attach(d, "probe", "recent");
  ASSERT_TRUE(probe && probe_recent);
  EXPECT_EQ(in_use(*probe), 0u);
  EXPECT_EQ(in_use(*probe_recent), 0u);
}

TEST(MixedPrecision, ReadersNeverSeeAHalfConvertedBlockAndAKilledConverterLeaksNothing) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  Pipe converted, go_on;
  const pid_t child = spawn_worker([&] {
    go_on.close_write();  // a test that dies makes go_on.wait() return
    Worker w(d, "converter");
    if (!w.ok()) return 10;
    auto s = w.sequence();
    if (!s) return 11;
    if (!s->begin(prompt()).ok()) return 12;
    if (!write_tokens(*w.rk, *s, 0, kPrompt).empty()) return 13;
    // Between the conversion kernel and the publish: tell the test, wait, and die there.
    s->set_after_convert([&] {
      converted.signal();
      go_on.wait();
      ::raise(SIGKILL);
    });
    (void)s->publish_full();
    return 14;  // not reached
  });
  converted.close_write();  // a worker that fails before its hook makes converted.wait() false
  ASSERT_TRUE(converted.wait()) << "the converter exited with " << wait_worker(child);
  struct LetGo {  // whatever fails below, the converter is let go on (and dies)
    Pipe& p;
    ~LetGo() { p.signal(); }
  } let_go{go_on};
  // Mid-conversion: the fp8 pages exist and are written, but no reader can find them; the bf16
  // blocks are all there.
  Worker reader(d, "reader");
  ASSERT_TRUE(reader.ok());
  const std::vector<BlockHash> chain = chain_of(prompt());
  auto in_older = reader.older->lookup(chain);
  ASSERT_TRUE(in_older.ok());
  EXPECT_TRUE(in_older.value().empty()) << "a block was found in fp8 before it was published";
  EXPECT_EQ(in_use(*reader.older), 4u);  // the converter's unpublished fp8 pages
  auto in_recent = reader.recent->lookup(chain);
  ASSERT_TRUE(in_recent.ok());
  EXPECT_EQ(in_recent.value().size(), 6u);
  ASSERT_TRUE(reader.recent->release(in_recent.value()).ok());

  go_on.signal();
  EXPECT_EQ(wait_worker(child), 128 + SIGKILL);
  // The daemon takes the dead session's pages back: none held, the fp8 index still without them.
  for (int i = 0; i < 200 && (in_use(*reader.older) != 0 || in_use(*reader.recent) != 0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(in_use(*reader.older), 0u);
  EXPECT_EQ(in_use(*reader.recent), 0u);
  auto after = reader.older->lookup(chain);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after.value().empty());
  EXPECT_TRUE(d.running());
}

TEST(MixedPrecision, PoolsThatCannotPairAreRefusedByName) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  auto recent = attach(d, "w", "recent");
  auto other = attach(d, "w", "other");
  auto recent2 = attach(d, "w2", "recent");
  ASSERT_TRUE(recent && other && recent2);
  PoolKernels rk(*recent), ok(*other), rk2(*recent2);
  BlockHasher hasher;
  const BlockHash root = root_of(hasher);
  auto shape = MixedSequence::create(*recent, rk, *other, ok, hasher, root, kRecent);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.error().message.find("pool recent and pool other are not of one shape"),
            std::string::npos)
      << shape.error().message;
  auto same = MixedSequence::create(*recent, rk, *recent2, rk2, hasher, root, kRecent);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.error().message.find("pool recent is bf16 and pool recent bf16: the recent pool "
                                      "keeps 16 bits"),
            std::string::npos)
      << same.error().message;
  auto slide8 = attach(d, "w4", "slide8");
  ASSERT_TRUE(slide8);
  PoolKernels s8k(*slide8);
  auto kinds = MixedSequence::create(*recent, rk, *slide8, s8k, hasher, root, kRecent);
  ASSERT_FALSE(kinds.ok());
  EXPECT_NE(kinds.error().message.find("pool recent and pool slide8 are not of one shape"),
            std::string::npos)
      << kinds.error().message;
  auto older = attach(d, "w3", "older");
  ASSERT_TRUE(older);
  PoolKernels olk(*older);
  auto swapped = MixedSequence::create(*recent, olk, *older, rk, hasher, root, kRecent);
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.error().message.find("recent_k and older_k must be the PoolKernels"),
            std::string::npos)
      << swapped.error().message;
  auto zero = MixedSequence::create(*recent, rk, *older, olk, hasher, root, 0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().message, "recent_tokens must be at least 1");
  // A mixed decode whose older pool is the recent pool itself is refused too.
  std::vector<float> out;
  const uint32_t n = 1, ctx = 1;
  const PageId page = 0;
  kernels::DecodeArgs a;
  a.num_seqs = 1;
  a.num_q_heads = kQHeads;
  a.block_tables = &page;
  a.block_table_stride = 1;
  a.context_lens = &ctx;
  EXPECT_EQ(rk.decode_mixed(a, rk, &n, 1), "the older pool is this pool");
}

// Two workers convert the same blocks at once (the second one from its begin(), which ages the
// bf16 hits it found): the later publish gets the first's pages as duplicates, adopts them and
// gives its own back; both then read the same fp8 pages.
TEST(MixedPrecision, AConversionThatLosesTheRaceAdoptsTheWinnersPages) {
  Daemon d(kConfig);
  ASSERT_TRUE(d.start()) << d.log();
  TempDir dir;
  const std::string slow_out = dir.file("slow");
  Pipe converted, go_on;
  const pid_t slow = spawn_worker([&] {
    go_on.close_write();
    Worker w(d, "slow");
    if (!w.ok()) return 10;
    auto s = w.sequence();
    if (!s || !s->begin(prompt()).ok()) return 11;
    if (!write_tokens(*w.rk, *s, 0, kPrompt).empty()) return 12;
    s->set_after_convert([&] {
      converted.signal();
      go_on.wait();
    });
    auto r = s->publish_full();
    if (!r.ok() || r.value() != 0 || s->converted() != 0 || s->adopted() != 4) return 13;
    if (s->older_pages() != 4) return 14;
    std::vector<float> out;
    if (!decode(*w.rk, *w.ok_, *s, out).empty() || !save(slow_out, out)) return 15;
    s.reset();
    return held(*w.older) == 0 && held(*w.recent) == 0 ? 0 : 16;  // its fp8 copies went back
  });
  converted.close_write();
  ASSERT_TRUE(converted.wait()) << "the slow worker exited with " << wait_worker(slow);
  // Whatever fails below, the slow worker is let go on (else it would wait forever).
  struct LetGo {
    Pipe& p;
    ~LetGo() { p.signal(); }
  } let_go{go_on};
  // Meanwhile this worker begins the same prompt: the slow one published it in bf16 before it
  // started converting, so every full block is cached, and this begin() ages the four old ones
  // itself, publishing them in fp8 first.
  Worker fast(d, "fast");
  ASSERT_TRUE(fast.ok());
  auto s = fast.sequence();
  ASSERT_TRUE(s);
  auto cached = s->begin(prompt());
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(cached.value(), 96u);
  EXPECT_EQ(s->converted(), 4u);
  EXPECT_EQ(s->older_pages(), 4u);
  ASSERT_EQ(write_tokens(*fast.rk, *s, 96, kPrompt), "");
  auto r = s->publish_full();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value(), 0u);
  std::vector<float> fast_out;
  ASSERT_EQ(decode(*fast.rk, *fast.ok_, *s, fast_out), "");
  go_on.signal();
  EXPECT_EQ(wait_worker(slow), 0);
  EXPECT_EQ(load(slow_out), fast_out);
  s.reset();
  EXPECT_EQ(in_use(*fast.older), 0u);
  EXPECT_EQ(in_use(*fast.recent), 0u);
}

// An older pool with room for two of the four aged blocks: two go down (a batch of four is
// halved), the other two stay in bf16, and the sequence decodes across the boundary.
TEST(MixedPrecision, BlocksTheOlderPoolCannotTakeStayInSixteenBits) {
  Daemon d(kSmallOlderConfig);
  ASSERT_TRUE(d.start()) << d.log();
  Worker w(d, "w");
  ASSERT_TRUE(w.ok());
  auto s = w.sequence();
  ASSERT_TRUE(s);
  ASSERT_TRUE(s->begin(prompt()).ok());
  ASSERT_EQ(write_tokens(*w.rk, *s, 0, kPrompt), "");
  auto r = s->publish_full();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value(), 2u);
  EXPECT_EQ(s->older_pages(), 2u);
  std::vector<float> out;
  ASSERT_EQ(decode(*w.rk, *w.ok_, *s, out), "");
  for (const float x : out)
    ASSERT_TRUE(std::isfinite(x));
  // The next publish tries again and still finds no room: nothing changes, nothing fails.
  for (uint32_t t = 0; t < kT; ++t)
    ASSERT_TRUE(s->append(5000 + t).ok());
  ASSERT_EQ(write_tokens(*w.rk, *s, kPrompt, kPrompt + kT), "");
  r = s->publish_full();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value(), 0u);
  EXPECT_EQ(s->older_pages(), 2u);
  // A second sequence of the prompt finds blocks 0–1 in fp8 and 2–5 in bf16; its begin() cannot
  // move 2–3 down (the fp8 pool's two pages are held) and still succeeds, with them in bf16.
  Worker second(d, "second");
  ASSERT_TRUE(second.ok());
  auto s2 = second.sequence();
  ASSERT_TRUE(s2);
  auto cached = s2->begin(prompt());
  ASSERT_TRUE(cached.ok()) << cached.error().message;
  EXPECT_EQ(cached.value(), 96u);
  EXPECT_EQ(s2->older_pages(), 2u);
  EXPECT_EQ(s2->converted(), 0u);
  s2.reset();
  s.reset();
  EXPECT_EQ(in_use(*w.older), 0u);
  EXPECT_EQ(in_use(*w.recent), 0u);
}

}  // namespace
}  // namespace kvpool::testing::mixed

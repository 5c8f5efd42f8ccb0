// Eviction through a real kvpoold and real worker processes: client pins keep pages across
// sessions until they expire, hints are checked against the tenant's limits and refused when
// malformed, the C API and SequenceCache carry hints, and a pool's policy reloads live without
// losing its cache. The policies themselves are tested in tests/unit (eviction_policy_test,
// page_pool_random_test, page_pool_pin_test).
#include <signal.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "client/worker/sequence_cache.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_frames.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;
using Clock = std::chrono::steady_clock;

const std::string kCtl = KVPOOLCTL_BIN;

std::string pool_config(const std::string& policy, const std::string& limits = "") {
  return R"(
pools:
  - name: default
    policy: )" +
         policy + R"(
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 16 pages
)" + limits;
}

BlockHash hash_of(uint32_t i) {
  return BlockHash{0x5EED0000ull + i, 0xC0FFEEull * (i + 1)};
}

std::vector<BlockHash> chain(uint32_t n) {
  std::vector<BlockHash> c;
  for (uint32_t i = 0; i < n; ++i)
    c.push_back(hash_of(i));
  return c;
}

nlohmann::json status_json(const Daemon& d) {
  std::string out;
  EXPECT_EQ(run_command(kCtl + " status --json --socket " + d.socket(), out), 0) << out;
  return nlohmann::json::parse(out);
}

// alloc + publish blocks [0, n) with `hints`, then release: the pages stay cached.
int cache_chain(Connection& c, uint32_t n, const PageHints& hints) {
  auto pages = c.alloc(n, hints);
  if (!pages.ok()) return 10;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], hash_of(i)});
  if (!c.publish(items).ok()) return 11;
  std::vector<PageId> tail_first(pages.value().rbegin(), pages.value().rend());
  return c.release(tail_first).ok() ? 0 : 12;
}

TEST(Eviction, PinsKeepPagesAcrossSessionsUntilTheyExpire) {
  Daemon d(pool_config("prefix", "limits: {max_pin_ttl_ms: 60000}\n"));
  ASSERT_TRUE(d.start()) << d.log();
  constexpr uint32_t kPinMs = 1500;
  // A worker process caches a 4-block conversation pinned for 1.5 s, then exits: its session
  // closes, the pins stay (they hold pages, not sessions).
  const auto pinned_at = Clock::now();
  ASSERT_EQ(run_worker([&] {
              auto c = Connection::attach(d.socket(), "chat");
              if (!c.ok()) return 1;
              return cache_chain(*c.value(), 4, PageHints{Priority::conversation, kPinMs});
            }),
            0);
  auto w = attach(d, "pressure");
  ASSERT_NE(w, nullptr);
  stats::PoolStats s = pool_stats(*w);
  EXPECT_EQ(s.cached, 4u);
  EXPECT_EQ(s.pinned, 4u);
  EXPECT_EQ(s.pinned_cached, 4u);
  EXPECT_EQ(std::string(s.policy), "prefix");
  auto st = status_json(d);
  EXPECT_EQ(st["policy"], "prefix");

  // While pinned, the 4 pages are not evictable: the whole pool cannot be handed out, the rest
  // can, and the conversation is still there afterwards.
  if (Clock::now() - pinned_at < std::chrono::milliseconds(kPinMs - 500)) {
    auto all = w->alloc(16);
    EXPECT_EQ(all.error().status.code(), Errc::out_of_pages);
    auto rest = w->alloc(12);
    ASSERT_TRUE(rest.ok()) << rest.error().message;
    ASSERT_TRUE(w->release(rest.value()).ok());
    auto hits = w->lookup(chain(4));
    ASSERT_TRUE(hits.ok());
    EXPECT_EQ(hits.value().size(), 4u);
    ASSERT_TRUE(w->release(hits.value()).ok());
  } else {
    GTEST_SKIP() << "the machine was too slow to act within the pin's TTL";
  }

  // Once the TTL has run, they are ordinary cached pages again: a full alloc evicts them.
  std::this_thread::sleep_until(pinned_at + std::chrono::milliseconds(kPinMs + 100));
  auto all = w->alloc(16);
  ASSERT_TRUE(all.ok()) << all.error().message;
  s = pool_stats(*w);
  EXPECT_EQ(s.pinned, 0u);
  EXPECT_EQ(s.pins_expired, 4u);
  EXPECT_EQ(w->lookup(chain(4)).value().size(), 0u);
}

TEST(Eviction, RenewingItsOwnPinsCostsATenantNothing) {
  Daemon d(
      pool_config("prefix", "limits: {max_pin_ttl_ms: 60000, max_pinned_pages_per_tenant: 4}\n"));
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(cache_chain(*w, 4, PageHints{Priority::conversation, 30000}), 0);
  ASSERT_EQ(pool_stats(*w).pinned, 4u);  // the tenant is at its limit
  // A lookup that renews the same four pins is not four more.
  auto renewed = w->lookup(chain(4), PageHints{Priority::conversation, 50000});
  ASSERT_TRUE(renewed.ok()) << renewed.error().message;
  EXPECT_EQ(renewed.value().size(), 4u);
  EXPECT_EQ(pool_stats(*w).pinned, 4u);
  ASSERT_TRUE(w->release(renewed.value()).ok());
  // Misses cost nothing either: a chain of 6 whose last 2 are not cached renews the 4.
  auto longer = w->lookup(chain(6), PageHints{Priority::conversation, 50000});
  ASSERT_TRUE(longer.ok()) << longer.error().message;
  EXPECT_EQ(longer.value().size(), 4u);
  ASSERT_TRUE(w->release(longer.value()).ok());
  // A fifth page is one too many.
  auto fifth = w->alloc(1, PageHints{Priority::none, 1000});
  ASSERT_FALSE(fifth.ok());
  EXPECT_EQ(fifth.error().status.code(), Errc::pin_limit_exceeded);
}

TEST(Eviction, PinsOfEveryTenantTogetherStopAtThePoolsCap) {
  // Each tenant may pin the whole pool, but the pool lets half of its 16 pages be pinned.
  Daemon d(pool_config("prefix",
                       "limits: {max_pin_ttl_ms: 60000, max_pinned_pages_per_tenant: 16, "
                       "max_pinned_pool_percent: 50}\n"));
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "w");
  ASSERT_NE(w, nullptr);
  auto too_many = w->alloc(9, PageHints{Priority::system, 30000});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().status.code(), Errc::pin_limit_exceeded);
  EXPECT_NE(too_many.error().message.find("limits.max_pinned_pool_percent = 50"), std::string::npos)
      << too_many.error().message;
  EXPECT_EQ(pool_stats(*w).in_use, 0u);
  ASSERT_EQ(cache_chain(*w, 8, PageHints{Priority::system, 30000}), 0);
  EXPECT_EQ(pool_stats(*w).pinned, 8u);
  // Unpinned work still gets the other half of the pool, evicting what is not pinned.
  auto unpinned = w->alloc(8);
  ASSERT_TRUE(unpinned.ok()) << unpinned.error().message;
  ASSERT_TRUE(w->release(unpinned.value()).ok());
  auto again = w->alloc(8);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(w->lookup(chain(8)).value().size(), 8u);  // the pinned blocks stayed
}

TEST(Eviction, HintsAreCheckedAgainstTheTenantsLimits) {
  Daemon d(
      pool_config("prefix", "limits: {max_pin_ttl_ms: 1000, max_pinned_pages_per_tenant: 4}\n"));
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "w");
  ASSERT_NE(w, nullptr);

  // A TTL above limits.max_pin_ttl_ms: refused, named, nothing allocated.
  auto too_long = w->alloc(2, PageHints{Priority::none, 5000});
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().status.code(), Errc::invalid_argument);
  EXPECT_NE(too_long.error().message.find("limits.max_pin_ttl_ms = 1000"), std::string::npos)
      << too_long.error().message;
  EXPECT_EQ(pool_stats(*w).in_use, 0u);

  // More pins than the tenant may hold: refused, named, nothing changed.
  auto too_many = w->alloc(5, PageHints{Priority::conversation, 800});
  ASSERT_FALSE(too_many.ok());
  EXPECT_EQ(too_many.error().status.code(), Errc::pin_limit_exceeded);
  EXPECT_NE(too_many.error().message.find("max_pinned_pages_per_tenant"), std::string::npos)
      << too_many.error().message;
  EXPECT_EQ(pool_stats(*w).in_use, 0u);
  EXPECT_EQ(pool_stats(*w).pinned, 0u);

  // Within the limit; pinning the same pages again costs nothing more; one more page does.
  auto four = w->alloc(4, PageHints{Priority::conversation, 800});
  ASSERT_TRUE(four.ok()) << four.error().message;
  EXPECT_TRUE(w->retain(four.value(), PageHints{Priority::system, 900}).ok());
  EXPECT_EQ(pool_stats(*w).pinned, 4u);
  auto fifth = w->alloc(1, PageHints{Priority::none, 100});
  EXPECT_EQ(fifth.error().status.code(), Errc::pin_limit_exceeded);
  // Without a pin the same call is fine: priorities alone are not limited.
  EXPECT_TRUE(w->alloc(1, PageHints{Priority::one_off, 0}).ok());

  // A malformed hint (an unknown priority class) is refused by the decoder with its field named.
  const int fd = connect_raw(d.socket());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, frame(wire::HelloRequest{"raw", ""}, 1)));
  ASSERT_FALSE(read_raw_reply(fd, 5000).closed);
  std::vector<std::byte> bad = frame(wire::AllocRequest{1, PageHints{Priority::system, 0}}, 2);
  bad[wire::kHeaderBytes + 4] = std::byte{9};  // the priority byte, after the flagged count
  ASSERT_TRUE(send_all(fd, bad));
  const RawReply r = read_raw_reply(fd, 5000);
  ASSERT_FALSE(r.closed);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status.code(), Errc::malformed_frame);
  EXPECT_NE(r.error->message.find("hints.priority 9"), std::string::npos) << r.error->message;
  ::close(fd);
  EXPECT_EQ(pool_stats(*w).in_use, 5u);  // the 4 pinned + 1, nothing from the raw session
}

TEST(Eviction, TheCApiAndSequenceCacheCarryHints) {
  Daemon d(pool_config("prefix"));
  ASSERT_TRUE(d.start()) << d.log();
  kvpool_conn* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c-worker", nullptr, &c, err, sizeof err), 0) << err;
  const kvpool_hints unknown{9, 0};
  EXPECT_EQ(kvpool_set_hints(c, &unknown), static_cast<int>(Errc::invalid_argument));
  EXPECT_NE(std::string(kvpool_last_error(c)).find("priority 9"), std::string::npos);
  const kvpool_hints pin{KVPOOL_PRIORITY_SYSTEM, 60000};
  ASSERT_EQ(kvpool_set_hints(c, &pin), 0);
  kvpool_page_id pages[3];
  ASSERT_EQ(kvpool_alloc(c, 3, pages), 0) << kvpool_last_error(c);
  auto w = attach(d, "observer");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(pool_stats(*w).pinned, 3u);
  ASSERT_EQ(kvpool_set_hints(c, nullptr), 0);
  ASSERT_EQ(kvpool_alloc(c, 2, pages), 0);
  EXPECT_EQ(pool_stats(*w).pinned, 3u);  // hints cleared: no more pins
  kvpool_detach(c);
  // Unpublished pages go back FREE when the session closes, and their pins with them.
  for (int i = 0; i < 200 && pool_stats(*w).in_use != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pool_stats(*w).pinned, 0u);

  // A SequenceCache with a conversation's hints publishes pinned full blocks.
  BlockHasher hasher;
  const BlockHash root = hasher.root({"test-model", w->pool().geometry, "", ""});
  {
    client::SequenceCache seq(*w, hasher, root);
    seq.set_hints(PageHints{Priority::conversation, 30000});
    std::vector<uint32_t> prompt(16 * 3);
    for (uint32_t i = 0; i < prompt.size(); ++i)
      prompt[i] = i * 7 + 1;
    ASSERT_TRUE(seq.begin(prompt).ok());
    auto stored = seq.publish_full();
    ASSERT_TRUE(stored.ok()) << stored.error().message;
    EXPECT_EQ(seq.published_blocks(), 3u);
  }  // released tail first
  const stats::PoolStats s = pool_stats(*w);
  EXPECT_EQ(s.cached, 3u);
  EXPECT_EQ(s.pinned_cached, 3u);
}

TEST(Eviction, APolicyReloadsLiveAndKeepsTheCache) {
  Daemon d(pool_config("lru"));
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(cache_chain(*w, 8, {}), 0);
  EXPECT_EQ(std::string(pool_stats(*w).policy), "lru");

  std::ofstream(d.config_path()) << pool_config("s3fifo");
  ::kill(d.pid(), SIGHUP);
  bool reloaded = false;
  for (int i = 0; i < 500 && !reloaded; ++i) {
    reloaded = d.log().find("event=reloaded") != std::string::npos;
    if (!reloaded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(reloaded) << d.log();
  EXPECT_NE(d.log().find("event=policy_changed"), std::string::npos) << d.log();
  EXPECT_EQ(d.log().find("event=reload_needs_restart"), std::string::npos) << d.log();
  EXPECT_EQ(std::string(pool_stats(*w).policy), "s3fifo");
  // The cached pages moved to the new policy: every one is still found, and evictable.
  auto hits = w->lookup(chain(8));
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits.value().size(), 8u);
  ASSERT_TRUE(w->release(hits.value()).ok());
  auto all = w->alloc(16);
  ASSERT_TRUE(all.ok()) << all.error().message;
  EXPECT_EQ(pool_stats(*w).evicted, 8u);
}

}  // namespace
}  // namespace kvpool::testing

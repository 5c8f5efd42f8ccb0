// Hardening, pages: quotas hold on every path that hands a session a page, a large copy never
// holds the event loop (nor frees pages under it), and tenants never share bytes by default.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/hardening_util.h"
#include "tests/integration/raw_frames.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

std::vector<BlockHash> chain(uint32_t from, uint32_t n) {
  std::vector<BlockHash> c;
  for (uint32_t i = from; i < from + n; ++i)
    c.push_back(test_hash(i));
  return c;
}

// Publishes blocks [from, from + n) on n fresh pages and releases them (they stay cached).
void cache_blocks(Connection& c, uint32_t from, uint32_t n) {
  auto pages = c.alloc(n);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], test_hash(from + i)});
  ASSERT_TRUE(c.publish(items).ok());
  ASSERT_TRUE(c.release(pages.value()).ok());
}

TEST(HardeningPages, QuotasHoldOnLookupAndDuplicatePublish) {
  const std::string config = std::string(kHardeningPool) + R"(
limits: {max_pages_per_session: 8, max_pages_per_tenant: 12}
)";
  Daemon d(config);
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a");
  ASSERT_NE(a, nullptr);
  // Within its quota of 8, one session caches the whole pool, 8 pages at a time.
  for (uint32_t round = 0; round < 8; ++round)
    cache_blocks(*a, round * 8, 8);
  ASSERT_EQ(a->stats().value().cached, 64u);
  // A lookup of all 64 takes no more than the quota: the prefix ends at 8.
  auto hits = a->lookup(chain(0, 64));
  ASSERT_TRUE(hits.ok()) << hits.error().message;
  EXPECT_EQ(hits.value().size(), 8u);
  EXPECT_EQ(a->stats().value().session_held_pages, 8u);
  EXPECT_EQ(a->stats().value().in_use, 8u);
  // Pages it holds can be looked up again; nothing new is handed out.
  auto again = a->lookup(chain(0, 64));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().size(), 8u);
  EXPECT_EQ(a->alloc(1).error().status.code(), Errc::quota_exceeded);
  ASSERT_TRUE(a->release(hits.value()).ok());
  ASSERT_TRUE(a->release(again.value()).ok());

  // A publish whose duplicates would pass the quota is refused and changes nothing.
  auto own = a->alloc(8);
  ASSERT_TRUE(own.ok());
  std::vector<PublishItem> dup;
  for (uint32_t i = 0; i < 8; ++i)
    dup.push_back({own.value()[i], test_hash(16 + i)});  // all cached already, on other pages
  auto refused = a->publish(dup);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().status.code(), Errc::quota_exceeded);
  EXPECT_NE(refused.error().message.find("limits.max_pages_per_session"), std::string::npos)
      << refused.error().message;
  EXPECT_EQ(a->stats().value().session_held_pages, 8u);
  EXPECT_EQ(a->stats().value().counter("duplicates"), 0u);

  // The tenant's quota (12) bounds two sessions together: b gets 4 more, by lookup or alloc.
  auto b = attach(d, "b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->lookup(chain(32, 32)).value().size(), 4u);
  EXPECT_EQ(b->alloc(1).error().status.code(), Errc::quota_exceeded);
  EXPECT_EQ(b->stats().value().in_use, 12u);
}

// 1 MiB pages: 8 layers × 8 KV heads × 32 tokens × head dim 128 × fp16 × K and V.
constexpr char kCopyPool[] = R"(
pools:
  - name: default
    geometry: {layers: 8, kv_heads: 8, head_dim: 128, tokens_per_page: 32, dtype: fp16}
    capacity: 1040 pages
)";
// 512 MiB: ~0.1 s of memcpy, more with first touches; 128 MiB where memcpy is instrumented
// (slower still, and the copy thread's low priority gives it little CPU while other tests run).
constexpr uint32_t kCopyPages = kSanitizedBuild ? 128 : 512;
constexpr int kCopyReplyTimeoutMs = 180000;

// Sends (without waiting) a copy of pages [0, n) onto pages [n, 2n) of `pages`.
void send_copy(Connection& c, const std::vector<PageId>& pages, uint32_t n, uint32_t id) {
  wire::CopyRequest r;
  for (uint32_t i = 0; i < n; ++i)
    r.pairs.push_back({pages[i], pages[n + i]});
  ASSERT_TRUE(send_all(c.socket_fd(), frame(r, id)));
}

TEST(HardeningPages, ALargeCopyRunsOffTheEventLoop) {
  Daemon d(kCopyPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "copier");
  auto b = attach(d, "other");
  ASSERT_TRUE(a && b);
  auto pages = a->alloc(2 * kCopyPages);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  for (uint32_t i = 0; i < kCopyPages; ++i)
    std::memset(a->page(pages.value()[i]), static_cast<int>(i * 7 + 1), a->pool().page_stride);
  send_copy(*a, pages.value(), kCopyPages, 9);
  // While the daemon copies, another worker is served: its reply comes first.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto other = b->alloc(1);
  ASSERT_TRUE(other.ok()) << other.error().message;
  EXPECT_FALSE(readable_within(a->socket_fd(), 0)) << "the copy's reply came before b's alloc";
  const RawReply r = read_raw_reply(a->socket_fd(), kCopyReplyTimeoutMs);
  ASSERT_FALSE(r.closed);
  ASSERT_FALSE(r.error.has_value()) << r.error->message;
  EXPECT_EQ(r.header.request_id, 9u);
  for (uint32_t i = 0; i < kCopyPages; i += 97) {
    const std::byte* dst = a->page(pages.value()[kCopyPages + i]);
    EXPECT_EQ(std::memcmp(dst, a->page(pages.value()[i]), a->pool().page_stride), 0) << i;
  }
  // The connection goes on as before.
  EXPECT_TRUE(a->stats().ok());
}

TEST(HardeningPages, AWorkerKilledDuringACopyLeavesNothingBehind) {
  Daemon d(kCopyPool);
  ASSERT_TRUE(d.start()) << d.log();
  Pipe sent;
  const pid_t worker = spawn_worker([&] {
    auto c = Connection::attach(d.socket(), "doomed");
    if (!c.ok()) return 1;
    auto pages = c.value()->alloc(2 * kCopyPages);
    if (!pages.ok()) return 2;
    wire::CopyRequest r;
    for (uint32_t i = 0; i < kCopyPages; ++i)
      r.pairs.push_back({pages.value()[i], pages.value()[kCopyPages + i]});
    if (!send_all(c.value()->socket_fd(), frame(r, 5))) return 3;
    sent.signal();
    ::pause();
    return 0;
  });
  ASSERT_TRUE(sent.wait());
  ::kill(worker, SIGKILL);
  EXPECT_EQ(wait_worker(worker), 128 + SIGKILL);
  // Its pages come back once the copy is done (debug builds check every invariant then), and
  // the whole pool can be taken again.
  auto c = attach(d, "after");
  ASSERT_NE(c, nullptr);
  bool released = false;
  for (int i = 0; i < kCopyReplyTimeoutMs / 50 && !released; ++i) {
    released = c->stats().value().in_use == 0;
    if (!released) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(released);
  EXPECT_TRUE(c->alloc(1040).ok());
  EXPECT_TRUE(d.running());
}

// Pools p1 and p2 claimed by tenants, p3 by none.
std::string tenant_config(const std::string& tenants, bool share_p1) {
  std::string pools = "socket: {mode: \"0666\"}\npools:\n";
  for (const char* name : {"p1", "p2", "p3"}) {
    pools += std::string("  - name: ") + name +
             "\n    geometry: {layers: 1, kv_heads: 1, head_dim: 64, tokens_per_page: 16, "
             "dtype: fp16}\n    capacity: 16 pages\n";
    if (share_p1 && std::string(name) == "p1") pools += "    share_between_tenants: true\n";
  }
  return pools + tenants;
}

// As `uid`, attaches to `pool`: 0 on success, 1 when refused with permission_denied.
int attach_as(const Daemon& d, uid_t uid, const std::string& pool) {
  return run_worker([&] {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 90;
    auto c = Connection::attach(d.socket(), "w", pool);
    if (c.ok()) return 0;
    return c.error().status.code() == Errc::permission_denied ? 1 : 2;
  });
}

TEST(HardeningPages, TenantsNeverShareAPoolUnlessItSaysSo) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers under other uids";
  const std::string tenants = R"(
tenants:
  - {name: alpha, uids: [4242], pools: [p1]}
  - {name: beta, uids: [4243], pools: [p2]}
  - {name: gamma, uids: [4244]}
)";
  Daemon d(tenant_config(tenants, false));
  ASSERT_TRUE(d.start()) << d.log();
  open_socket_dir(d);
  EXPECT_EQ(attach_as(d, 4242, "p1"), 0);
  EXPECT_EQ(attach_as(d, 4242, "p2"), 1);  // beta's
  EXPECT_EQ(attach_as(d, 4243, "p1"), 1);  // alpha's
  EXPECT_EQ(attach_as(d, 4244, "p1"), 1);  // gamma lists no pool: it may use none
  EXPECT_EQ(attach_as(d, 4244, "p3"), 1);
  // The implicit default tenant (uid 5151) may use only the pool no tenant claims.
  EXPECT_EQ(attach_as(d, 5151, "p1"), 1);
  EXPECT_EQ(attach_as(d, 5151, "p3"), 0);
  EXPECT_EQ(d.log().find("event=pool_shared"), std::string::npos);

  // Two tenants on one pool: refused unless the pool consents...
  const std::string both = R"(
tenants:
  - {name: alpha, uids: [4242], pools: [p1]}
  - {name: beta, uids: [4243], pools: [p1]}
)";
  Daemon refused(tenant_config(both, false));
  EXPECT_FALSE(refused.start());
  EXPECT_NE(refused.log().find("share_between_tenants: true"), std::string::npos) << refused.log();
  // ...and said at start when it does.
  Daemon shared(tenant_config(both, true));
  ASSERT_TRUE(shared.start()) << shared.log();
  open_socket_dir(shared);
  EXPECT_NE(shared.log().find("event=pool_shared pool=p1 tenants=alpha,beta"), std::string::npos)
      << shared.log();
  // Tenants sharing a pool see only their own sessions; an admin sees all.
  Pipe attached, done;
  const pid_t alpha = spawn_worker([&] {
    if (::setgid(4242) != 0 || ::setuid(4242) != 0) return 90;
    auto c = Connection::attach(shared.socket(), "alpha-worker", "p1");
    if (!c.ok()) return 1;
    attached.signal();
    done.wait();
    return 0;
  });
  ASSERT_TRUE(attached.wait());
  const int beta = run_worker([&] {
    if (::setgid(4243) != 0 || ::setuid(4243) != 0) return 90;
    auto c = Connection::attach(shared.socket(), "beta-worker", "p1");
    if (!c.ok()) return 1;
    auto s = c.value()->sessions();
    if (!s.ok()) return 2;
    for (const auto& info : s.value()) {
      if (info.tenant != "beta") return 3;
    }
    return s.value().size() == 1 ? 0 : 4;
  });
  EXPECT_EQ(beta, 0);
  auto admin = Connection::attach(shared.socket(), "admin", "p1", Connection::Memory::none);
  ASSERT_TRUE(admin.ok());
  // Root is in no tenant here: as an admin it still sees alpha's session.
  const auto sessions = admin.value()->sessions();
  ASSERT_TRUE(sessions.ok());
  bool sees_alpha = false;
  for (const auto& info : sessions.value())
    sees_alpha = sees_alpha || info.worker == "alpha-worker";
  EXPECT_TRUE(sees_alpha);
  done.signal();
  EXPECT_EQ(wait_worker(alpha), 0);
}

}  // namespace
}  // namespace kvpool::testing

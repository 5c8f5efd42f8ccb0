// Integration: the remote tier (pools[].remote_tier) with a real Redis Cluster (3 masters, 3
// replicas, scripts/redis-cluster.sh) and real kvpoold processes, each its own "node". A prefix
// published on one daemon is found by another's lookup, promoted into its pool (tier
// kTierRemote) and bytes equal; a value corrupted in the cluster, or written by a pool of another
// geometry, is refused and counted, never served; with the cluster gone, lookups answer locally,
// and the daemon says so once; a master killed under load is taken over by its replica and
// the daemons go on. Label `remote`: these start redis-server themselves.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/redis_cluster.h"
#include "tests/integration/test_attach.h"
#if KVPOOL_TEST_KV_EVENTS
#include <zmq.h>
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include "tests/integration/kv_events_util.h"
#include "tests/integration/zmq_test_socket.h"
#endif

namespace kvpool::testing {
namespace {

using client::Connection;
using client::PoolKernels;
using Clock = std::chrono::steady_clock;

constexpr const char* kGeometry =
    "{layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16}";

// One pool "chat" with a remote tier under namespace `ns` (`extra`: more remote_tier keys;
// `host_pages`: a host tier of that many pages, 0 none).
std::string config(const RedisCluster& cluster, const std::string& ns,
                   const std::string& geometry = kGeometry, const std::string& extra = "",
                   uint32_t pages = 64, uint32_t host_pages = 0) {
  const std::string host =
      host_pages == 0 ? "" : "    host_tier: " + std::to_string(host_pages) + " pages\n";
  return "backend: host\npools:\n  - name: chat\n    geometry: " + geometry +
         "\n    capacity: " + std::to_string(pages) + " pages\n" + host +
         "    remote_tier: {cluster: " + cluster.seeds() + ", namespace: " + ns +
         ", timeout_ms: 200" + extra + "}\n";
}

BlockHash block(uint64_t i) {
  return BlockHash{0xBEEF'0000 + i, i * 7 + 3};
}

std::vector<BlockHash> chain(uint64_t first, uint64_t n) {
  std::vector<BlockHash> c;
  for (uint64_t i = 0; i < n; ++i)
    c.push_back(block(first + i));
  return c;
}

// The bytes block `id` holds, a function of the id and the offset in the page.
std::byte pattern(uint64_t id, uint64_t at) {
  return static_cast<std::byte>((id * 131 + at * 7 + (at >> 9)) & 0xFF);
}

void fill(Connection& c, PageId p, uint64_t id) {
  const kernels::PagedKv kv = PoolKernels(c).paged_kv();
  const kernels::PageChunks ch = kernels::page_chunks(kv);
  auto* base = static_cast<std::byte*>(kv.base);
  uint64_t at = 0;
  for (uint32_t k = 0; k < ch.chunks; ++k) {
    for (uint64_t b = 0; b < ch.chunk_bytes; ++b)
      base[ch.at(p) + k * ch.chunk + b] = pattern(id, at++);
  }
}

// The first offset where page p differs from block id's bytes, or -1.
int64_t first_difference(Connection& c, PageId p, uint64_t id) {
  const kernels::PagedKv kv = PoolKernels(c).paged_kv();
  const kernels::PageChunks ch = kernels::page_chunks(kv);
  const auto* base = static_cast<const std::byte*>(kv.base);
  uint64_t at = 0;
  for (uint32_t k = 0; k < ch.chunks; ++k) {
    for (uint64_t b = 0; b < ch.chunk_bytes; ++b, ++at) {
      if (base[ch.at(p) + k * ch.chunk + b] != pattern(id, at)) return static_cast<int64_t>(at);
    }
  }
  return -1;
}

// Writes blocks [first, first + n) into c's pool and publishes them; "" or the error.
std::string publish_blocks(Connection& c, uint64_t first, uint64_t n) {
  auto pages = c.alloc(static_cast<uint32_t>(n));
  if (!pages.ok()) return "alloc: " + pages.error().message;
  std::vector<PublishItem> items;
  for (uint64_t i = 0; i < n; ++i) {
    fill(c, pages.value()[i], first + i);
    items.push_back({pages.value()[i], block(first + i)});
  }
  auto pub = c.publish(items);
  if (!pub.ok()) return "publish: " + pub.error().message;
  auto rel = c.release(pages.value());
  return rel.ok() ? "" : "release: " + rel.error().message;
}

// Looks `want` up until all of it hits (the writes are asynchronous) or `timeout` passes; the
// last reply, its pages still held.
wire::LookupReply lookup_until(Connection& c, const std::vector<BlockHash>& want,
                               std::chrono::milliseconds timeout, bool* any_remote) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    auto r = c.lookup_with_tiers(want, {});
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    if (!r.ok()) return {};
    for (const uint8_t t : r.value().tiers)
      *any_remote |= t == wire::kTierRemote;
    if (r.value().pages.size() == want.size() || Clock::now() > deadline) return r.value();
    EXPECT_TRUE(c.release(r.value().pages).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

class RemoteTier : public ::testing::Test {
 protected:
  void SetUp() override { start_cluster(""); }
  // A cluster with more redis-server arguments (replacing SetUp's).
  void start_cluster(const std::string& extra) {
    cluster_.reset();
    cluster_ = std::make_unique<RedisCluster>(cluster_base_port(index_++), extra);
    ASSERT_TRUE(cluster_->started()) << cluster_->output();
  }
  // Two daemons sharing the cluster under namespace `ns`, a worker attached to each.
  struct Pair {
    std::unique_ptr<Daemon> a, b;
    std::unique_ptr<Connection> ca, cb;
  };
  Pair two_daemons(const std::string& ns, uint32_t pages = 64) {
    return two_daemons(config(*cluster_, ns, kGeometry, "", pages),
                       config(*cluster_, ns, kGeometry, "", pages));
  }
  // The same with a config of each.
  Pair two_daemons(const std::string& config_a, const std::string& config_b) {
    Pair p;
    p.a = std::make_unique<Daemon>(config_a);
    p.b = std::make_unique<Daemon>(config_b);
    EXPECT_TRUE(p.a->start()) << p.a->log();
    EXPECT_TRUE(p.b->start()) << p.b->log();
    p.ca = attach(*p.a, "writer");
    p.cb = attach(*p.b, "reader");
    return p;
  }
  // Waits (up to 10 s) until the cluster holds n keys that start with `prefix`.
  bool wait_keys(const std::string& prefix, size_t n) const {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (cluster_->keys(prefix).size() < n && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return cluster_->keys(prefix).size() >= n;
  }
  std::unique_ptr<RedisCluster> cluster_;
  static inline int index_ = 0;
};

// Two daemons, one cluster: what A publishes, B finds, promoted into its own pool, bytes equal;
// B's second lookup hits its device tier.
TEST_F(RemoteTier, APrefixPublishedOnOneDaemonIsFoundByAnother) {
  Pair p = two_daemons("shared");
  ASSERT_TRUE(p.ca && p.cb);
  Daemon &a = *p.a, &b = *p.b;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  ASSERT_EQ(publish_blocks(*ca, 0, 6), "");
  const auto want = chain(0, 6);
  bool any_remote = false;
  const wire::LookupReply r = lookup_until(*cb, want, std::chrono::seconds(10), &any_remote);
  ASSERT_EQ(r.pages.size(), 6u) << b.log();
  EXPECT_TRUE(any_remote);
  for (size_t i = 0; i < r.pages.size(); ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], i), -1) << "block " << i;
  EXPECT_EQ(cluster_->keys("shared:default:").size(), 6u);
  ASSERT_TRUE(cb->release(r.pages).ok());
  auto again = cb->lookup_with_tiers(want, {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value().tiers, std::vector<uint8_t>(6, wire::kTierDevice));
  ASSERT_TRUE(cb->release(again.value().pages).ok());
  const stats::PoolStats sa = pool_stats(*ca);
  const stats::PoolStats sb = pool_stats(*cb);
  EXPECT_EQ(sa.remote_tier, 1u);
  EXPECT_EQ(sa.remote_stored, 6u);
  EXPECT_EQ(sa.remote_nodes, 3u);
  EXPECT_EQ(sa.remote_slots, 16384u);
  EXPECT_EQ(sb.remote_hits, 6u);
  EXPECT_GE(sb.remote_lookups, 1u);
  EXPECT_EQ(sb.remote_rejected, 0u);
  // B wrote none of them back: what came from the cluster is there already.
  EXPECT_EQ(sb.remote_stored, 0u);
  // A chain that continues past what anyone published: the known part only.
  auto longer = cb->lookup_with_tiers(chain(0, 9), {});
  ASSERT_TRUE(longer.ok());
  EXPECT_EQ(longer.value().pages.size(), 6u);
  ASSERT_TRUE(cb->release(longer.value().pages).ok());
  EXPECT_TRUE(a.running() && b.running());
}

// Two daemons publish the same blocks at the same moment: both write every key (last write
// wins; the values are equal by construction), the cluster keeps one valid value per block, and
// a third daemon reads them equal, nothing refused.
TEST_F(RemoteTier, TwoDaemonsWritingTheSameBlocksAtOnceLeaveOneGoodValue) {
  Pair p = two_daemons("both");
  ASSERT_TRUE(p.ca && p.cb);
  std::string ea, eb;
  std::thread ta([&] { ea = publish_blocks(*p.ca, 0, 8); });
  std::thread tb([&] { eb = publish_blocks(*p.cb, 0, 8); });
  ta.join();
  tb.join();
  ASSERT_EQ(ea, "");
  ASSERT_EQ(eb, "");
  ASSERT_TRUE(wait_keys("both:default:", 8));
  // Both daemons' writes are done: each wrote every block (neither had it from the other).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((pool_stats(*p.ca).remote_stored < 8 || pool_stats(*p.cb).remote_stored < 8) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(pool_stats(*p.ca).remote_stored, 8u);
  EXPECT_EQ(pool_stats(*p.cb).remote_stored, 8u);
  EXPECT_EQ(cluster_->keys("both:default:").size(), 8u);
  Daemon c(config(*cluster_, "both"));
  ASSERT_TRUE(c.start()) << c.log();
  auto cc = attach(c, "third");
  ASSERT_TRUE(cc);
  bool any_remote = false;
  const wire::LookupReply r = lookup_until(*cc, chain(0, 8), std::chrono::seconds(5), &any_remote);
  ASSERT_EQ(r.pages.size(), 8u) << c.log();
  EXPECT_EQ(r.tiers, std::vector<uint8_t>(8, wire::kTierRemote));
  for (size_t i = 0; i < r.pages.size(); ++i)
    EXPECT_EQ(first_difference(*cc, r.pages[i], i), -1) << "block " << i;
  EXPECT_EQ(pool_stats(*cc).remote_rejected, 0u);
  ASSERT_TRUE(cc->release(r.pages).ok());
}

// A chain whose head B keeps in its host tier and whose rest only the cluster holds: B's lookup
// promotes the head from its host tier, then fetches the rest, one reply, each block's tier said.
TEST_F(RemoteTier, ALookupGoesOnFromTheHostTierIntoTheCluster) {
  Pair p = two_daemons(config(*cluster_, "chain"),
                       config(*cluster_, "chain", kGeometry, ", write: off", 64, 16));
  ASSERT_TRUE(p.ca && p.cb);
  Daemon &a = *p.a, &b = *p.b;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  ASSERT_EQ(publish_blocks(*ca, 0, 6), "");
  ASSERT_TRUE(wait_keys("chain:default:", 6));
  // B computed the first two blocks itself; an operator's evict sends them to its host tier.
  ASSERT_EQ(publish_blocks(*cb, 0, 2), "");
  ASSERT_EQ(cb->evict(64).value(), 2u);
  auto r = cb->lookup_with_tiers(chain(0, 6), {});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value().tiers,
            (std::vector<uint8_t>{wire::kTierHost, wire::kTierHost, wire::kTierRemote,
                                  wire::kTierRemote, wire::kTierRemote, wire::kTierRemote}))
      << b.log();
  ASSERT_EQ(r.value().pages.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(first_difference(*cb, r.value().pages[i], i), -1) << "block " << i;
  ASSERT_TRUE(cb->release(r.value().pages).ok());
  const stats::PoolStats sb = pool_stats(*cb);
  EXPECT_EQ(sb.remote_hits, 4u);
  EXPECT_EQ(sb.remote_stored, 0u);
  EXPECT_TRUE(a.running() && b.running());
}

// Another namespace, or a pool of another geometry under the same namespace, never serves them.
TEST_F(RemoteTier, NamespacesAndGeometriesStayApart) {
  Daemon a(config(*cluster_, "one"));
  Daemon other_ns(config(*cluster_, "two"));
  Daemon other_geometry(
      config(*cluster_, "one",
             "{layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}"));
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(other_ns.start()) << other_ns.log();
  ASSERT_TRUE(other_geometry.start()) << other_geometry.log();
  auto ca = attach(a, "writer");
  ASSERT_TRUE(ca);
  ASSERT_EQ(publish_blocks(*ca, 100, 3), "");
  ASSERT_TRUE(wait_keys("one:default:", 3));
  for (Daemon* d : {&other_ns, &other_geometry}) {
    auto c = attach(*d, "reader");
    ASSERT_TRUE(c);
    auto r = c->lookup_with_tiers(chain(100, 3), {});
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r.value().pages.empty());
  }
}

// A value whose payload was changed in the cluster fails its checksum: the lookup stops before
// it, the daemon counts and logs it, and serves nothing of it.
TEST_F(RemoteTier, ACorruptedValueIsRefused) {
  Pair p = two_daemons("shared");
  ASSERT_TRUE(p.ca && p.cb);
  Daemon& b = *p.b;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  ASSERT_EQ(publish_blocks(*ca, 200, 4), "");
  ASSERT_TRUE(wait_keys("shared:default:", 4));
  // Block 202's key: its hash's hex ends the key.
  std::string victim;
  for (const std::string& k : cluster_->keys("shared:default:")) {
    if (k.find(to_hex(block(202))) != std::string::npos) victim = k;
  }
  ASSERT_FALSE(victim.empty());
  EXPECT_EQ(cluster_->cli(0, "SETRANGE " + victim + " 1000 XYZ").find("ERR"), std::string::npos);
  auto r = cb->lookup_with_tiers(chain(200, 4), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value().pages.size(), 2u);
  for (size_t i = 0; i < r.value().pages.size(); ++i)
    EXPECT_EQ(first_difference(*cb, r.value().pages[i], 200 + i), -1) << "block " << i;
  EXPECT_NE(b.log().find("remote_value_rejected"), std::string::npos) << b.log();
  EXPECT_NE(b.log().find("checksum=1"), std::string::npos) << b.log();
  EXPECT_EQ(pool_stats(*cb).remote_rejected, 1u);
}

// The cluster gone: lookups answer from the pool alone, promptly; the daemon says so once; and
// when the cluster is back (a new one on the same ports), the tier is used again.
TEST_F(RemoteTier, WithTheClusterGoneLookupsAnswerLocally) {
  Daemon a(config(*cluster_, "shared"));
  ASSERT_TRUE(a.start()) << a.log();
  auto ca = attach(a, "worker");
  ASSERT_TRUE(ca);
  ASSERT_EQ(publish_blocks(*ca, 300, 2), "");
  cluster_->stop();
  for (int i = 0; i < 50; ++i) {
    const auto t0 = Clock::now();
    auto r = ca->lookup_with_tiers(chain(300, 5), {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r.value().pages.size(), 2u);
    ASSERT_TRUE(ca->release(r.value().pages).ok());
    // One timeout at most (200 ms per node of the batch), never one per lookup.
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  }
  ASSERT_EQ(publish_blocks(*ca, 310, 2), "");
  EXPECT_TRUE(a.running());
  EXPECT_EQ(count(a.log(), "remote_tier_unreachable"), 1u) << a.log();
  const stats::PoolStats st = pool_stats(*ca);
  EXPECT_GE(st.remote_skipped, 45u);  // asked once, then skipped while unreachable
  EXPECT_LE(st.remote_lookups, 5u);
  EXPECT_EQ(st.remote_reachable, 0u);
}

// A slow master (CLIENT PAUSE: in the cluster, answering nothing): it costs the keys it holds
// and one timeout, not the others' replies. The tier is not called unreachable, no lookup is
// skipped, and once it answers again its keys are found.
TEST_F(RemoteTier, ASlowMasterCostsOnlyItsOwnKeys) {
  Pair p = two_daemons("slow", 512);  // an eighth of it: all 32 held for their writes at once
  ASSERT_TRUE(p.ca && p.cb);
  Connection* cb = p.cb.get();
  ASSERT_EQ(publish_blocks(*p.ca, 0, 32), "");
  ASSERT_TRUE(wait_keys("slow:default:", 32));
  int paused = -1;
  for (int i = 0; i < 6 && paused < 0; ++i) {
    if (cluster_->cli(i, "role").rfind("master", 0) == 0) paused = i;
  }
  ASSERT_GE(paused, 0);
  ASSERT_NE(cluster_->cli(paused, "CLIENT PAUSE 2500 ALL").find("OK"), std::string::npos);
  const auto paused_at = Clock::now();
  for (int i = 0; i < 5; ++i) {
    auto r = cb->lookup_with_tiers(chain(0, 32), {});
    ASSERT_TRUE(r.ok()) << r.error().message;
    // The paused master holds some of the 32 keys: the run stops at its first.
    EXPECT_LT(r.value().pages.size(), 32u);
    ASSERT_TRUE(cb->release(r.value().pages).ok());
  }
  ASSERT_LT(Clock::now() - paused_at, std::chrono::milliseconds(2500)) << "lookups waited";
  stats::PoolStats st = pool_stats(*cb);
  EXPECT_EQ(st.remote_skipped, 0u);
  EXPECT_GT(st.remote_fetch_failed, 0u);
  EXPECT_EQ(st.remote_reachable, 2u);
  EXPECT_EQ(count(p.b->log(), "remote_tier_unreachable"), 0u) << p.b->log();
  // Answering again (and past the second a failed node is left alone): every key is found.
  std::this_thread::sleep_until(paused_at + std::chrono::milliseconds(3600));
  bool any_remote = false;
  const wire::LookupReply r = lookup_until(*cb, chain(0, 32), std::chrono::seconds(5), &any_remote);
  ASSERT_EQ(r.pages.size(), 32u) << p.b->log();
  for (size_t i = 0; i < r.pages.size(); ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], i), -1) << "block " << i;
  EXPECT_TRUE(p.a->running() && p.b->running());
}

// kill -9 of a master while two daemons write and read: its replica takes its slots over; no
// daemon crashes or stops answering, and afterwards what one publishes the other finds again.
TEST_F(RemoteTier, AKilledMasterIsTakenOverByItsReplica) {
  Pair p = two_daemons("shared");
  ASSERT_TRUE(p.ca && p.cb);
  Daemon &a = *p.a, &b = *p.b;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  ASSERT_EQ(::kill(cluster_->pid(0), SIGKILL), 0);
  const auto until = Clock::now() + std::chrono::seconds(4);
  uint64_t id = 1000;
  while (Clock::now() < until) {
    ASSERT_EQ(publish_blocks(*ca, id, 1), "");
    auto r = cb->lookup_with_tiers(chain(id, 1), {});
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(cb->release(r.value().pages).ok());
    id += 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The replica took over (cluster-node-timeout 1 s): new blocks travel again.
  bool any_remote = false;
  ASSERT_EQ(publish_blocks(*ca, 5000, 8), "");
  const wire::LookupReply r =
      lookup_until(*cb, chain(5000, 8), std::chrono::seconds(10), &any_remote);
  EXPECT_EQ(r.pages.size(), 8u) << a.log() << b.log();
  for (size_t i = 0; i < r.pages.size(); ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], 5000 + i), -1) << "block " << i;
  EXPECT_TRUE(a.running() && b.running());
}

// write: off reads and never writes; admit: reused writes a block only once a lookup hit it.
TEST_F(RemoteTier, WriteOffAndAdmitReused) {
  Daemon reader(config(*cluster_, "ro", kGeometry, ", write: off"));
  Daemon picky(config(*cluster_, "picky", kGeometry, ", admit: reused"));
  ASSERT_TRUE(reader.start()) << reader.log();
  ASSERT_TRUE(picky.start()) << picky.log();
  auto cr = attach(reader, "r");
  auto cp = attach(picky, "p");
  ASSERT_TRUE(cr && cp);
  ASSERT_EQ(publish_blocks(*cr, 400, 3), "");
  ASSERT_EQ(publish_blocks(*cp, 500, 3), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(cluster_->keys("ro:").empty());
  EXPECT_TRUE(cluster_->keys("picky:").empty());
  // Two blocks hit: those two are written.
  auto hit = cp->lookup_with_tiers(chain(500, 2), {});
  ASSERT_TRUE(hit.ok());
  ASSERT_EQ(hit.value().pages.size(), 2u);
  ASSERT_TRUE(cp->release(hit.value().pages).ok());
  EXPECT_TRUE(wait_keys("picky:", 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(cluster_->keys("picky:").size(), 2u);
}

// write: on_demote. Published blocks stay out of the cluster until the device tier evicts them
// (an alloc that needs their pages, an operator's evict); then each is written with the bytes it
// had, though the worker that got its page overwrote it at once, and another daemon finds it.
TEST_F(RemoteTier, OnDemoteWritesWhatTheDeviceEvicts) {
  Pair p = two_daemons(config(*cluster_, "down", kGeometry, ", write: on_demote", 8),
                       config(*cluster_, "down", kGeometry, ", write: off"));
  ASSERT_TRUE(p.ca && p.cb);
  Daemon &a = *p.a, &b = *p.b;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  ASSERT_EQ(publish_blocks(*ca, 0, 6), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(cluster_->keys("down:").empty());
  // All 8 pages: the 6 cached blocks are evicted and copied out before this reply.
  auto pages = ca->alloc(8);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  for (size_t i = 0; i < 8; ++i)
    fill(*ca, pages.value()[i], 100 + i);
  ASSERT_TRUE(ca->release(pages.value()).ok());
  ASSERT_TRUE(wait_keys("down:default:", 6)) << a.log();
  bool any_remote = false;
  wire::LookupReply r = lookup_until(*cb, chain(0, 6), std::chrono::seconds(5), &any_remote);
  ASSERT_EQ(r.pages.size(), 6u) << a.log() << b.log();
  EXPECT_TRUE(any_remote);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], i), -1) << "block " << i;
  ASSERT_TRUE(cb->release(r.pages).ok());
  // An operator's evict, on a pool with no host tier: its victims are written too.
  ASSERT_EQ(publish_blocks(*ca, 20, 3), "");
  ASSERT_EQ(ca->evict(64).value(), 3u);
  ASSERT_TRUE(wait_keys("down:default:", 9)) << a.log();
  r = lookup_until(*cb, chain(20, 3), std::chrono::seconds(5), &any_remote);
  ASSERT_EQ(r.pages.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], 20 + i), -1) << "block " << 20 + i;
  const stats::PoolStats sa = pool_stats(*ca);
  EXPECT_EQ(sa.remote_tier, 3u);
  EXPECT_EQ(sa.remote_stored, 9u);
  EXPECT_EQ(sa.remote_store_failed, 0u);
  // Blocks B fetched are not written back when B evicts them: they are in the cluster.
  EXPECT_EQ(pool_stats(*cb).remote_stored, 0u);
  EXPECT_TRUE(a.running() && b.running());
}

// write: on_demote with admit: reused and a host tier: an evicted block goes down to the host
// tier, and to the cluster only if a lookup hit it while it was on the device.
TEST_F(RemoteTier, OnDemoteWithAHostTierWritesOnlyReusedBlocks) {
  Daemon a(config(*cluster_, "reuse", kGeometry, ", write: on_demote, admit: reused", 8, 16));
  ASSERT_TRUE(a.start()) << a.log();
  auto ca = attach(a, "writer");
  ASSERT_TRUE(ca);
  ASSERT_EQ(publish_blocks(*ca, 0, 4), "");
  auto hit = ca->lookup_with_tiers(chain(0, 2), {});
  ASSERT_TRUE(hit.ok());
  ASSERT_TRUE(ca->release(hit.value().pages).ok());
  ASSERT_EQ(ca->evict(64).value(), 4u);
  ASSERT_TRUE(wait_keys("reuse:default:", 2)) << a.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(cluster_->keys("reuse:default:").size(), 2u);
  // All four are in the host tier still.
  auto back = ca->lookup_with_tiers(chain(0, 4), {});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.value().tiers, std::vector<uint8_t>(4, wire::kTierHost));
  for (size_t i = 0; i < back.value().pages.size(); ++i)
    EXPECT_EQ(first_difference(*ca, back.value().pages[i], i), -1) << "block " << i;
  ASSERT_TRUE(ca->release(back.value().pages).ok());
  EXPECT_EQ(pool_stats(*ca).remote_stored, 2u);
}

#if KVPOOL_TEST_KV_EVENTS
// The KV events that arrive within `ms` (stopping once they pause for 300 ms after the first):
// per "TYPE MEDIUM" (AllBlocksCleared: its type alone), the hashes they name.
std::map<std::string, std::vector<std::string>> events_within(ZmqSocket& sub, int ms) {
  std::map<std::string, std::vector<std::string>> seen;
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  bool any = false;
  while (Clock::now() < deadline) {
    if (!sub.readable(any ? 300 : 50)) {
      if (any) break;
      continue;
    }
    any = true;
    const std::vector<std::string> frames = sub.receive();
    if (frames.size() != 3) continue;
    const msgpack::object_handle oh = decode(frames[2]);
    const msgpack::object& batch = oh.get();
    const msgpack::object& events = batch.via.array.ptr[1];
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      const msgpack::object_array& e = events.via.array.ptr[i].via.array;
      const std::string type = str(e.ptr[0]);
      if (type == "AllBlocksCleared") {
        seen[type];
        continue;
      }
      const uint32_t at = type == "BlockStored" ? 6 : 2;
      if (e.size <= at) continue;
      std::vector<std::string>& hashes = seen[type + " " + str(e.ptr[at])];
      for (const std::string& h : bins(e.ptr[1]))
        hashes.push_back(h);
    }
  }
  for (auto& [key, hashes] : seen)
    std::sort(hashes.begin(), hashes.end());
  return seen;
}

// The hashes of the (type, medium) events in the KV event batches that arrive within `ms`.
std::vector<std::string> events_of(ZmqSocket& sub, const std::string& type,
                                   const std::string& medium, int ms) {
  return events_within(sub, ms)[type + " " + medium];
}

// A daemon with KV events on (namespace `ns`, `extra` remote_tier keys), a subscriber, and a
// worker that published blocks 0..2 (want: their hashes as events give them, sorted).
struct EventsFeed {
  EventsFeed(const RedisCluster& cluster, const std::string& ns, const std::string& extra)
      : endpoint("ipc://" + dir.file("kv-events")),
        daemon(config(cluster, ns, kGeometry, extra) + "events:\n  zmq_endpoint: \"" + endpoint +
               "\"\n") {
    if (!daemon.start()) {
      ADD_FAILURE() << daemon.log();
      return;
    }
    sub = std::make_unique<ZmqSocket>(ZMQ_SUB, endpoint);
    let_subscription_arrive();
    ca = attach(daemon, "writer");
    if (!ca) return;
    EXPECT_EQ(publish_blocks(*ca, 0, 3), "");
    for (uint64_t i = 0; i < 3; ++i)
      want.push_back(bin_of(block(i)));
    std::sort(want.begin(), want.end());
  }
  TempDir dir;
  std::string endpoint;
  Daemon daemon;
  std::unique_ptr<ZmqSocket> sub;
  std::unique_ptr<Connection> ca;
  std::vector<std::string> want;
};

// KV events say medium REMOTE for the blocks this daemon wrote to the cluster, and remove them
// when their expiry has passed: a router learns that any node may fetch them, for as long as
// they can be there.
TEST_F(RemoteTier, KvEventsSayWhatThisDaemonWroteAndWhenItExpires) {
  EventsFeed f(*cluster_, "events", ", ttl_s: 2");
  ASSERT_TRUE(f.ca);
  auto& ca = f.ca;
  const std::vector<std::string> want = f.want;
  std::vector<std::string> stored = events_of(*f.sub, "BlockStored", "REMOTE", 3000);
  std::sort(stored.begin(), stored.end());
  EXPECT_EQ(stored, want);
  // Two seconds on, the values are gone from the cluster; the next event-making call (a
  // publish, whose write finishes after the expiry) says so.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  EXPECT_TRUE(cluster_->keys("events:").empty());
  ASSERT_EQ(publish_blocks(*ca, 10, 1), "");
  std::vector<std::string> removed = events_of(*f.sub, "BlockRemoved", "REMOTE", 3000);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, want);
}

// A flush empties the pool but leaves the cluster as it is: while REMOTE blocks are announced,
// a router hears a removal per block of the pool's own medium, not AllBlocksCleared (which
// would make it forget the REMOTE blocks too).
TEST_F(RemoteTier, AFlushLeavesARoutersRemoteBlocks) {
  EventsFeed f(*cluster_, "flush", "");
  ASSERT_TRUE(f.ca);
  auto& ca = f.ca;
  const std::vector<std::string> want = f.want;
  auto before = events_within(*f.sub, 3000);
  EXPECT_EQ(before["BlockStored REMOTE"], want);
  std::string pool_medium;
  for (const auto& [key, hashes] : before) {
    if (key.rfind("BlockStored ", 0) == 0 && key != "BlockStored REMOTE")
      pool_medium = key.substr(12);
  }
  ASSERT_FALSE(pool_medium.empty());
  auto flushed = ca->flush();
  ASSERT_TRUE(flushed.ok()) << flushed.error().message;
  EXPECT_EQ(flushed.value(), 3u);
  auto after = events_within(*f.sub, 1500);
  EXPECT_EQ(after.count("AllBlocksCleared"), 0u);
  EXPECT_EQ(after["BlockRemoved " + pool_medium], want);
  EXPECT_TRUE(after["BlockRemoved REMOTE"].empty());
  EXPECT_EQ(cluster_->keys("flush:default:").size(), 3u);
}
#endif

// write: on_demote on the 8-bit pool a bf16 pool converts its evictions into: the 8-bit pool's
// own evictions (made by the converter's allocs, on the bf16 pool's calls) are written with the
// bytes they had, before the converter writes other blocks into their pages; another daemon with
// a pool of that geometry fetches them equal.
TEST_F(RemoteTier, OnDemoteUnderAConverterWritesThe8BitPoolsEvictions) {
  const std::string geometry =
      "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: ";
  Daemon a("backend: host\npools:\n  - name: recent\n" + geometry +
           "bf16}\n    capacity: 4 pages\n    convert_evictions_to: older\n"
           "  - name: older\n" +
           geometry + "fp8_e4m3}\n    capacity: 4 pages\n    remote_tier: {cluster: " +
           cluster_->seeds() + ", namespace: conv, write: on_demote}\n");
  Daemon b("backend: host\npools:\n  - name: chat\n" + geometry +
           "fp8_e4m3}\n    capacity: 16 pages\n    remote_tier: {cluster: " + cluster_->seeds() +
           ", namespace: conv, write: off}\n");
  ASSERT_TRUE(a.start()) << a.log();
  ASSERT_TRUE(b.start()) << b.log();
  auto writer = attach(a, "writer", "recent");
  auto older = attach(a, "older", "older");
  auto reader = attach(b, "reader");
  ASSERT_TRUE(writer && older && reader);
  // Blocks 0..3, then 4..7: 0..3 are converted into the 8-bit pool.
  ASSERT_EQ(publish_blocks(*writer, 0, 4), "");
  ASSERT_EQ(publish_blocks(*writer, 4, 4), "");
  // Their 8-bit bytes, as the 8-bit pool holds them.
  const auto page_bytes = [](Connection& c, PageId p) {
    const kernels::PagedKv kv = PoolKernels(c).paged_kv();
    const kernels::PageChunks ch = kernels::page_chunks(kv);
    const auto* base = static_cast<const std::byte*>(kv.base);
    std::vector<std::byte> out;
    for (uint32_t k = 0; k < ch.chunks; ++k) {
      const std::byte* run = base + ch.at(p) + k * ch.chunk;
      out.insert(out.end(), run, run + ch.chunk_bytes);
    }
    return out;
  };
  auto held = older->lookup(chain(0, 4));
  ASSERT_TRUE(held.ok());
  ASSERT_EQ(held.value().size(), 4u) << a.log();
  std::vector<std::vector<std::byte>> want;
  for (const PageId p : held.value())
    want.push_back(page_bytes(*older, p));
  ASSERT_TRUE(older->release(held.value()).ok());
  // Blocks 8..11 push 4..7 into the 8-bit pool, which evicts 0..3 to make room; the 8-bit pool's
  // worker makes no call from here on.
  ASSERT_EQ(publish_blocks(*writer, 8, 4), "");
  ASSERT_TRUE(wait_keys("conv:default:", 4)) << a.log();
  bool any_remote = false;
  const wire::LookupReply r =
      lookup_until(*reader, chain(0, 4), std::chrono::seconds(5), &any_remote);
  ASSERT_EQ(r.pages.size(), 4u) << a.log() << b.log();
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(page_bytes(*reader, r.pages[i]) == want[i]) << "block " << i;
  EXPECT_EQ(pool_stats(*reader).remote_rejected, 0u);
}

// A cluster out of memory (maxmemory with noeviction) refuses writes: they fail softly (counted),
// the daemon goes on serving from its pool, and what was written before is still found.
TEST_F(RemoteTier, WritesToAFullClusterFailSoftly) {
  start_cluster("--maxmemory 3mb --maxmemory-policy noeviction");
  // 128 pages: the tier may hold 16 of them for writes (an eighth), two publishes' worth.
  Pair p = two_daemons("full", 128);
  ASSERT_TRUE(p.ca && p.cb);
  Daemon& a = *p.a;
  Connection* ca = p.ca.get();
  Connection* cb = p.cb.get();
  // 16 KiB pages: about 3 MiB over 3 masters, with Redis's own use, holds some tens of them.
  for (uint64_t id = 0; id < 400; id += 8) {
    ASSERT_EQ(publish_blocks(*ca, 7000 + id, 8), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the writes drain
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  stats::PoolStats st = pool_stats(*ca);
  while (st.remote_stored + st.remote_store_failed + st.remote_store_skipped < 400 &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    st = pool_stats(*ca);
  }
  EXPECT_GT(st.remote_store_failed, 0u)
      << st.remote_stored << " stored, " << st.remote_store_skipped << " skipped";
  EXPECT_GT(st.remote_stored, 0u);
  EXPECT_TRUE(a.running());
  // The first blocks went in before the cluster filled up: B finds them.
  bool any_remote = false;
  const wire::LookupReply r =
      lookup_until(*cb, chain(7000, 2), std::chrono::seconds(5), &any_remote);
  EXPECT_EQ(r.pages.size(), 2u);
  for (size_t i = 0; i < r.pages.size(); ++i)
    EXPECT_EQ(first_difference(*cb, r.pages[i], 7000 + i), -1) << "block " << i;
  // The writer's own pool answers as always.
  auto own = ca->lookup_with_tiers(chain(7392, 8), {});
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own.value().pages.size(), 8u);
}

// Pages waiting for their write stay under an eighth of the pool: a writer that publishes faster
// than the cluster takes them never finds its small pool without pages (blocks past the limit
// are skipped, counted).
TEST_F(RemoteTier, WritesNeverLeaveAllocsWithoutPages) {
  Daemon a(config(*cluster_, "busy", kGeometry, "", 16));
  ASSERT_TRUE(a.start()) << a.log();
  auto ca = attach(a, "writer");
  ASSERT_TRUE(ca);
  for (uint64_t id = 0; id < 400; id += 8)
    ASSERT_EQ(publish_blocks(*ca, 9000 + id, 8), "") << "block " << 9000 + id;
  const stats::PoolStats st = pool_stats(*ca);
  EXPECT_GT(st.remote_store_skipped, 0u);
  EXPECT_EQ(st.remote_store_failed, 0u);
}

}  // namespace
}  // namespace kvpool::testing

// Integration tests: a real kvpoold process and real worker processes (DESIGN §7, issue 3).

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "client/connection/connection.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/raw_frames.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// 2 layers × 2 KV heads × 16 tokens × head dim 64 × fp16 × (K, V) = 16 KiB pages.
constexpr char kSmallPool[] = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)";

BlockHash H(uint64_t i) {
  return BlockHash{0x1000 + i, 0xfeedbeefull * (i + 1)};
}

// The bytes a worker writes for block `id`: a pattern no other block shares.
std::byte pattern(uint64_t id, uint64_t k) {
  return static_cast<std::byte>((id * 131 + k * 7 + (k >> 8)) & 0xff);
}

void fill(const Connection& c, PageId page, uint64_t id) {
  std::byte* p = c.page(page);
  for (uint64_t k = 0; k < c.pool().page_stride; ++k)
    p[k] = pattern(id, k);
}

bool holds_pattern(const Connection& c, PageId page, uint64_t id) {
  const std::byte* p = c.page(page);
  for (uint64_t k = 0; k < c.pool().page_stride; ++k) {
    if (p[k] != pattern(id, k)) return false;
  }
  return true;
}

// Polls stats until pred holds (the daemon notices a closed connection asynchronously).
template <typename Pred>
bool eventually(Connection& c, Pred pred) {
  for (int i = 0; i < 300; ++i) {
    auto s = c.stats();
    if (s.ok() && pred(s.value())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(Daemon, TwoWorkersShareAPrefixAndSeeEachOthersBytes) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  Pipe published, verified;
  // Worker A computes four blocks, publishes them and keeps holding them until B is done.
  const pid_t a = spawn_worker([&] {
    auto c = Connection::attach(d.socket(), "worker-a");
    if (!c.ok()) return 1;
    auto pages = c.value()->alloc(4);
    if (!pages.ok()) return 2;
    std::vector<PublishItem> items;
    for (uint64_t i = 0; i < 4; ++i) {
      fill(*c.value(), pages.value()[i], i);
      items.push_back({pages.value()[i], H(i)});
    }
    auto r = c.value()->publish(items);
    if (!r.ok()) return 3;
    for (const auto& res : r.value()) {
      if (res.kind != PublishResult::Kind::stored) return 4;
    }
    published.signal();
    verified.wait();
    return 0;
  });
  ASSERT_TRUE(published.wait());
  // Worker B, another process, asks for the chain of six blocks: the first four hit, zero copy.
  const int b = run_worker([&] {
    auto c = Connection::attach(d.socket(), "worker-b");
    if (!c.ok()) return 1;
    std::vector<BlockHash> chain;
    for (uint64_t i = 0; i < 6; ++i)
      chain.push_back(H(i));
    auto hits = c.value()->lookup(chain);
    if (!hits.ok() || hits.value().size() != 4) return 2;
    for (uint64_t i = 0; i < 4; ++i) {
      if (!holds_pattern(*c.value(), hits.value()[i], i)) return 3;
    }
    auto s = c.value()->stats();
    if (!s.ok() || s.value().session_held_pages != 4 || s.value().in_use != 4) return 4;
    return 0;
  });
  EXPECT_EQ(b, 0);
  verified.signal();
  EXPECT_EQ(wait_worker(a), 0);

  auto c = attach(d, "observer");
  ASSERT_NE(c, nullptr);
  // Both workers are gone: the published pages stay cached, nothing is in use.
  EXPECT_TRUE(eventually(*c, [](const wire::StatsReply& s) {
    return s.in_use == 0 && s.cached == 4 && s.free == 60;
  }));
  auto s = c->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().counter("hit_blocks"), 4u);
  EXPECT_EQ(s.value().counter("published"), 4u);
  EXPECT_EQ(d.stop(), 0) << d.log();
}

TEST(Daemon, DuplicatePublishHandsOutTheFirstWorkersPage) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a");
  auto b = attach(d, "b");
  ASSERT_TRUE(a && b);
  auto pa = a->alloc(1);
  auto pb = b->alloc(1);
  ASSERT_TRUE(pa.ok() && pb.ok());
  fill(*a, pa.value()[0], 7);
  ASSERT_TRUE(a->publish(std::vector<PublishItem>{{pa.value()[0], H(7)}}).ok());
  auto r = b->publish(std::vector<PublishItem>{{pb.value()[0], H(7)}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r.value()[0].kind, PublishResult::Kind::duplicate);
  EXPECT_EQ(r.value()[0].page, pa.value()[0]);
  EXPECT_TRUE(holds_pattern(*b, r.value()[0].page, 7));  // B now reads A's copy
  EXPECT_TRUE(b->release(pb.value()).ok());              // and drops its own
}

TEST(Daemon, KilledWorkerLeavesNoReferenceBehind) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  Pipe holding;
  const pid_t w = spawn_worker([&] {
    auto c = Connection::attach(d.socket(), "doomed");
    if (!c.ok()) return 1;
    auto pages = c.value()->alloc(10);
    if (!pages.ok()) return 2;
    std::vector<PublishItem> items;
    for (uint64_t i = 0; i < 3; ++i)
      items.push_back({pages.value()[i], H(100 + i)});
    if (!c.value()->publish(items).ok()) return 3;
    holding.signal();
    ::pause();
    return 0;
  });
  ASSERT_TRUE(holding.wait());
  auto c = attach(d, "observer");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->stats().value().in_use, 10u);
  ::kill(w, SIGKILL);
  EXPECT_EQ(wait_worker(w), 128 + SIGKILL);
  // Its 3 published pages stay cached, its 7 others are free again.
  EXPECT_TRUE(eventually(*c, [](const wire::StatsReply& s) {
    return s.in_use == 0 && s.cached == 3 && s.free == 61 && s.sessions == 1;
  })) << d.log();
  // And the cached ones are still served.
  auto hits = c->lookup(std::vector<BlockHash>{H(100), H(101), H(102)});
  ASSERT_TRUE(hits.ok());
  EXPECT_EQ(hits.value().size(), 3u);
}

TEST(Daemon, TenantsWithTheSameHashesNeverSharePages) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a worker under a second uid";
  // Both tenants use the one pool, which must say they may (they share its bytes).
  const std::string config = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
    share_between_tenants: true
socket: {mode: "0666"}
tenants:
  - {name: alpha, uids: [0], pools: [default]}
  - {name: beta, uids: [4242], pools: [default]}
default_tenant: ""
)";
  Daemon d(config);
  ASSERT_TRUE(d.start()) << d.log();
  // The scratch directory is 0700; let the other uids reach the socket inside it.
  std::filesystem::permissions(std::filesystem::path(d.socket()).parent_path(),
                               std::filesystem::perms::owner_all |
                                   std::filesystem::perms::group_exec |
                                   std::filesystem::perms::others_exec);
  auto alpha = attach(d, "alpha-worker");
  ASSERT_NE(alpha, nullptr);
  EXPECT_EQ(alpha->pool().tenant, "alpha");
  auto pages = alpha->alloc(2);
  ASSERT_TRUE(pages.ok());
  ASSERT_TRUE(
      alpha->publish(std::vector<PublishItem>{{pages.value()[0], H(1)}, {pages.value()[1], H(2)}})
          .ok());
  // Tenant beta (another uid) asks for the same chain: no hit, and its own publish stores
  // separate pages instead of being handed alpha's.
  const int beta = run_worker([&] {
    if (::setgid(4242) != 0 || ::setuid(4242) != 0) return 1;
    auto c = Connection::attach(d.socket(), "beta-worker");
    if (!c.ok()) return 2;
    if (c.value()->pool().tenant != "beta") return 3;
    auto hits = c.value()->lookup(std::vector<BlockHash>{H(1), H(2)});
    if (!hits.ok() || !hits.value().empty()) return 4;
    auto own = c.value()->alloc(1);
    if (!own.ok()) return 5;
    auto r = c.value()->publish(std::vector<PublishItem>{{own.value()[0], H(1)}});
    if (!r.ok() || r.value()[0].kind != PublishResult::Kind::stored) return 6;
    return 0;
  });
  EXPECT_EQ(beta, 0);
  // A uid that no tenant lists is refused, since there is no default tenant.
  const int stranger = run_worker([&] {
    if (::setgid(5151) != 0 || ::setuid(5151) != 0) return 1;
    auto c = Connection::attach(d.socket(), "stranger");
    if (c.ok()) return 2;
    return c.error().status.code() == Errc::permission_denied ? 0 : 3;
  });
  EXPECT_EQ(stranger, 0);
}

TEST(Daemon, QuotaExceededIsAClearError) {
  const std::string config = std::string(kSmallPool) + R"(
limits: {max_pages_per_session: 4, max_pages_per_tenant: 6}
)";
  Daemon d(config);
  ASSERT_TRUE(d.start()) << d.log();
  auto a = attach(d, "a");
  auto b = attach(d, "b");
  ASSERT_TRUE(a && b);
  auto over = a->alloc(5);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().status.code(), Errc::quota_exceeded);
  EXPECT_NE(over.error().message.find("max_pages_per_session"), std::string::npos)
      << over.error().message;
  ASSERT_TRUE(a->alloc(4).ok());
  EXPECT_EQ(a->alloc(1).error().status.code(), Errc::quota_exceeded);
  // The tenant (both sessions run as one uid) has 2 pages left.
  ASSERT_TRUE(b->alloc(2).ok());
  auto tenant_over = b->alloc(1);
  ASSERT_FALSE(tenant_over.ok());
  EXPECT_NE(tenant_over.error().message.find("max_pages_per_tenant"), std::string::npos);
  // Nothing was taken by the refused calls.
  EXPECT_EQ(a->stats().value().in_use, 6u);
}

void send_bytes(int fd, const std::vector<std::byte>& b) {
  ASSERT_EQ(::send(fd, b.data(), b.size(), MSG_NOSIGNAL), static_cast<ssize_t>(b.size()));
}

TEST(Daemon, MalformedFramesGetErrorsAndTheDaemonServesOn) {
  Daemon d(kSmallPool, "--frame-timeout-ms 300");
  ASSERT_TRUE(d.start()) << d.log();

  {  // Unknown opcode: an error, and the connection goes on.
    auto c = attach(d, "unknown-opcode");
    auto f = frame(wire::StatsRequest{});
    f[10] = std::byte{99};
    send_bytes(c->socket_fd(), f);
    const RawReply r = read_raw_reply(c->socket_fd());
    ASSERT_FALSE(r.closed);
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status.code(), Errc::unknown_opcode);
    EXPECT_EQ(r.header.request_id, 77u);
    EXPECT_TRUE(c->stats().ok());
  }
  {  // A payload that does not decode (count says 5 pages, 2 follow): an error, go on.
    auto c = attach(d, "short-payload");
    auto f = frame(wire::ReleaseRequest{{1, 2}});
    f[wire::kHeaderBytes] = std::byte{5};
    send_bytes(c->socket_fd(), f);
    const RawReply r = read_raw_reply(c->socket_fd());
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status.code(), Errc::malformed_frame);
    EXPECT_TRUE(c->stats().ok());
  }
  {  // Wrong version: an error, then the connection is closed.
    auto c = attach(d, "wrong-version");
    auto f = frame(wire::StatsRequest{});
    f[8] = std::byte{static_cast<uint8_t>(wire::kProtocolVersion + 1)};
    send_bytes(c->socket_fd(), f);
    const RawReply r = read_raw_reply(c->socket_fd());
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status.code(), Errc::unsupported_version);
    EXPECT_TRUE(peer_closed(c->socket_fd()));
  }
  {  // Oversized length: frame_too_large, closed; nothing was allocated for it.
    auto c = attach(d, "oversized");
    auto f = frame(wire::StatsRequest{});
    const uint32_t huge = 0x7fffffff;
    std::memcpy(f.data() + 4, &huge, 4);
    send_bytes(c->socket_fd(), f);
    const RawReply r = read_raw_reply(c->socket_fd());
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status.code(), Errc::frame_too_large);
    EXPECT_TRUE(peer_closed(c->socket_fd()));
  }
  {  // Garbage magic: closed after an error.
    auto c = attach(d, "garbage");
    send_bytes(c->socket_fd(), std::vector<std::byte>(64, std::byte{0x41}));
    const RawReply r = read_raw_reply(c->socket_fd());
    ASSERT_TRUE(r.error.has_value());
    EXPECT_EQ(r.error->status.code(), Errc::malformed_frame);
    EXPECT_TRUE(peer_closed(c->socket_fd()));
  }
  {  // Requests before hello are refused.
    const int code = run_worker([&] {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, d.socket().c_str(), sizeof(addr.sun_path) - 1);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 1;
      const auto f = frame(wire::AllocRequest{1});
      if (::send(fd, f.data(), f.size(), 0) != static_cast<ssize_t>(f.size())) return 2;
      const RawReply r = read_raw_reply(fd);
      return r.error && r.error->status.code() == Errc::not_attached ? 0 : 3;
    });
    EXPECT_EQ(code, 0);
  }
  {  // Ids out of range, pages not held, double release: errors naming the page.
    auto c = attach(d, "bad-ids");
    auto out = c->release(std::vector<PageId>{1'000'000});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.error().status.code(), Errc::invalid_page);
    EXPECT_NE(out.error().message.find("1000000"), std::string::npos) << out.error().message;
    EXPECT_EQ(c->release(std::vector<PageId>{3}).error().status.code(), Errc::not_held);
    auto p = c->alloc(1);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(c->release(p.value()).ok());
    EXPECT_EQ(c->release(p.value()).error().status.code(), Errc::not_held);
    EXPECT_EQ(c->alloc(65).error().status.code(), Errc::exceeds_capacity);
  }
  {  // Half a frame, then silence: others are served meanwhile; the stalled one is closed.
    auto stalled = attach(d, "stalled");
    auto f = frame(wire::StatsRequest{});
    send_bytes(stalled->socket_fd(), std::vector<std::byte>(f.begin(), f.begin() + 9));
    auto other = attach(d, "other");
    ASSERT_NE(other, nullptr);
    EXPECT_TRUE(other->alloc(2).ok());
    EXPECT_TRUE(other->stats().ok());
    EXPECT_TRUE(peer_closed(stalled->socket_fd()));  // after the 300 ms frame timeout
  }
  {  // Replies left unread, then a bad header, then more bytes: closed at the frame timeout, and
     // the bytes that keep coming are not buffered without limit.
    auto flood = attach(d, "flood");
    const int fd = flood->socket_fd();
    std::vector<std::byte> many;
    for (int i = 0; i < 20000; ++i)
      wire::encode_request(1, wire::StatsRequest{}, many);
    size_t sent = 0;
    while (sent < many.size()) {  // replies pile up unread on our side
      const ssize_t n =
          ::send(fd, many.data() + sent, many.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    send_bytes(fd, std::vector<std::byte>(16, std::byte{0x58}));
    const std::vector<std::byte> junk(64 * 1024, std::byte{0});
    bool closed = false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!closed && std::chrono::steady_clock::now() < until) {
      const ssize_t n = ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) closed = true;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    EXPECT_TRUE(closed) << "the daemon kept a connection that will never read its replies";
  }
  EXPECT_TRUE(d.running());
  auto c = attach(d, "after");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(
      eventually(*c, [](const wire::StatsReply& s) { return s.in_use == 0 && s.sessions == 1; }));
}

TEST(Daemon, ConfigErrorsNameTheKey) {
  TempDir dir;
  const std::string bad = dir.file("bad.yaml");
  std::ofstream(bad) << "pools:\n  - name: p\n    geometry: {layers: 2, kv_heads: 2, head_dim: "
                        "0, tokens_per_page: 16, dtype: fp16}\n    capacity: 8 pages\n";
  std::string out;
  EXPECT_EQ(run_command(std::string(KVPOOLD_BIN) + " --check-config " + bad, out), 1);
  EXPECT_NE(out.find("pools[0].geometry.head_dim"), std::string::npos) << out;
  EXPECT_NE(out.find(bad), std::string::npos) << out;
  // Starting with it fails the same way, before any socket exists.
  EXPECT_EQ(
      run_command(std::string(KVPOOLD_BIN) + " --config " + bad + " --socket " + dir.file("s.sock"),
                  out),
      1);
  EXPECT_NE(out.find("pools[0].geometry.head_dim"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.file("s.sock")));
  std::ofstream(dir.file("typo.yaml")) << "limits:\n  max_sesions: 3\n";
  EXPECT_EQ(run_command(std::string(KVPOOLD_BIN) + " --check-config " + dir.file("typo.yaml"), out),
            1);
  EXPECT_NE(out.find("limits.max_sesions"), std::string::npos) << out;
}

TEST(Daemon, RestartAfterKill9StartsClean) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  const pid_t first = d.pid();
  {
    auto c = attach(d, "before-crash");
    ASSERT_TRUE(c->alloc(8).ok());
    d.kill9();
    EXPECT_FALSE(c->stats().ok());  // the daemon is gone: an error, not a hang
  }
  EXPECT_TRUE(std::filesystem::exists(d.socket()));  // stale socket file left by kill -9
  EXPECT_EQ(shm_segments_of(first), 0);              // but no shared memory name
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "after-restart");
  ASSERT_NE(c, nullptr);
  auto s = c->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().free, 64u);
  EXPECT_EQ(s.value().in_use, 0u);
  EXPECT_EQ(s.value().cached, 0u);
}

TEST(Daemon, NormalStopRemovesSocketAndLeavesNothingInDevShm) {
  Daemon d("");  // the built-in default config
  ASSERT_TRUE(d.start()) << d.log();
  const pid_t pid = d.pid();
  auto c = attach(d, "w");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->pool().pool_name, "default");
  EXPECT_EQ(c->pool().backend, "host");
  EXPECT_EQ(c->pool().geometry.layers, 32u);
  EXPECT_GT(c->pool().num_pages, 0u);
  EXPECT_EQ(shm_segments_of(pid), 0);  // the segment has no name even while running
  c.reset();
  EXPECT_EQ(d.stop(), 0) << d.log();
  EXPECT_FALSE(std::filesystem::exists(d.socket()));
  EXPECT_NE(d.log().find("event=ready"), std::string::npos);
}

TEST(Daemon, ASecondDaemonOnTheSameSocketIsRefused) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  std::string out;
  EXPECT_EQ(run_command(std::string(KVPOOLD_BIN) + " --socket " + d.socket(), out), 1);
  EXPECT_NE(out.find("another kvpoold is listening"), std::string::npos) << out;
  EXPECT_TRUE(attach(d, "still-served") != nullptr);
}

TEST(Daemon, CApiWorksFromAWorkerWrittenInC) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  std::string out;
  EXPECT_EQ(run_command(std::string(C_WORKER_BIN) + " " + d.socket(), out), 0) << out;
  EXPECT_NE(out.find("c worker ok"), std::string::npos) << out;
}

TEST(Daemon, ClientRefusesWhatTheProtocolCannotCarry) {
  Daemon d(kSmallPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto named = Connection::attach(d.socket(), std::string(wire::kMaxNameBytes + 1, 'w'));
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.error().status.code(), Errc::invalid_argument);
  auto c = attach(d, "w");
  ASSERT_NE(c, nullptr);
  auto big = c->release(std::vector<PageId>(wire::kMaxBatch + 1, 0));
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().status.code(), Errc::invalid_argument);
  EXPECT_NE(big.error().message.find("exceeds"), std::string::npos);
  EXPECT_TRUE(c->stats().ok());  // nothing was sent, the connection is fine
}

// A datagram socket standing in for systemd's NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) std::abort();
  }
  ~NotifySocket() { ::close(fd_); }
  // The next datagram, or nullopt after timeout_ms.
  std::optional<std::string> next(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return std::nullopt;
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0) return std::nullopt;
    return std::string(buf, static_cast<size_t>(n));
  }

 private:
  std::string path_;
  int fd_ = -1;
};

TEST(Daemon, NotifiesSystemdReadyWatchdogAndStopping) {
  TempDir dir;
  NotifySocket notify(dir.file("notify.sock"));
  ::setenv("NOTIFY_SOCKET", dir.file("notify.sock").c_str(), 1);
  ::setenv("WATCHDOG_USEC", "200000", 1);  // WatchdogSec=0.2: pings every 100 ms
  Daemon d(kSmallPool);
  const bool started = d.start();
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(started) << d.log();
  const auto ready = notify.next(2000);
  ASSERT_TRUE(ready.has_value());
  EXPECT_NE(ready->find("READY=1"), std::string::npos) << *ready;
  EXPECT_NE(ready->find("STATUS=serving 1 pool(s) on " + d.socket()), std::string::npos) << *ready;
  // Watchdog pings at half WATCHDOG_USEC, from the event loop.
  int pings = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(650);
  while (std::chrono::steady_clock::now() < until) {
    const auto m = notify.next(200);
    if (m && *m == "WATCHDOG=1") ++pings;
  }
  EXPECT_GE(pings, 4);
  EXPECT_LE(pings, 8);
  EXPECT_EQ(d.stop(), 0);
  bool stopping = false;
  while (const auto m = notify.next(500))
    stopping = stopping || m->find("STOPPING=1") == 0;
  EXPECT_TRUE(stopping);
}

// Waits until the daemon's log has `n` lines containing `needle`.
bool log_has(const Daemon& d, const std::string& needle, size_t n = 1) {
  for (int i = 0; i < 300; ++i) {
    const std::string log = d.log();
    size_t count = 0;
    for (size_t at = log.find(needle); at != std::string::npos; at = log.find(needle, at + 1)) {
      ++count;
    }
    if (count >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(Daemon, SighupReloadsLimitsKeepsTheOldConfigOnErrorAndNamesRestarts) {
  TempDir dir;
  NotifySocket notify(dir.file("notify.sock"));
  ::setenv("NOTIFY_SOCKET", dir.file("notify.sock").c_str(), 1);
  Daemon d(std::string(kSmallPool) + "limits: {max_pages_per_session: 4}\n");
  const bool started = d.start();
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(started) << d.log();
  ASSERT_TRUE(notify.next(2000).has_value());  // READY=1
  auto c = attach(d, "w");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->alloc(5).error().status.code(), Errc::quota_exceeded);

  // A larger limit applies to the running session at once.
  std::ofstream(d.config_path()) << kSmallPool << "limits: {max_pages_per_session: 10}\n";
  ::kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_has(d, "event=reloaded")) << d.log();
  auto reloading = notify.next(2000);
  ASSERT_TRUE(reloading.has_value());
  EXPECT_EQ(reloading->rfind("RELOADING=1\nMONOTONIC_USEC=", 0), 0u) << *reloading;
  auto ready = notify.next(2000);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(ready->rfind("READY=1\nSTATUS=serving", 0), 0u) << *ready;
  auto five = c->alloc(5);
  ASSERT_TRUE(five.ok()) << five.error().message;

  // An invalid file is refused with its key named, and the running config stays.
  std::ofstream(d.config_path()) << kSmallPool << "limits: {max_pages_per_sesion: 1}\n";
  ::kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_has(d, "event=reload_failed")) << d.log();
  EXPECT_NE(d.log().find("limits.max_pages_per_sesion"), std::string::npos) << d.log();
  EXPECT_TRUE(c->alloc(5).ok());                                       // 10 held: at the limit
  EXPECT_EQ(c->alloc(1).error().status.code(), Errc::quota_exceeded);  // still limit 10

  // Pools cannot change under running sessions: named as needing a restart, not applied.
  std::ofstream(d.config_path()) << R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 128 pages
limits: {max_pages_per_session: 20}
)";
  ::kill(d.pid(), SIGHUP);
  ASSERT_TRUE(log_has(d, "event=reload_needs_restart")) << d.log();
  EXPECT_NE(d.log().find("keys=pools"), std::string::npos) << d.log();
  EXPECT_EQ(c->stats().value().total, 64u);  // the running pool is unchanged
  EXPECT_TRUE(c->alloc(10).ok());            // the new limit did apply
  EXPECT_TRUE(d.running());
}

TEST(Daemon, AttachReportsAMissingDaemonClearly) {
  TempDir dir;
  auto c = Connection::attach(dir.file("nothing.sock"), "w");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().status.code(), Errc::connection_lost);
  EXPECT_NE(c.error().message.find("kvpoold is not running"), std::string::npos);
}

}  // namespace
}  // namespace kvpool::testing

// Hardening, connections: no client can lock others (operators included) out of kvpoold by
// holding connections, and nothing unattached can make the daemon hold memory.
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/hardening_util.h"
#include "tests/integration/raw_frames.h"

namespace kvpool::testing {
namespace {

using client::Connection;

// Runs in a worker under `uid`: opens `accepted` connections that never say hello, then one more,
// which must be refused at once for the per-uid cap; signals `ready`, then waits until the
// daemon has closed every idle one (the hello deadline). Exit code 0 when all of that held.
int hold_idle_connections(const std::string& socket, uid_t uid, int accepted, bool expect_refusal,
                          const Pipe& ready) {
  if (::setgid(uid) != 0 || ::setuid(uid) != 0) return 90;
  std::vector<int> fds;
  for (int i = 0; i < accepted; ++i) {
    const int fd = connect_raw(socket);
    if (fd < 0) return 91;
    fds.push_back(fd);
  }
  if (expect_refusal) {
    const int extra = connect_raw(socket);
    const RawReply r = read_raw_reply(extra, 5000);
    if (!r.error || r.error->status.code() != Errc::too_many_sessions) return 92;
    if (r.error->message.find("limits.max_sessions_per_uid") == std::string::npos) return 93;
    ::close(extra);
  }
  // Accepted ones got nothing (they were not refused).
  for (const int fd : fds) {
    if (readable_within(fd, 0)) return 94;
  }
  ready.signal();
  // The daemon closes them at the hello deadline, with a clear close.
  for (const int fd : fds) {
    if (!readable_within(fd, 20000) || !peer_closed(fd)) return 95;
    ::close(fd);
  }
  return 0;
}

TEST(Hardening, IdleConnectionsNeverLockOutWorkersOrOperators) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run workers under other uids";
  const std::string config = std::string(kHardeningPool) + R"(
limits: {max_sessions: 6, max_sessions_per_uid: 3, hello_timeout_ms: 3000}
)";
  Daemon d(config);
  ASSERT_TRUE(d.start()) << d.log();
  open_socket_dir(d);
  // Two uids fill every session slot with connections that never say hello; the first also
  // tries a fourth, which its uid's cap refuses.
  Pipe x_ready, y_ready;
  const pid_t x = spawn_worker(
      [&] { return hold_idle_connections(d.socket(), 4242, 3, /*expect_refusal=*/true, x_ready); });
  ASSERT_TRUE(x_ready.wait());
  const pid_t y = spawn_worker([&] {
    return hold_idle_connections(d.socket(), 4243, 3, /*expect_refusal=*/false, y_ready);
  });
  ASSERT_TRUE(y_ready.wait());

  // Every slot is taken: a worker of a third uid is refused, naming the limit...
  const int stranger = run_worker([&] {
    if (::setgid(4244) != 0 || ::setuid(4244) != 0) return 90;
    auto c = Connection::attach(d.socket(), "stranger");
    if (c.ok()) return 1;
    if (c.error().status.code() != Errc::too_many_sessions) return 2;
    return c.error().message.find("limits.max_sessions") != std::string::npos ? 0 : 3;
  });
  EXPECT_EQ(stranger, 0);
  // ...but an operator (root) still gets in, and sees the daemon.
  auto admin = Connection::attach(d.socket(), "operator", "", Connection::Memory::none);
  ASSERT_TRUE(admin.ok()) << admin.error().message;
  EXPECT_TRUE(admin.value()->stats().ok());

  // The hello deadline frees the slots.
  EXPECT_EQ(wait_worker(x), 0);
  EXPECT_EQ(wait_worker(y), 0);
  const int later = run_worker([&] {
    if (::setgid(4244) != 0 || ::setuid(4244) != 0) return 90;
    auto c = Connection::attach(d.socket(), "stranger");
    return c.ok() ? 0 : 1;
  });
  EXPECT_EQ(later, 0);
  const stats::DaemonStats s = daemon_stats(*admin.value());
  EXPECT_GE(s.closed_by_limits, 6u);
  EXPECT_GE(s.sessions_refused, 2u);
  EXPECT_NE(d.log().find("no hello within limits.hello_timeout_ms"), std::string::npos);
}

TEST(Hardening, AFrameBeforeHelloMayNotBeLarge) {
  Daemon d(kHardeningPool);
  ASSERT_TRUE(d.start()) << d.log();
  const int fd = connect_raw(d.socket());
  ASSERT_GE(fd, 0);
  // A header announcing 8 MiB, and nothing else: refused as soon as the header is in.
  std::vector<std::byte> header = frame(wire::StatsRequest{});
  const uint32_t length = wire::kMaxPayloadBytes;
  std::memcpy(header.data() + 4, &length, sizeof length);
  ASSERT_TRUE(send_all(fd, header));
  const RawReply r = read_raw_reply(fd, 5000);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status.code(), Errc::frame_too_large);
  EXPECT_NE(r.error->message.find("before hello"), std::string::npos) << r.error->message;
  EXPECT_TRUE(peer_closed(fd));
  ::close(fd);
  // A hello itself is small and still works.
  auto c = Connection::attach(d.socket(), "after");
  ASSERT_TRUE(c.ok()) << c.error().message;
}

}  // namespace
}  // namespace kvpool::testing

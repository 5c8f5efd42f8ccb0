// Hardening, memory: what a client sends or leaves unread cannot make kvpoold hold memory beyond
// the configured limits, and the connection that holds the most is the one closed.
#include <sys/socket.h>
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

// A lookup of `n` hashes: a frame of 16 + 4 + 16·n bytes.
std::vector<std::byte> lookup_frame(uint32_t n) {
  std::vector<BlockHash> chain(n);
  for (uint32_t i = 0; i < n; ++i)
    chain[i] = test_hash(1000000 + i);
  return frame(wire::LookupRequest{chain});
}

// A publish of `n` items of pages the sender does not hold: a frame of 16 + 4 + 20·n bytes.
std::vector<std::byte> publish_frame(uint32_t n) {
  std::vector<PublishItem> items(n);
  for (uint32_t i = 0; i < n; ++i)
    items[i] = PublishItem{i % 64, test_hash(i)};
  return frame(wire::PublishRequest{items});
}

// Polls the daemon's counters until `pred` holds (it handles other connections meanwhile).
template <typename Pred>
bool eventually(Connection& c, Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred(daemon_stats(c))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(HardeningMemory, LargeFramesLeaveNoLargeBuffersBehind) {
  Daemon d(kHardeningPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto observer = attach(d, "observer", "", Connection::Memory::none);
  ASSERT_NE(observer, nullptr);
  const uint64_t rss_before = rss_bytes(d.pid());
  // 32 connections each send one 4 MiB request (a lookup of kMaxBatch hashes) and get its reply.
  const std::vector<std::byte> big = lookup_frame(wire::kMaxBatch);
  std::vector<std::unique_ptr<Connection>> conns;
  for (int i = 0; i < 32; ++i) {
    conns.push_back(attach(d, "big-" + std::to_string(i), "", Connection::Memory::none));
    ASSERT_NE(conns.back(), nullptr);
    ASSERT_TRUE(send_all(conns.back()->socket_fd(), big));
    const RawReply r = read_raw_reply(conns.back()->socket_fd(), 10000);
    ASSERT_FALSE(r.closed);
    EXPECT_FALSE(r.error.has_value());
  }
  // Every connection's buffers went back to an idle connection's size (4 KiB of input each).
  const stats::DaemonStats s = daemon_stats(*observer);
  EXPECT_LE(s.buffered_bytes, uint64_t{34} * (64 << 10)) << s.buffered_bytes;
  const uint64_t rss_after = rss_bytes(d.pid());
  // Kept buffers would be 32 × 4 MiB; what is left is allocator slack.
  if (kRssMeansHeld) {
    EXPECT_LT(rss_after, rss_before + (uint64_t{64} << 20))
        << "daemon RSS grew from " << rss_before << " to " << rss_after;
  }
}

TEST(HardeningMemory, TheBufferBudgetClosesTheLargestHolderOnly) {
  const std::string config = std::string(kHardeningPool) + R"(
limits: {max_buffered_bytes: 16MiB}
)";
  Daemon d(config);
  ASSERT_TRUE(d.start()) << d.log();
  auto observer = attach(d, "observer", "", Connection::Memory::none);
  ASSERT_NE(observer, nullptr);
  // The largest holder: 4.5 MiB of a 5 MiB publish, sent and left there.
  const std::vector<std::byte> hog_frame = publish_frame(wire::kMaxBatch);
  const size_t hog_part = (size_t{9} << 20) / 2;
  auto hog = attach(d, "hog", "", Connection::Memory::none);
  ASSERT_NE(hog, nullptr);
  ASSERT_TRUE(send_all(hog->socket_fd(),
                       std::vector<std::byte>(hog_frame.begin(), hog_frame.begin() + hog_part)));
  ASSERT_TRUE(eventually(*observer, [&](const stats::DaemonStats& s) {
    return s.buffered_bytes >= hog_part;
  })) << daemon_stats(*observer).buffered_bytes;
  // Four workers with 3.5 MiB of their 4 MiB requests in: the fourth passes the 16 MiB budget.
  const std::vector<std::byte> work = lookup_frame(wire::kMaxBatch);
  const size_t work_part = (size_t{7} << 20) / 2;
  std::vector<std::unique_ptr<Connection>> workers;
  for (int i = 0; i < 4; ++i) {
    workers.push_back(attach(d, "worker-" + std::to_string(i), "", Connection::Memory::none));
    ASSERT_NE(workers.back(), nullptr);
    ASSERT_TRUE(send_all(workers.back()->socket_fd(),
                         std::vector<std::byte>(work.begin(), work.begin() + work_part)))
        << d.log();
  }
  // The hog is closed, not the workers: they finish their requests and are answered.
  ASSERT_TRUE(readable_within(hog->socket_fd(), 10000));
  EXPECT_TRUE(peer_closed(hog->socket_fd()));
  for (auto& w : workers) {
    ASSERT_TRUE(
        send_all(w->socket_fd(), std::vector<std::byte>(work.begin() + work_part, work.end())));
    const RawReply r = read_raw_reply(w->socket_fd(), 10000);
    EXPECT_FALSE(r.closed);
    EXPECT_FALSE(r.error.has_value());
  }
  EXPECT_GE(daemon_stats(*observer).closed_by_limits, 1u);
  EXPECT_NE(d.log().find("event=buffer_budget_exceeded"), std::string::npos) << d.log();
}

TEST(HardeningMemory, UnreadLargeRepliesAreBoundedByTheBacklogLimit) {
  Daemon d(kHardeningPool);
  ASSERT_TRUE(d.start()) << d.log();
  // 200 sessions make every `sessions` reply ~10 KB.
  std::vector<std::unique_ptr<Connection>> crowd;
  for (int i = 0; i < 200; ++i) {
    crowd.push_back(attach(d, "crowd-worker-" + std::to_string(i), "", Connection::Memory::none));
    ASSERT_NE(crowd.back(), nullptr);
  }
  auto observer = attach(d, "observer", "", Connection::Memory::none);
  ASSERT_NE(observer, nullptr);
  const uint64_t rss_before = rss_bytes(d.pid());
  // A client pipelines 20,000 sessions requests (~200 MB of replies) and never reads.
  auto flood = attach(d, "flood", "", Connection::Memory::none);
  ASSERT_NE(flood, nullptr);
  std::vector<std::byte> many;
  for (int i = 0; i < 20000; ++i)
    wire::encode_request(static_cast<uint32_t>(i), wire::SessionsRequest{}, many);
  size_t sent = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (sent < many.size() && std::chrono::steady_clock::now() < until) {
    const ssize_t n = ::send(flood->socket_fd(), many.data() + sent, many.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // The daemon stops at its backlog limit (16 MiB, plus one reply and the buffered input), and
  // serves others meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(observer->stats().ok());
  const stats::DaemonStats s = daemon_stats(*observer);
  EXPECT_LE(s.buffered_bytes, uint64_t{20} << 20) << s.buffered_bytes;
  const uint64_t rss_after = rss_bytes(d.pid());
  if (kRssMeansHeld) {
    EXPECT_LT(rss_after, rss_before + (uint64_t{40} << 20))
        << "daemon RSS grew from " << rss_before << " to " << rss_after;
  }
  // The client then reads: it gets every reply, in order.
  size_t replies = 0;
  uint32_t expected_id = 0;
  while (replies * 1 < sent / 16 && replies < 20000) {
    const RawReply r = read_raw_reply(flood->socket_fd(), 10000);
    ASSERT_FALSE(r.closed) << "after " << replies << " replies";
    ASSERT_EQ(r.header.request_id, expected_id++);
    ++replies;
  }
  EXPECT_EQ(replies, sent / 16);
}

}  // namespace
}  // namespace kvpool::testing

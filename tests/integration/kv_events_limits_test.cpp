// The KV-event endpoint under misuse, through a real kvpoold: a subscriber that never reads while
// workers publish batches of 65,536 blocks, with and without token ids (the daemon's memory
// stays within events.zmq_queue_bytes and zmq_dropped counts what it dropped), a big batch split
// into messages of at most 4,096 hashes with consecutive sequence numbers, and a flood of TCP
// connections that never complete ZeroMQ's handshake (workers still attach and allocate at once,
// and a real subscriber gets events afterwards).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <gtest/gtest.h>
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/hardening_util.h"
#include "tests/integration/test_attach.h"
#include "tests/integration/zmq_test_socket.h"

namespace kvpool::testing {
namespace {

constexpr uint32_t kBatchBlocks = 65536;
constexpr uint64_t kHashesPerMessage = 4096;  // KvEventPublisher::kMaxHashesPerMessage

// 32-byte pages, so that a pool of 65,536 of them is small and its events are what is big.
std::string config(const std::string& events) {
  return R"(backend: host
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 1, dtype: fp16}
    capacity: 65536 pages
events:
)" + events;
}

// Publishes `n` new blocks (hashes unique to `round`) and releases them to the cache. With
// `tpp` > 0 the blocks are one chain of `tpp` token ids each (the client splits the call at
// kMaxBatch ids, chaining each part to the last).
void publish_round(client::Connection& w, uint32_t round, uint32_t n, uint32_t tpp = 0) {
  auto pages = w.alloc(n);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  std::vector<PublishItem> items;
  items.reserve(n);
  for (uint32_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], test_hash((uint64_t{round} << 32) | i)});
  std::vector<uint32_t> tokens(size_t{n} * tpp);
  for (size_t t = 0; t < tokens.size(); ++t)
    tokens[t] = static_cast<uint32_t>(100000 + (t * 7919 + round) % 150000);  // 5-byte msgpack ints
  client::PublishChain chain;
  chain.token_ids = tokens;
  auto published = w.publish(items, {}, chain);
  ASSERT_TRUE(published.ok()) << published.error().message;
  ASSERT_TRUE(w.release(pages.value()).ok());
}

// The hashes one message carries, over all its events.
uint64_t hashes_in(const std::string& payload) {
  size_t offset = 0;
  const msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size(), offset);
  const msgpack::object& batch = oh.get();
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  if (batch.type != msgpack::type::ARRAY || batch.via.array.size < 2) return 0;
  uint64_t n = 0;
  const msgpack::object& events = batch.via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object& e = events.via.array.ptr[i];
    if (e.via.array.size >= 2 && e.via.array.ptr[1].type == msgpack::type::ARRAY) {
      n += e.via.array.ptr[1].via.array.size;
    }
  }
  return n;
}

// The token ids one message's BlockStored events carry.
uint64_t token_ids_in(const std::string& payload) {
  size_t offset = 0;
  const msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size(), offset);
  const msgpack::object& events = oh.get().via.array.ptr[1];
  uint64_t n = 0;
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object& e = events.via.array.ptr[i];
    const msgpack::object& tag = e.via.array.ptr[0];
    if (std::string(tag.via.str.ptr, tag.via.str.size) == "BlockStored") {
      n += e.via.array.ptr[3].via.array.size;
    }
  }
  return n;
}

uint64_t seq_of(const std::string& frame) {
  uint64_t v = 0;
  for (const char c : frame)
    v = (v << 8) | static_cast<uint8_t>(c);
  return v;
}

TEST(KvEventsLimits, ABigBatchIsSplitIntoMessagesOfAtMost4096HashesInOrder) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "splitter");
  ASSERT_NE(w, nullptr);
  publish_round(*w, 1, 10000);
  const uint64_t expected[] = {kHashesPerMessage, kHashesPerMessage, 10000 - 2 * kHashesPerMessage};
  // Message 0 was the start's AllBlocksCleared, sent before the subscription.
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const std::vector<std::string> frames = sub.receive();
    ASSERT_EQ(frames.size(), 3u) << "message " << seq;
    EXPECT_EQ(frames[0], "default");
    EXPECT_EQ(seq_of(frames[1]), seq);
    EXPECT_EQ(hashes_in(frames[2]), expected[seq - 1]) << "message " << seq;
  }
  EXPECT_FALSE(sub.readable(200));
  EXPECT_EQ(daemon_stats(*w).kv_batches_published, 4u);
}

// The issue's attack: a subscriber connects and never reads while workers publish big batches.
// Before the budget, libzmq queued every batch for it and the daemon grew by gigabytes. Each
// round publishes 65,536 blocks and evicts them: 16 messages stored and 16 removed.
// `tokens_per_page`: 0 when the pool's events carry no token ids, else what each block carries.
void never_reading_subscriber(const std::string& pool_config, uint32_t rounds,
                              uint32_t tokens_per_page,
                              const std::function<void(client::Connection&, uint32_t)>& publish) {
  // events.zmq_queue_bytes, a quarter of the default: the rounds that pass it twice are fewer
  // (the sanitizer trees check every page after each call).
  constexpr uint64_t kBudget = uint64_t{16} << 20;
  constexpr uint64_t kSlack = uint64_t{24} << 20;  // index, encoder buffers, allocator
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(pool_config + "  zmq_queue_bytes: 16MiB\n  zmq_endpoint: \"" + endpoint + "\"\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "publisher");
  ASSERT_NE(w, nullptr);
  auto stuck = std::make_unique<ZmqSocket>(ZMQ_SUB, endpoint, [](void* s) {
    const int one = 1;  // its own queue holds one message, so the daemon's fills
    zmq_setsockopt(s, ZMQ_RCVHWM, &one, sizeof one);
    const int small = 4096;
    zmq_setsockopt(s, ZMQ_RCVBUF, &small, sizeof small);
  });
  let_subscription_arrive();
  const uint64_t idle = rss_bytes(d.pid());
  uint64_t peak = idle;
  for (uint32_t round = 0; round < rounds; ++round) {
    publish(*w, round);
    if (::testing::Test::HasFatalFailure()) return;
    auto evicted = w->evict(kBatchBlocks);  // one BlockRemoved of 65,536 hashes
    ASSERT_TRUE(evicted.ok()) << evicted.error().message;
    ASSERT_EQ(evicted.value(), kBatchBlocks);
    peak = std::max(peak, rss_bytes(d.pid()));
  }
  const stats::DaemonStats s = daemon_stats(*w);
  // Every round went out as 32 messages, each sent or dropped, after the start's
  // AllBlocksCleared.
  EXPECT_EQ(s.kv_batches_published + s.kv_batches_dropped, uint64_t{rounds} * 32 + 1);
  EXPECT_GT(s.kv_batches_dropped, 0u) << "nothing was dropped: the subscriber read it all?";
  ::testing::Test::RecordProperty("dropped_messages", std::to_string(s.kv_batches_dropped));
  ::testing::Test::RecordProperty("peak_over_idle_mib", std::to_string((peak - idle) >> 20));
  EXPECT_NE(d.log().find("event=kv_events_dropped"), std::string::npos) << d.log();
  if (kRssMeansHeld) {
    EXPECT_LE(peak, idle + kBudget + kSlack)
        << "idle " << (idle >> 20) << " MiB, peak " << (peak >> 20) << " MiB";
  }
  // The subscriber leaves: libzmq frees its queue and the daemon gives the memory back.
  stuck.reset();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  if (kRssMeansHeld) {
    const uint64_t after = rss_bytes(d.pid());
    EXPECT_LE(after, idle + kSlack)
        << "idle " << (idle >> 20) << " MiB, after " << (after >> 20) << " MiB";
  }
  // With the budget free again, a reading subscriber gets what follows, token ids included.
  ZmqSocket reader(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  publish_round(*w, rounds, 10, tokens_per_page);
  const std::vector<std::string> frames = reader.receive();
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(seq_of(frames[1]), uint64_t{rounds} * 32 + 1);
  EXPECT_EQ(hashes_in(frames[2]), 10u);
  EXPECT_EQ(token_ids_in(frames[2]), uint64_t{10} * tokens_per_page);
}

// ~35 MiB of events (15 rounds of hashes only), over twice the budget.
TEST(KvEventsLimits, ASubscriberThatNeverReadsHoldsAtMostTheQueueBudget) {
  never_reading_subscriber(config(""), 15, 0, [](client::Connection& w, uint32_t round) {
    publish_round(w, round, kBatchBlocks);
  });
}

// The same with token ids in every BlockStored: 16 per block, ~5 bytes each, so a round's
// stores are ~5 MiB and 8 rounds are ~40 MiB. The per-message cap of 65,536 ids and the byte
// budget must hold with them as they do for hashes alone.
TEST(KvEventsLimits, ASubscriberThatNeverReadsHoldsAtMostTheQueueBudgetWithTokenIds) {
  constexpr uint32_t kTokensPerPage = 16;
  const std::string cfg = R"(backend: host
pools:
  - name: default
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}
    capacity: 65536 pages
events:
  zmq_token_ids: true
)";
  never_reading_subscriber(cfg, 8, kTokensPerPage, [](client::Connection& w, uint32_t round) {
    publish_round(w, round, kBatchBlocks, kTokensPerPage);
  });
}

// Descriptors a process holds now.
size_t open_files(pid_t pid) {
  std::error_code ec;
  size_t n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// A free TCP port on loopback (bound and released; the daemon binds it next).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The issue's attack: connections that never speak ZMTP, more than the daemon has descriptors.
// Before the cap, libzmq held each one for its 30 s handshake timeout and a worker's hello found
// no descriptor left.
TEST(KvEventsLimits, AConnectionFloodOnTheEventsEndpointLeavesWorkersServed) {
  constexpr int kFlood = 2100;
  constexpr size_t kInFlight = 256;  // accepted, not yet shut down by the cap
  // The issue's goal, 100 ms, for the median attempt; no attempt may take a second (the flood,
  // libzmq's I/O thread and the loop share the CI machine's two cores). Sanitizers: 10×.
  const std::chrono::milliseconds kMedianBound(kSanitizedBuild ? 1000 : 100);
  const std::chrono::milliseconds kEachBound(kSanitizedBuild ? 10000 : 1000);
  const int port = free_port();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port);
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n"));
  d.set_launcher("prlimit --nofile=2048:2048");  // the issue's daemon had 2,048 descriptors
  ASSERT_TRUE(d.start()) << d.log();

  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_max < kFlood + 64) {
    GTEST_SKIP() << "this machine allows " << files.rlim_max << " files, fewer than the flood";
  }
  Pipe flooded;
  Pipe done;
  const pid_t flooder = spawn_worker([&] {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives a test that failed half-way
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    auto open_one = [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      if (fd >= 0) (void)::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      return fd;
    };
    std::vector<pollfd> fds;
    for (int i = 0; i < kFlood; ++i) {
      const int fd = open_one();
      if (fd < 0) break;  // the parent sees fewer than kFlood (the exit code says)
      fds.push_back({fd, POLLRDHUP, 0});
    }
    flooded.signal();
    // Never a byte of ZMTP; each connection the daemon closes is replaced half a second later
    // (a client retrying), so that about kFlood stay open until the test is done.
    using Clock = std::chrono::steady_clock;
    std::vector<Clock::time_point> closed_at(fds.size());
    for (;;) {
      pollfd stop{done.fd[0], POLLIN, 0};
      if (::poll(&stop, 1, 0) == 1) return fds.size() == static_cast<size_t>(kFlood) ? 0 : 2;
      (void)::poll(fds.data(), fds.size(), 10);
      const auto now = Clock::now();
      for (size_t i = 0; i < fds.size(); ++i) {
        pollfd& p = fds[i];
        if (p.fd < 0 && now - closed_at[i] >= std::chrono::milliseconds(500)) {
          p.fd = open_one();
          p.revents = 0;
        }
        if (p.fd < 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
        ::close(p.fd);
        p.fd = -1;  // poll skips it
        closed_at[i] = now;
      }
    }
  });
  // A failed check ends the test early: the flooder goes with it.
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0) ::kill(pid, SIGKILL), (void)wait_worker(pid);
    }
  } reaper{flooder};
  ASSERT_TRUE(flooded.wait());
  // Waves of the flood reach the listener as the kernel retries connections past its backlog;
  // a worker attaches and allocates promptly throughout, and the daemon's descriptors stay near
  // what it had idle plus the endpoint's 64 connections (accepted ones wait for the cap a moment).
  const size_t idle_files = open_files(d.pid());
  size_t most_files = idle_files;
  std::vector<std::chrono::milliseconds> took_each;
  for (int attempt = 0; attempt < 6; ++attempt) {
    most_files = std::max(most_files, open_files(d.pid()));
    const auto start = std::chrono::steady_clock::now();
    auto c = client::Connection::attach(d.socket(), "worker-" + std::to_string(attempt));
    ASSERT_TRUE(c.ok()) << c.error().message << "\n" << d.log();
    auto pages = c.value()->alloc(1);
    ASSERT_TRUE(pages.ok()) << pages.error().message;
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    EXPECT_LE(took, kEachBound) << "attempt " << attempt << ": attach and alloc took "
                                << took.count() << " ms";
    took_each.push_back(took);
    for (int i = 0; i < 30; ++i) {
      most_files = std::max(most_files, open_files(d.pid()));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::sort(took_each.begin(), took_each.end());
  EXPECT_LE(took_each[took_each.size() / 2], kMedianBound)
      << "median attach and alloc " << took_each[took_each.size() / 2].count() << " ms, most "
      << took_each.back().count() << " ms";
  EXPECT_NE(d.log().find("event=zmq_connection_refused"), std::string::npos) << d.log();
  EXPECT_LE(most_files, idle_files + 64 + kInFlight)
      << "idle " << idle_files << " descriptors, most " << most_files;
  // When the flood stops, its connections that got a place are dropped at the 2 s handshake
  // deadline at the latest; then a real subscriber connects and receives events.
  done.signal();
  reaper.pid = -1;
  EXPECT_EQ(wait_worker(flooder), 0) << "the flooder could not open its connections";
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "publisher");
  ASSERT_NE(w, nullptr);
  publish_round(*w, 1, 3);
  const std::vector<std::string> frames = sub.receive();
  ASSERT_EQ(frames.size(), 3u) << d.log();
  EXPECT_EQ(hashes_in(frames[2]), 3u);
  w.reset();
  EXPECT_EQ(d.stop(), 0) << d.log();  // a clean stop after the flood (no monitor left blocked)
}

}  // namespace
}  // namespace kvpool::testing

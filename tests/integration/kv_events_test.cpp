// KV events for routers through a real kvpoold: a ZeroMQ SUB socket in the test receives what
// the daemon publishes while a worker (a Connection in this process) allocates, publishes,
// releases, and an admin evicts and flushes. Every message is held to vLLM's format frame by
// frame: topic, sequence number (8 bytes big-endian, 0, 1, 2, ...), msgpack KVEventBatch. Also:
// integer hashes with a data-parallel rank, the map layout, vLLM's replay socket, the clears at
// start and at a clean stop, and a bind failure stopping the start-up with a message that names
// the key, the endpoint and libzmq's reason. The chains workers describe and the host tier's
// medium: kv_events_chain_test.cpp.
#include <zmq.h>

#include <gtest/gtest.h>
#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/kv_events_util.h"
#include "tests/integration/test_attach.h"
#include "tests/integration/zmq_test_socket.h"

namespace kvpool::testing {
namespace {

using client::Connection;

TEST(KvEvents, StoredRemovedAndClearedReachASubscriberInVllmFormat) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_topic: \"kv@\"\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();

  auto w = attach(d, "router-feed");
  ASSERT_NE(w, nullptr);
  // One publish of three blocks: one batch, one BlockStored with the three hashes in order.
  auto pages = w->alloc(3);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < 3; ++i)
    items.push_back({pages.value()[i], hash_of(i)});
  ASSERT_TRUE(w->publish(items).ok());
  {
    // Batch 0 was the start's AllBlocksCleared, sent before anyone subscribed.
    const msgpack::object_handle oh = next_batch(sub, "kv@default", 1);
    const auto& batch = array(oh.get(), 3);  // data_parallel_rank 0 by default, as vLLM sends
    EXPECT_EQ(batch.ptr[2].via.u64, 0u);
    EXPECT_EQ(batch.ptr[0].type, msgpack::type::FLOAT64);
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    EXPECT_NEAR(batch.ptr[0].via.f64, now, 30.0);
    const auto& events = array(batch.ptr[1], 1);
    const auto& stored = array(events.ptr[0], 8);
    EXPECT_EQ(str(stored.ptr[0]), "BlockStored");
    EXPECT_EQ(bins(stored.ptr[1]), (std::vector<std::string>{bin_of(hash_of(0)), bin_of(hash_of(1)),
                                                             bin_of(hash_of(2))}));
    EXPECT_EQ(stored.ptr[2].type, msgpack::type::NIL);
    array(stored.ptr[3], 0);
    EXPECT_EQ(stored.ptr[4].type, msgpack::type::POSITIVE_INTEGER);
    EXPECT_EQ(stored.ptr[4].via.u64, 16u);  // tokens_per_page
    EXPECT_EQ(stored.ptr[5].type, msgpack::type::NIL);
    EXPECT_EQ(str(stored.ptr[6]), "CPU");  // the host backend
    EXPECT_EQ(stored.ptr[7].type, msgpack::type::NIL);
  }
  // Releasing published pages caches them: the index does not change, nothing is sent.
  ASSERT_TRUE(w->release(pages.value()).ok());
  EXPECT_FALSE(sub.readable(200));

  // Evicting one cached page removes its block.
  auto evicted = w->evict(1);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  ASSERT_EQ(evicted.value(), 1u);
  std::string removed_hash;
  {
    const msgpack::object_handle oh = next_batch(sub, "kv@default", 2);
    const auto& events = array(array(oh.get(), 3).ptr[1], 1);
    const auto& removed = array(events.ptr[0], 3);
    EXPECT_EQ(str(removed.ptr[0]), "BlockRemoved");
    const std::vector<std::string> hashes = bins(removed.ptr[1]);
    ASSERT_EQ(hashes.size(), 1u);
    removed_hash = hashes[0];
    EXPECT_TRUE(removed_hash == bin_of(hash_of(0)) || removed_hash == bin_of(hash_of(1)) ||
                removed_hash == bin_of(hash_of(2)));
    EXPECT_EQ(str(removed.ptr[2]), "CPU");
  }
  // A flush that empties the index is one AllBlocksCleared, not a removal per block.
  auto flushed = w->flush();
  ASSERT_TRUE(flushed.ok()) << flushed.error().message;
  EXPECT_EQ(flushed.value(), 2u);
  {
    const msgpack::object_handle oh = next_batch(sub, "kv@default", 3);
    const auto& events = array(array(oh.get(), 3).ptr[1], 1);
    EXPECT_EQ(str(array(events.ptr[0], 1).ptr[0]), "AllBlocksCleared");
  }
  // The next publish continues the sequence.
  auto more = w->alloc(1);
  ASSERT_TRUE(more.ok());
  const PublishItem again{more.value()[0], hash_of(7)};
  ASSERT_TRUE(w->publish(std::span<const PublishItem>(&again, 1)).ok());
  {
    const msgpack::object_handle oh = next_batch(sub, "kv@default", 4);
    const auto& events = array(array(oh.get(), 3).ptr[1], 1);
    const auto& stored = array(events.ptr[0], 8);
    EXPECT_EQ(bins(stored.ptr[1]), std::vector<std::string>{bin_of(hash_of(7))});
  }
  // The stats snapshot counts the batches (kvpoolctl stats, Prometheus).
  auto snap = w->snapshot();
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  stats::Snapshot s;
  ASSERT_EQ(stats::decode(snap.value().bytes, snap.value().layout_version, s), "");
  EXPECT_EQ(s.daemon.kv_batches_published, 5u);
  EXPECT_EQ(s.daemon.kv_batches_dropped, 0u);
  w.reset();
  // A clean stop tells routers to drop the pool: one last AllBlocksCleared.
  EXPECT_EQ(d.stop(), 0);
  {
    const msgpack::object_handle oh = next_batch(sub, "kv@default", 5);
    const auto& events = array(array(oh.get(), 3).ptr[1], 1);
    EXPECT_EQ(str(array(events.ptr[0], 1).ptr[0]), "AllBlocksCleared");
  }
  EXPECT_NE(d.log().find("event=kv_events_stopped"), std::string::npos) << d.log();
}

TEST(KvEvents, IntegerHashesAndTheDataParallelRank) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint +
                  "\"\n  zmq_block_hash: uint64\n  data_parallel_rank: 2\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "router-feed");
  ASSERT_NE(w, nullptr);
  auto pages = w->alloc(2);
  ASSERT_TRUE(pages.ok());
  const std::vector<PublishItem> items = {{pages.value()[0], hash_of(0)},
                                          {pages.value()[1], hash_of(1)}};
  ASSERT_TRUE(w->publish(items).ok());
  const msgpack::object_handle oh = next_batch(sub, "default", 1);  // topic: the pool's name
  const auto& batch = array(oh.get(), 3);
  EXPECT_EQ(batch.ptr[2].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(batch.ptr[2].via.u64, 2u);
  const auto& stored = array(array(batch.ptr[1], 1).ptr[0], 8);
  EXPECT_EQ(str(stored.ptr[0]), "BlockStored");
  const auto& hashes = array(stored.ptr[1], 2);
  EXPECT_EQ(hashes.ptr[0].type, msgpack::type::POSITIVE_INTEGER);
  EXPECT_EQ(hashes.ptr[0].via.u64, hash_of(0).lo);
  EXPECT_EQ(hashes.ptr[1].via.u64, hash_of(1).lo);
}

TEST(KvEvents, TheMapLayoutOfVllmMain) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_payload: map\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "router-feed");
  ASSERT_NE(w, nullptr);
  auto page = w->alloc(1);
  ASSERT_TRUE(page.ok());
  const PublishItem item{page.value()[0], hash_of(3)};
  ASSERT_TRUE(w->publish(std::span<const PublishItem>(&item, 1)).ok());
  const msgpack::object_handle oh = next_batch(sub, "default", 1);
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::MAP);
  ASSERT_EQ(batch.via.map.size, 3u);
  EXPECT_EQ(str(batch.via.map.ptr[0].key), "ts");
  EXPECT_EQ(str(batch.via.map.ptr[1].key), "events");
  EXPECT_EQ(str(batch.via.map.ptr[2].key), "data_parallel_rank");
  const auto& events = array(batch.via.map.ptr[1].val, 1);
  const msgpack::object& stored = events.ptr[0];
  ASSERT_EQ(stored.type, msgpack::type::MAP);
  ASSERT_EQ(stored.via.map.size, 8u);
  EXPECT_EQ(str(stored.via.map.ptr[0].key), "type");
  EXPECT_EQ(str(stored.via.map.ptr[0].val), "BlockStored");
  EXPECT_EQ(str(stored.via.map.ptr[1].key), "block_hashes");
  EXPECT_EQ(bins(stored.via.map.ptr[1].val), std::vector<std::string>{bin_of(hash_of(3))});
  EXPECT_EQ(str(stored.via.map.ptr[6].key), "medium");
  EXPECT_EQ(str(stored.via.map.ptr[6].val), "CPU");
}

TEST(KvEvents, ReplayAnswersFromASequenceNumberThenTheEndMarker) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  const std::string replay_endpoint = "ipc://" + dir.file("kv-replay");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_replay_endpoint: \"" +
                  replay_endpoint + "\"\n"));
  ASSERT_TRUE(d.start()) << d.log();
  // No subscriber: batches are still numbered and kept for replay.
  auto w = attach(d, "router-feed");
  ASSERT_NE(w, nullptr);
  for (uint32_t i = 0; i < 3; ++i) {
    auto page = w->alloc(1);
    ASSERT_TRUE(page.ok());
    const PublishItem item{page.value()[0], hash_of(i)};
    ASSERT_TRUE(w->publish(std::span<const PublishItem>(&item, 1)).ok());
  }
  // vLLM's request, as a DEALER sends it: (empty delimiter, start seq); the ROUTER adds the
  // identity. Replies: (empty, seq, payload) for seq ≥ 0, then (empty, -1, ""). Batch 0 is
  // the start's AllBlocksCleared, which a router that joins late gets this way.
  ZmqSocket replay(ZMQ_DEALER, replay_endpoint);
  const std::string start = seq_frame(0);
  ASSERT_EQ(zmq_send(replay.get(), "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(replay.get(), start.data(), start.size(), 0), 8);
  for (int64_t seq = 0; seq <= 3; ++seq) {
    const std::vector<std::string> frames = replay.receive();
    ASSERT_EQ(frames.size(), 3u) << "replayed batch " << seq;
    EXPECT_EQ(frames[0], "");
    EXPECT_EQ(frames[1], seq_frame(seq));
    const msgpack::object_handle oh = decode(frames[2]);
    const auto& event = array(array(oh.get(), 3).ptr[1], 1).ptr[0];
    if (seq == 0) {
      EXPECT_EQ(str(array(event, 1).ptr[0]), "AllBlocksCleared");
      continue;
    }
    EXPECT_EQ(bins(array(event, 8).ptr[1]),
              std::vector<std::string>{bin_of(hash_of(static_cast<uint32_t>(seq - 1)))});
  }
  const std::vector<std::string> end = replay.receive();
  ASSERT_EQ(end.size(), 3u);
  EXPECT_EQ(end[0], "");
  EXPECT_EQ(end[1], seq_frame(-1));
  EXPECT_EQ(end[2], "");

  // kvpool's extension: a fourth request frame "topic" adds each batch's topic (the pool's), so
  // a router can place the batches of a node with several pools; the end marker has one too.
  const std::string from = seq_frame(2);
  ASSERT_EQ(zmq_send(replay.get(), "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(replay.get(), from.data(), from.size(), ZMQ_SNDMORE), 8);
  ASSERT_EQ(zmq_send(replay.get(), "topic", 5, 0), 5);
  for (int64_t seq = 2; seq <= 3; ++seq) {
    const std::vector<std::string> frames = replay.receive();
    ASSERT_EQ(frames.size(), 4u) << "replayed batch " << seq;
    EXPECT_EQ(frames[1], seq_frame(seq));
    EXPECT_EQ(frames[3], "default");
  }
  const std::vector<std::string> end_with_topic = replay.receive();
  ASSERT_EQ(end_with_topic.size(), 4u);
  EXPECT_EQ(end_with_topic[1], seq_frame(-1));
  EXPECT_EQ(end_with_topic[3], "");
  // Any other fourth frame is not a request: nothing comes back.
  ASSERT_EQ(zmq_send(replay.get(), "", 0, ZMQ_SNDMORE), 0);
  ASSERT_EQ(zmq_send(replay.get(), from.data(), from.size(), ZMQ_SNDMORE), 8);
  ASSERT_EQ(zmq_send(replay.get(), "topics", 6, 0), 6);
  EXPECT_FALSE(replay.readable(300));
}

// A second kvpoold started on the same socket and config (by hand beside systemd's) stops at the
// socket, before it binds the events endpoint: libzmq would replace the first daemon's ipc path
// and its subscribers would hear nothing more.
TEST(KvEvents, ASecondDaemonOnTheSameSocketLeavesTheFirstsEndpoint) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  std::string out;
  const int rc = run_command(
      kvpoold_binary() + " --socket " + d.socket() + " --config " + d.config_path(), out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("another kvpoold is listening there"), std::string::npos) << out;
  EXPECT_EQ(out.find("kv_events_publishing"), std::string::npos) << out;
  auto w = attach(d, "after-the-second");
  ASSERT_NE(w, nullptr);
  auto pages = w->alloc(1);
  ASSERT_TRUE(pages.ok());
  const std::vector<PublishItem> items = {{pages.value()[0], hash_of(0)}};
  ASSERT_TRUE(w->publish(items).ok());
  ASSERT_TRUE(sub.readable(5000)) << "the first daemon's subscribers hear nothing";
  const msgpack::object_handle oh = next_batch(sub, "default", 1);
  EXPECT_EQ(str(array(array(array(oh.get(), 3).ptr[1], 1).ptr[0], 8).ptr[0]), "BlockStored");
}

TEST(KvEvents, AnEndpointThatCannotBeBoundStopsTheStartUp) {
  Daemon d(config("  zmq_endpoint: \"ipc:///nonexistent-kvpool-dir/kv-events\"\n"));
  EXPECT_FALSE(d.start());
  const std::string log = d.log();
  EXPECT_NE(log.find("events.zmq_endpoint \"ipc:///nonexistent-kvpool-dir/kv-events\": cannot "
                     "bind: No such file or directory"),
            std::string::npos)
      << log;
}

TEST(KvEvents, AnInvalidEndpointIsAConfigError) {
  Daemon d(config("  zmq_endpoint: \"udp://127.0.0.1:5557\"\n"));
  EXPECT_FALSE(d.start());
  EXPECT_NE(d.log().find("events.zmq_endpoint: \"udp://127.0.0.1:5557\" is not a ZeroMQ endpoint"),
            std::string::npos)
      << d.log();
}

}  // namespace
}  // namespace kvpool::testing

// KV events a router can route on, through a real kvpoold: the token ids and parents a worker
// publishes with its blocks reach the ZeroMQ subscriber (a sequence's first block with a nil
// parent, a later publish naming its parent); the host tier's moves are BlockRemoved of the
// pool's medium and BlockStored "CPU" with the same chain, and back; a publish whose token ids
// do not match its blocks is refused naming the field and changes nothing; the endpoint
// connects to a router that binds (zmq_mode: connect), which hears the clean stop's clear; the
// C API's kvpool_publish_chain sends the same chain.
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "common/block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/kv_events_util.h"
#include "tests/integration/raw_frames.h"
#include "tests/integration/test_attach.h"
#include "tests/integration/zmq_test_socket.h"

namespace kvpool::testing {
namespace {

constexpr uint32_t kTokensPerPage = 16;

// A prompt's tokens and its chain, hashed as workers hash (docs/BLOCK_HASH.md).
struct Prompt {
  std::vector<uint32_t> tokens;
  std::vector<BlockHash> chain;
  explicit Prompt(uint32_t blocks, uint32_t first_token = 1000) {
    tokens.resize(size_t{blocks} * kTokensPerPage);
    std::iota(tokens.begin(), tokens.end(), first_token);
    BlockHasher hasher;
    Geometry g;
    g.layers = 2;
    g.kv_heads = 2;
    g.head_dim = 64;
    g.tokens_per_page = kTokensPerPage;
    const BlockHash root = hasher.root(ModelIdentity{"events-test", g, "", ""});
    chain.resize(blocks);
    hasher.chain(root, tokens, kTokensPerPage, chain);
  }
  std::span<const uint32_t> tokens_of(size_t first, size_t n) const {
    return std::span(tokens).subspan(first * kTokensPerPage, n * kTokensPerPage);
  }
};

std::vector<uint64_t> uints(const msgpack::object& o) {
  std::vector<uint64_t> v;
  EXPECT_EQ(o.type, msgpack::type::ARRAY);
  for (uint32_t i = 0; o.type == msgpack::type::ARRAY && i < o.via.array.size; ++i)
    v.push_back(o.via.array.ptr[i].via.u64);
  return v;
}

std::vector<uint64_t> widened(std::span<const uint32_t> t) {
  return {t.begin(), t.end()};
}

// Publishes blocks [first, first + n) of `p` on pages the worker allocates, with their chain.
std::vector<PageId> publish_blocks(client::Connection& w, const Prompt& p, size_t first, size_t n,
                                   std::string_view lora = "") {
  auto pages = w.alloc(static_cast<uint32_t>(n));
  EXPECT_TRUE(pages.ok()) << pages.error().message;
  if (!pages.ok()) return {};
  std::vector<PublishItem> items;
  for (size_t i = 0; i < n; ++i)
    items.push_back({pages.value()[i], p.chain[first + i]});
  client::PublishChain chain;
  if (first > 0) chain.parent = p.chain[first - 1];
  chain.token_ids = p.tokens_of(first, n);
  chain.lora_name = lora;
  auto r = w.publish(items, {}, chain);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return pages.value();
}

// One block of an event, as a router unpacks it: the block's parent is the event's for its first
// block and the block before it for the rest; its tokens are its block_size slice.
struct BlockEvent {
  std::string type;
  std::string medium;
  uint64_t hash = 0;
  std::optional<uint64_t> parent;
  std::vector<uint64_t> tokens;
};

std::vector<BlockEvent> blocks_of(const msgpack::object_array& events) {
  std::vector<BlockEvent> out;
  for (uint32_t e = 0; e < events.size; ++e) {
    const auto& ev = events.ptr[e].via.array;
    const std::string type = str(ev.ptr[0]);
    if (type == "AllBlocksCleared") continue;
    const bool stored = type == "BlockStored";
    const std::vector<uint64_t> hashes = uints(ev.ptr[1]);
    const std::vector<uint64_t> tokens = stored ? uints(ev.ptr[3]) : std::vector<uint64_t>{};
    for (size_t i = 0; i < hashes.size(); ++i) {
      BlockEvent b{type, str(ev.ptr[stored ? 6 : 2]), hashes[i], {}, {}};
      if (stored && i > 0) b.parent = hashes[i - 1];
      if (stored && i == 0 && ev.ptr[2].type != msgpack::type::NIL) b.parent = ev.ptr[2].via.u64;
      if (!tokens.empty()) {
        b.tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i * kTokensPerPage),
                        tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * kTokensPerPage));
      }
      out.push_back(b);
    }
  }
  return out;
}

// A block's move between media: every block of `p` is first removed from `from`, then stored
// in `to` with the parent and tokens it was published with.
void expect_moved(const std::vector<BlockEvent>& got, const Prompt& p, const std::string& from,
                  const std::string& to) {
  ASSERT_EQ(got.size(), 2 * p.chain.size());
  const size_t n = p.chain.size();
  std::vector<bool> removed(n, false);
  std::vector<bool> stored(n, false);
  for (size_t k = 0; k < got.size(); ++k) {
    const BlockEvent& b = got[k];
    size_t i = 0;
    while (i < n && p.chain[i].lo != b.hash)
      ++i;
    ASSERT_LT(i, n) << "an event for a block that did not move";
    if (k < n) {  // the removals come first
      EXPECT_EQ(b.type, "BlockRemoved");
      EXPECT_EQ(b.medium, from);
      removed[i] = true;
      continue;
    }
    EXPECT_EQ(b.type, "BlockStored");
    EXPECT_EQ(b.medium, to);
    EXPECT_EQ(b.tokens, widened(p.tokens_of(i, 1))) << "block " << i;
    if (i == 0) {
      EXPECT_FALSE(b.parent.has_value());
    } else if (b.parent) {  // a block stored after its parent names it
      EXPECT_EQ(*b.parent, p.chain[i - 1].lo);
    }
    stored[i] = true;
  }
  EXPECT_EQ(removed, std::vector<bool>(n, true));
  EXPECT_EQ(stored, std::vector<bool>(n, true));
}

// The events of the next batch (vLLM's array form with its rank).
struct Batch {
  msgpack::object_handle handle;
  const msgpack::object_array* events = nullptr;
};
Batch next_events(ZmqSocket& sub, const std::string& topic, int64_t seq, uint32_t count) {
  Batch b;
  b.handle = next_batch(sub, topic, seq);
  if (b.handle.get().type != msgpack::type::ARRAY) {
    ADD_FAILURE() << "batch " << seq << " did not come";
    return b;
  }
  b.events = &array(array(b.handle.get(), 3).ptr[1], count);
  return b;
}

TEST(KvEventsChain, TokenIdsAndParentsAWorkerPublishesReachTheRouter) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_block_hash: uint64\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "chain-feed");
  ASSERT_NE(w, nullptr);
  const Prompt p(3);

  // Blocks 0 and 1 in one publish: one BlockStored, parent nil, their 32 token ids in order.
  publish_blocks(*w, p, 0, 2, "sql-adapter");
  {
    const Batch b = next_events(sub, "default", 1, 1);
    ASSERT_NE(b.events, nullptr);
    const auto& stored = array(b.events->ptr[0], 8);
    EXPECT_EQ(str(stored.ptr[0]), "BlockStored");
    EXPECT_EQ(uints(stored.ptr[1]), (std::vector<uint64_t>{p.chain[0].lo, p.chain[1].lo}));
    EXPECT_EQ(stored.ptr[2].type, msgpack::type::NIL);  // the sequence's first block
    EXPECT_EQ(uints(stored.ptr[3]), widened(p.tokens_of(0, 2)));
    EXPECT_EQ(stored.ptr[4].via.u64, kTokensPerPage);
    EXPECT_EQ(str(stored.ptr[7]), "sql-adapter");  // lora_name
  }
  // Block 2 later: its parent is block 1.
  publish_blocks(*w, p, 2, 1);
  {
    const Batch b = next_events(sub, "default", 2, 1);
    ASSERT_NE(b.events, nullptr);
    const auto& stored = array(b.events->ptr[0], 8);
    EXPECT_EQ(uints(stored.ptr[1]), std::vector<uint64_t>{p.chain[2].lo});
    EXPECT_EQ(stored.ptr[2].via.u64, p.chain[1].lo);
    EXPECT_EQ(uints(stored.ptr[3]), widened(p.tokens_of(2, 1)));
    EXPECT_EQ(stored.ptr[7].type, msgpack::type::NIL);  // no adapter named
  }

  // Token ids that do not fill the blocks, sent as a client that skips its own check would:
  // refused naming the field, nothing published, no event.
  const int fd = connect_raw(d.socket());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, frame(wire::HelloRequest{"raw", "", 0}, 1)));
  ASSERT_FALSE(read_raw_reply(fd, 5000).error.has_value());
  const Prompt other(1, 50000);
  wire::PublishRequest bad;
  bad.items = {{0, other.chain[0]}};
  bad.token_ids.assign(other.tokens.begin(), other.tokens.begin() + 15);
  ASSERT_TRUE(send_all(fd, frame(bad, 2)));
  const RawReply r = read_raw_reply(fd, 5000);
  ASSERT_TRUE(r.error.has_value());
  EXPECT_EQ(r.error->status.code(), Errc::invalid_argument);
  EXPECT_NE(r.error->message.find("chain.token_ids holds 15 ids for 1 blocks of 16 tokens"),
            std::string::npos)
      << r.error->message;
  ::close(fd);
  auto hit = w->lookup(other.chain);
  ASSERT_TRUE(hit.ok());
  EXPECT_TRUE(hit.value().empty());
  EXPECT_FALSE(sub.readable(300));
  // The client refuses the same before sending anything.
  auto page = w->alloc(1);
  ASSERT_TRUE(page.ok());
  const PublishItem item{page.value()[0], other.chain[0]};
  client::PublishChain short_chain;
  short_chain.token_ids = other.tokens_of(0, 1).first(15);
  auto refused = w->publish(std::span(&item, 1), {}, short_chain);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("15 token ids for 1 blocks"), std::string::npos)
      << refused.error().message;
}

// A C worker (FFI from Rust, Go, ctypes) describes its blocks as the C++ one does.
TEST(KvEventsChain, TheCApiPublishesAChainWithTokenIdsParentAndAdapter) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_block_hash: uint64\n"));
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  kvpool_conn* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c-chain", nullptr, &c, err, sizeof err), KVPOOL_OK)
      << err;
  const Prompt p(3);
  kvpool_page_id pages[3];
  ASSERT_EQ(kvpool_alloc(c, 3, pages), KVPOOL_OK) << kvpool_last_error(c);
  kvpool_publish_item items[3];
  for (size_t i = 0; i < 3; ++i)
    items[i] = {pages[i], {p.chain[i].lo, p.chain[i].hi}};
  kvpool_publish_result out[3];

  // Blocks 1 and 2, their parent block 0 (published by someone else), an adapter.
  const kvpool_hash parent{p.chain[0].lo, p.chain[0].hi};
  const std::span<const uint32_t> tokens = p.tokens_of(1, 2);
  const kvpool_block_chain chain{&parent, tokens.data(), tokens.size(), "sql-adapter"};
  ASSERT_EQ(kvpool_publish_chain(c, items + 1, 2, &chain, out), KVPOOL_OK) << kvpool_last_error(c);
  EXPECT_EQ(out[0].duplicate, 0);
  {
    const Batch b = next_events(sub, "default", 1, 1);
    ASSERT_NE(b.events, nullptr);
    const auto& stored = array(b.events->ptr[0], 8);
    EXPECT_EQ(uints(stored.ptr[1]), (std::vector<uint64_t>{p.chain[1].lo, p.chain[2].lo}));
    EXPECT_EQ(stored.ptr[2].via.u64, p.chain[0].lo);
    EXPECT_EQ(uints(stored.ptr[3]), widened(tokens));
    EXPECT_EQ(str(stored.ptr[7]), "sql-adapter");
  }
  // Token ids that do not fill the block, or a NULL array with a count: refused, naming the
  // cause, nothing published.
  const kvpool_block_chain short_chain{nullptr, p.tokens_of(0, 1).data(), 15, nullptr};
  EXPECT_EQ(kvpool_publish_chain(c, items, 1, &short_chain, out),
            static_cast<int>(Errc::invalid_argument));
  EXPECT_NE(std::string(kvpool_last_error(c)).find("15 token ids for 1 blocks"), std::string::npos)
      << kvpool_last_error(c);
  const kvpool_block_chain null_tokens{nullptr, nullptr, 16, nullptr};
  EXPECT_EQ(kvpool_publish_chain(c, items, 1, &null_tokens, out),
            static_cast<int>(Errc::invalid_argument));
  EXPECT_NE(std::string(kvpool_last_error(c)).find("token_ids is NULL but n_token_ids is 16"),
            std::string::npos)
      << kvpool_last_error(c);
  EXPECT_FALSE(sub.readable(300));
  // A NULL chain is a plain publish: the block's event has no parent and no tokens.
  ASSERT_EQ(kvpool_publish_chain(c, items, 1, nullptr, out), KVPOOL_OK) << kvpool_last_error(c);
  {
    const Batch b = next_events(sub, "default", 2, 1);
    ASSERT_NE(b.events, nullptr);
    const auto& stored = array(b.events->ptr[0], 8);
    EXPECT_EQ(uints(stored.ptr[1]), std::vector<uint64_t>{p.chain[0].lo});
    EXPECT_EQ(stored.ptr[2].type, msgpack::type::NIL);
    EXPECT_TRUE(uints(stored.ptr[3]).empty());
  }
  kvpool_detach(c);
}

TEST(KvEventsChain, DemotionAndPromotionMoveABlockBetweenMediaWithItsChain) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  // fake-device stands for device memory: the pool's medium is "GPU", its host tier's "CPU".
  Daemon d(R"(backend: fake-device
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 8 pages
    host_tier: 16 pages
events:
  zmq_block_hash: uint64
  zmq_endpoint: ")" +
           endpoint + "\"\n");
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "tier-feed");
  ASSERT_NE(w, nullptr);
  const Prompt p(2);
  const std::vector<PageId> pages = publish_blocks(*w, p, 0, 2);
  {
    const Batch b = next_events(sub, "default", 1, 1);
    ASSERT_NE(b.events, nullptr);
    EXPECT_EQ(str(array(b.events->ptr[0], 8).ptr[6]), "GPU");
  }
  ASSERT_TRUE(w->release(pages).ok());
  // The operator's evict sends both blocks down: removed from the GPU, stored on the CPU with
  // the tokens and parent they were published with.
  auto evicted = w->evict(2);
  ASSERT_TRUE(evicted.ok()) << evicted.error().message;
  ASSERT_EQ(evicted.value(), 2u);
  {
    const msgpack::object_handle oh = next_batch(sub, "default", 2);
    expect_moved(blocks_of(array(oh.get(), 3).ptr[1].via.array), p, "GPU", "CPU");
  }
  // A lookup promotes them: removed from the CPU, stored on the GPU, the chain kept.
  auto hit = w->lookup_with_tiers(p.chain);
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_EQ(hit.value().pages.size(), 2u);
  EXPECT_EQ(hit.value().tiers[0], wire::kTierHost);
  {
    const msgpack::object_handle oh = next_batch(sub, "default", 3);
    expect_moved(blocks_of(array(oh.get(), 3).ptr[1].via.array), p, "CPU", "GPU");
  }
  // A flush that empties both tiers is one AllBlocksCleared.
  ASSERT_TRUE(w->release(hit.value().pages).ok());
  ASSERT_TRUE(w->evict(1).ok());  // one block down again, so that both tiers hold one
  (void)next_events(sub, "default", 4, 2);
  ASSERT_TRUE(w->flush().ok());
  {
    const Batch b = next_events(sub, "default", 5, 1);
    ASSERT_NE(b.events, nullptr);
    EXPECT_EQ(str(array(b.events->ptr[0], 1).ptr[0]), "AllBlocksCleared");
  }
}

// The block events of the batches that arrive within `ms`, by topic (pool).
std::map<std::string, std::vector<BlockEvent>> blocks_within(ZmqSocket& sub, int ms) {
  std::map<std::string, std::vector<BlockEvent>> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < deadline && sub.readable(50)) {
    const std::vector<std::string> frames = sub.receive();
    if (frames.size() != 3) continue;
    const msgpack::object_handle oh = decode(frames[2]);
    for (BlockEvent& b : blocks_of(array(oh.get(), 3).ptr[1].via.array))
      out[frames[0]].push_back(std::move(b));
  }
  return out;
}

// A block stored in `medium` of the pool, for every block of `p`, with the tokens and parent
// it was published with.
void expect_stored_with_chain(const std::vector<BlockEvent>& got, const Prompt& p) {
  for (size_t i = 0; i < p.chain.size(); ++i) {
    const auto it = std::find_if(got.begin(), got.end(), [&](const BlockEvent& b) {
      return b.type == "BlockStored" && b.hash == p.chain[i].lo;
    });
    ASSERT_NE(it, got.end()) << "block " << i << " was not stored";
    EXPECT_EQ(it->tokens, widened(p.tokens_of(i, 1))) << "block " << i;
    if (i == 0) {
      EXPECT_FALSE(it->parent.has_value());
    } else {
      ASSERT_TRUE(it->parent.has_value()) << "block " << i;
      EXPECT_EQ(*it->parent, p.chain[i - 1].lo) << "block " << i;
    }
  }
}

// Precision before eviction: the 16-bit pool's evictions are stored in the 8-bit pool, and a
// lookup converts them back; both BlockStored events carry the chain the worker published.
TEST(KvEventsChain, AConversionToEightBitsAndBackKeepsTheChain) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("kv-events");
  const std::string geometry =
      "    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: ";
  Daemon d("backend: host\npools:\n  - name: recent\n" + geometry +
           "bf16}\n    capacity: 2 pages\n    convert_evictions_to: older\n"
           "  - name: older\n" +
           geometry +
           "fp8_e4m3}\n    capacity: 8 pages\nevents:\n  zmq_block_hash: uint64\n"
           "  zmq_endpoint: \"" +
           endpoint + "\"\n");
  ASSERT_TRUE(d.start()) << d.log();
  ZmqSocket sub(ZMQ_SUB, endpoint);
  let_subscription_arrive();
  auto w = attach(d, "convert-feed", "recent");
  ASSERT_NE(w, nullptr);
  const Prompt p(2);
  ASSERT_TRUE(w->release(publish_blocks(*w, p, 0, 2)).ok());
  // Two new pages evict both blocks: converted into the 8-bit pool.
  auto all = w->alloc(2);
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_TRUE(w->release(all.value()).ok());
  auto down = blocks_within(sub, 1500);
  expect_stored_with_chain(down["older"], p);
  // The lookup converts them back into 16-bit pages.
  auto hit = w->lookup_with_tiers(p.chain);
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_EQ(hit.value().pages.size(), 2u) << d.log();
  EXPECT_EQ(hit.value().tiers[0], wire::kTierConverted);
  auto back = blocks_within(sub, 1500);
  std::vector<BlockEvent> stored_back;
  for (const BlockEvent& b : back["recent"]) {
    if (b.type == "BlockStored") stored_back.push_back(b);
  }
  expect_stored_with_chain(stored_back, p);
  ASSERT_TRUE(w->release(hit.value().pages).ok());
}

TEST(KvEventsChain, ConnectModeReachesARouterThatBindsAndHearsTheStop) {
  TempDir dir;
  const std::string endpoint = "ipc://" + dir.file("router");
  // The router binds (llm-d's central indexer does) and the daemon connects to it.
  ZmqSocket sub(ZMQ_SUB, endpoint, nullptr, ZmqSocket::Mode::bind);
  Daemon d(config("  zmq_endpoint: \"" + endpoint + "\"\n  zmq_mode: connect\n"));
  ASSERT_TRUE(d.start()) << d.log();
  EXPECT_NE(d.log().find("mode=connect"), std::string::npos) << d.log();
  let_subscription_arrive();
  std::string last_seq;
  {
    auto w = attach(d, "connect-feed");
    ASSERT_NE(w, nullptr);
    // libzmq's connecting PUB takes the router's subscription in only after its first send
    // following the connection (kv_event_publisher.h): publish until a batch arrives, as a
    // router joining a busy daemon would see it.
    std::vector<std::string> frames;
    for (uint32_t attempt = 0; attempt < 50 && frames.empty(); ++attempt) {
      publish_blocks(*w, Prompt(1, 7000 + 100 * attempt), 0, 1);
      if (sub.readable(200)) frames = sub.receive();
    }
    ASSERT_EQ(frames.size(), 3u);
    const auto oh = decode(frames[2]);
    const auto& stored = array(array(array(oh.get(), 3).ptr[1], 1).ptr[0], 8);
    EXPECT_EQ(str(stored.ptr[0]), "BlockStored");
    EXPECT_EQ(array(stored.ptr[3], kTokensPerPage).size, kTokensPerPage);
    last_seq = frames[1];
  }
  EXPECT_EQ(d.stop(), 0);
  const std::vector<std::string> last = sub.receive();
  ASSERT_EQ(last.size(), 3u);
  uint64_t seq = 0;
  for (const char c : last_seq)
    seq = (seq << 8) | static_cast<uint8_t>(c);
  EXPECT_EQ(last[1], seq_frame(static_cast<int64_t>(seq) + 1));  // the stop's batch is the next
  const auto oh = decode(last[2]);
  EXPECT_EQ(str(array(array(array(oh.get(), 3).ptr[1], 1).ptr[0], 1).ptr[0]), "AllBlocksCleared");
}

}  // namespace
}  // namespace kvpool::testing

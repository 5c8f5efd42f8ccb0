// ClusterClient: batches of GET and SET against a Redis Cluster (Redis 7, Valkey, managed
// services) over hiredis 0.14, which has no cluster support of its own. The client keeps the
// slot map itself:
//
//   - The map (slot → master) comes from CLUSTER SLOTS, asked of the first node that answers:
//     the nodes known from earlier maps, then the configured seeds. It is asked again, at most
//     every kRefreshIntervalMs, once it may be stale: a MOVED reply, a node that failed.
//   - A batch groups its keys by master, appends every command to each master's connection,
//     flushes all of them, then reads the replies: the masters work on their parts at once, one
//     round trip in all (pipelining per node; DESIGN's "no per-page round trips").
//   - MOVED slot host:port: the slot is pointed at that node at once and the key retried; ASK
//     host:port: the key alone is retried there, after ASKING, the map unchanged. A key is tried
//     at most kMaxAttempts times; then it counts as failed.
//   - Each attempt of a batch has one deadline, timeout_ms, for its writes and every node's
//     replies (poll() with what is left before each write and read; a node that trickles bytes
//     cannot stretch it). A node that fails (refused, reset, past the deadline) is dropped: its
//     keys of the batch fail or retry on a fresh map (a replica promoted by failover), and no
//     connection to it is tried again for retry_after_ms, so a dead master costs one timeout, not
//     one per batch. A batch thus ends within kMaxAttempts deadlines (and connects).
//
// A failed key is never an error to the caller's caller: the remote tier is a cache, so it is a
// miss (get) or a block not written (set), counted in the view.
//
// Thread-safety: one thread calls get(), set() and refresh() (the remote tier's worker); view()
// may be called from any thread. Error policy: no exceptions; failures are counted and the last
// one is kept as text in the view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/node_address.h"

struct redisContext;
struct redisReply;

namespace kvpool::daemon::remote {

struct ClusterOptions {
  std::vector<NodeAddress> seeds;
  uint32_t timeout_ms = 100;       // a connect, and each node's replies to a batch
  uint32_t retry_after_ms = 1000;  // a failed node is left alone this long
};

// What the client has seen, for kvpoolctl status and the metrics.
struct ClusterView {
  uint32_t nodes = 0;          // masters in the slot map
  uint32_t reachable = 0;      // of them, not failed within retry_after_ms
  uint32_t slots_covered = 0;  // slots the map assigns a master (16384 when healthy)
  uint64_t refreshes = 0;      // CLUSTER SLOTS answered
  uint64_t moved = 0;          // MOVED replies
  uint64_t asked = 0;          // ASK replies
  uint64_t node_failures = 0;  // connections that failed or timed out
  uint64_t key_failures = 0;   // keys that failed after every attempt
  uint64_t error_replies = 0;  // error replies other than redirections (OOM, CLUSTERDOWN, ...)
  std::string last_error;      // the newest failure's text
};

class ClusterClient {
 public:
  static constexpr int kMaxAttempts = 3;
  static constexpr uint32_t kRefreshIntervalMs = 100;

  explicit ClusterClient(ClusterOptions options);
  ~ClusterClient();
  ClusterClient(const ClusterClient&) = delete;
  ClusterClient& operator=(const ClusterClient&) = delete;

  // What a batch did: keys answered (found or not), keys that failed, and whether no node could
  // be reached at all (the cluster is down, or unreachable from here).
  struct BatchResult {
    uint32_t answered = 0;
    uint32_t failed = 0;
    bool unreachable = false;
  };

  // GET of every key. found(i, bytes) is called, on this thread, for each key that holds a
  // string; a key that is absent is answered and not reported to found, but absent[i] (when
  // given) is set.
  using Found = std::function<void(size_t index, std::span<const std::byte> bytes)>;
  BatchResult get(std::span<const std::string> keys, const Found& found,
                  std::vector<uint8_t>* absent = nullptr);
  // SET keys[i] = values[i], with an expiry of ttl_s seconds (0: none). A key answered OK is
  // written; one refused (OOM under maxmemory with noeviction, say) is failed.
  // written[i] (when given) says whether keys[i] was.
  BatchResult set(std::span<const std::string> keys,
                  std::span<const std::span<const std::byte>> values, uint32_t ttl_s,
                  std::vector<uint8_t>* written = nullptr);

  // Asks for the slot map now; false when no node answered.
  bool refresh();
  ClusterView view() const;

 private:
  struct Node {
    NodeAddress addr;
    redisContext* ctx = nullptr;
    uint64_t retry_at_ns = 0;  // no connection before this time (a recent failure)
    bool master = false;       // a master in the current map
  };
  // One key's command, as arguments (pointers into the caller's keys and values).
  using Command = std::function<void(size_t index, std::vector<const char*>& argv,
                                     std::vector<size_t>& argvlen)>;
  using Reply = std::function<bool(size_t index, const redisReply& reply)>;  // true: success

  BatchResult run(std::span<const std::string> keys, const Command& command, const Reply& reply);
  // The node's connection, connecting when needed; null when it is failed or fails now.
  redisContext* connect(size_t node);
  void fail_node(size_t node, const std::string& why);
  size_t node_index(const NodeAddress& addr);
  bool refresh_from(size_t node);
  void note_error(std::string text);
  void publish_view();

  ClusterOptions options_;
  std::vector<Node> nodes_;
  std::vector<int32_t> slot_node_;  // 16384 entries: the master's index in nodes_, or −1
  bool stale_ = true;
  uint64_t last_refresh_ns_ = 0;
  ClusterView counters_;  // this thread's; copied to view_ after each call

  mutable std::mutex view_mu_;
  ClusterView view_;  // guarded by view_mu_
};

}  // namespace kvpool::daemon::remote

#include "daemon/remote/cluster_client.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <algorithm>
#include <charconv>

#include "daemon/remote/key_slot.h"
#include "daemon/telemetry/latency.h"

namespace kvpool::daemon::remote {

namespace {

// The daemon's monotonic clock (the latency recorder's), in ns.
uint64_t now_ns() {
  return LatencyRecorder::now_ns();
}

timeval to_timeval(uint32_t ms) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

// A redirection's "SLOT HOST:PORT" after the MOVED or ASK word.
struct Redirect {
  uint16_t slot = 0;
  NodeAddress to;
};
std::optional<Redirect> parse_redirect(std::string_view rest) {
  const size_t space = rest.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  Redirect r;
  const auto slot = rest.substr(0, space);
  if (std::from_chars(slot.data(), slot.data() + slot.size(), r.slot).ec != std::errc{} ||
      r.slot >= kClusterSlots) {
    return std::nullopt;
  }
  auto addr = parse_node_address(rest.substr(space + 1));
  if (!addr) return std::nullopt;
  r.to = std::move(*addr);
  return r;
}

// Waits until fd is ready for `events` or the deadline passes; whether it is ready.
// Past the deadline a socket is still looked at once, without waiting: the replies of a node
// read after a slow one are in its socket already, and that node must not count as failed.
bool wait_for(int fd, short events, uint64_t deadline_ns) {
  for (;;) {
    const uint64_t now = now_ns();
    pollfd p{fd, events, 0};
    const int ms = now >= deadline_ns ? 0
                                      : static_cast<int>(std::min<uint64_t>(
                                            (deadline_ns - now + 999'999) / 1'000'000, 60'000));
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0 && ms == 0) return false;
    if (r < 0 && errno != EINTR) return false;
  }
}

// The next reply on c by `deadline_ns`: a whole batch of replies shares one deadline, so a node
// that trickles bytes cannot stretch it (the socket's own timeout is per read); past it, only
// what has already arrived is read (wait_for). False on an error or the deadline; *out is then
// null.
bool read_reply(redisContext* c, uint64_t deadline_ns, void** out) {
  *out = nullptr;
  for (;;) {
    if (redisGetReplyFromReader(c, out) != REDIS_OK) return false;
    if (*out != nullptr) return true;
    if (!wait_for(c->fd, POLLIN, deadline_ns)) return false;
    if (redisBufferRead(c) != REDIS_OK) return false;
  }
}

// Commands in RESP (arrays of bulk strings), as iovecs: the framing in a buffer of its own,
// the arguments where the caller keeps them.
class RespWriter {
 public:
  void command(std::span<const char* const> argv, std::span<const size_t> len) {
    frame("*" + std::to_string(argv.size()) + "\r\n");
    for (size_t i = 0; i < argv.size(); ++i) {
      frame("$" + std::to_string(len[i]) + "\r\n");
      pieces_.push_back({argv[i], len[i], false});
      frame("\r\n");
    }
  }
  // Writes everything by `deadline_ns` (waiting in poll() for room, never in the socket);
  // "" or the error.
  std::string write_to(int fd, uint64_t deadline_ns) {
    std::vector<iovec> iov;
    iov.reserve(pieces_.size());
    for (const Piece& p : pieces_) {
      const char* base = p.framing ? framing_.data() + p.offset : p.data;
      if (p.len != 0) iov.push_back({const_cast<char*>(base), p.len});
    }
    size_t at = 0;
    while (at < iov.size()) {
      msghdr msg{};
      msg.msg_iov = iov.data() + at;
      msg.msg_iovlen = std::min<size_t>(iov.size() - at, IOV_MAX);
      const ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
        if (!wait_for(fd, POLLOUT, deadline_ns)) return "timed out";
        continue;
      }
      auto left = static_cast<size_t>(n);
      while (at < iov.size() && left >= iov[at].iov_len) {
        left -= iov[at].iov_len;
        ++at;
      }
      if (left != 0) {
        iov[at].iov_base = static_cast<char*>(iov[at].iov_base) + left;
        iov[at].iov_len -= left;
      }
    }
    return "";
  }

 private:
  struct Piece {
    const char* data;  // an argument, or (framing) unused
    size_t len;
    bool framing;
    size_t offset = 0;  // framing: where in framing_
  };
  void frame(const std::string& text) {
    pieces_.push_back({nullptr, text.size(), true, framing_.size()});
    framing_ += text;
  }
  std::vector<Piece> pieces_;
  std::string framing_;  // grows: pieces keep offsets, made pointers only in write_to
};

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

ClusterClient::ClusterClient(ClusterOptions options)
    : options_(std::move(options)), slot_node_(kClusterSlots, -1) {
  for (const NodeAddress& seed : options_.seeds)
    (void)node_index(seed);
  publish_view();
}

ClusterClient::~ClusterClient() {
  for (Node& n : nodes_) {
    if (n.ctx != nullptr) redisFree(n.ctx);
  }
}

size_t ClusterClient::node_index(const NodeAddress& addr) {
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].addr == addr) return i;
  }
  nodes_.push_back(Node{addr});
  return nodes_.size() - 1;
}

void ClusterClient::note_error(std::string text) {
  counters_.last_error = std::move(text);
}

redisContext* ClusterClient::connect(size_t node) {
  Node& n = nodes_[node];
  if (n.ctx != nullptr) return n.ctx;
  if (now_ns() < n.retry_at_ns) return nullptr;
  redisContext* c =
      redisConnectWithTimeout(n.addr.host.c_str(), n.addr.port, to_timeval(options_.timeout_ms));
  if (c == nullptr || c->err != 0) {
    fail_node(node, "connect to " + n.addr.text() + ": " + (c ? c->errstr : "out of memory"));
    if (c != nullptr) redisFree(c);
    return nullptr;
  }
  (void)redisSetTimeout(c, to_timeval(options_.timeout_ms));
  n.ctx = c;
  return c;
}

void ClusterClient::fail_node(size_t node, const std::string& why) {
  Node& n = nodes_[node];
  if (n.ctx != nullptr) {
    redisFree(n.ctx);
    n.ctx = nullptr;
  }
  n.retry_at_ns = now_ns() + uint64_t{options_.retry_after_ms} * 1'000'000;
  ++counters_.node_failures;
  note_error(why);
  stale_ = true;  // a replica may have taken its slots over
}

bool ClusterClient::refresh_from(size_t node) {
  redisContext* c = connect(node);
  if (c == nullptr) return false;
  auto* r = static_cast<redisReply*>(redisCommand(c, "CLUSTER SLOTS"));
  if (r == nullptr) {
    fail_node(node, "CLUSTER SLOTS from " + nodes_[node].addr.text() + ": " + c->errstr);
    return false;
  }
  bool ok = r->type == REDIS_REPLY_ARRAY;
  if (!ok) {
    note_error("CLUSTER SLOTS from " + nodes_[node].addr.text() + ": " +
               (r->type == REDIS_REPLY_ERROR ? std::string(r->str, r->len) : "not an array"));
  }
  std::vector<int32_t> map(kClusterSlots, -1);
  for (size_t i = 0; ok && i < r->elements; ++i) {
    // [start, end, [host, port, id, ...], replicas...]
    const redisReply* range = r->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2) {
      continue;
    }
    const redisReply* master = range->element[2];
    if (master->element[0]->type != REDIS_REPLY_STRING ||
        master->element[1]->type != REDIS_REPLY_INTEGER) {
      continue;
    }
    std::string host(master->element[0]->str, master->element[0]->len);
    // An empty host means "the address you reached me at".
    if (host.empty()) host = nodes_[node].addr.host;
    const long long port = master->element[1]->integer;
    const long long lo = range->element[0]->integer;
    const long long hi = range->element[1]->integer;
    if (port <= 0 || port > 65535 || lo < 0 || hi >= kClusterSlots || lo > hi) continue;
    const auto at = static_cast<int32_t>(node_index({host, static_cast<uint16_t>(port)}));
    std::fill(map.begin() + lo, map.begin() + hi + 1, at);
  }
  freeReplyObject(r);
  if (!ok) return false;
  slot_node_ = std::move(map);
  for (Node& n : nodes_)
    n.master = false;
  for (const int32_t at : slot_node_) {
    if (at >= 0) nodes_[static_cast<size_t>(at)].master = true;
  }
  ++counters_.refreshes;
  stale_ = false;
  last_refresh_ns_ = now_ns();
  return true;
}

bool ClusterClient::refresh() {
  // Known masters first (they answer fastest when healthy), then everyone else, seeds included.
  for (const bool masters : {true, false}) {
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i].master == masters && refresh_from(i)) {
        publish_view();
        return true;
      }
    }
  }
  publish_view();
  return false;
}

ClusterClient::BatchResult ClusterClient::run(std::span<const std::string> keys,
                                              const Command& command, const Reply& reply) {
  BatchResult result;
  struct Item {
    size_t index;
    int32_t ask = -1;  // an ASK target: the node to ask, after ASKING
  };
  std::vector<Item> todo;
  todo.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    todo.push_back({i});
  bool any_node_answered = false;
  std::vector<const char*> argv;
  std::vector<size_t> argvlen;
  for (int attempt = 0; attempt < kMaxAttempts && !todo.empty(); ++attempt) {
    if (stale_ && now_ns() - last_refresh_ns_ >= uint64_t{kRefreshIntervalMs} * 1'000'000) {
      (void)refresh();
    }
    std::vector<std::vector<Item>> by_node(nodes_.size());
    std::vector<Item> retry;
    for (const Item& item : todo) {
      const int32_t at = item.ask >= 0 ? item.ask : slot_node_[key_slot(keys[item.index])];
      if (at < 0) {
        ++result.failed;  // no master serves the slot now
        continue;
      }
      by_node[static_cast<size_t>(at)].push_back(item);
    }
    // Every node's commands are written, then every node's replies read: the masters work on
    // their parts at once. The commands go out with writev() from the caller's buffers (RESP
    // framing around them), not through hiredis's output buffer, which copies each value and
    // moves what is left of a large pipeline after every partial write.
    std::vector<redisContext*> ctx(nodes_.size(), nullptr);
    // One deadline for the attempt's writes and replies, every node together.
    const uint64_t deadline = now_ns() + uint64_t{options_.timeout_ms} * 1'000'000;
    for (size_t n = 0; n < by_node.size(); ++n) {
      if (by_node[n].empty()) continue;
      ctx[n] = connect(n);
      if (ctx[n] == nullptr) {
        // Its slots may have moved (failover): once more on a fresh map, then failed.
        for (const Item& item : by_node[n])
          attempt + 1 < kMaxAttempts ? retry.push_back({item.index}) : (void)++result.failed;
        by_node[n].clear();
        continue;
      }
      RespWriter out;
      static constexpr const char* kAsking[] = {"ASKING"};
      static constexpr size_t kAskingLen[] = {6};
      for (const Item& item : by_node[n]) {
        if (item.ask >= 0) out.command(kAsking, kAskingLen);
        argv.clear();
        argvlen.clear();
        command(item.index, argv, argvlen);
        out.command(argv, argvlen);
      }
      if (const std::string err = out.write_to(ctx[n]->fd, deadline); !err.empty()) {
        fail_node(n, "write to " + nodes_[n].addr.text() + ": " + err);
        ctx[n] = nullptr;
        for (const Item& item : by_node[n])
          attempt + 1 < kMaxAttempts ? retry.push_back({item.index}) : (void)++result.failed;
      }
    }
    for (size_t n = 0; n < by_node.size(); ++n) {
      if (ctx[n] == nullptr) continue;
      for (size_t k = 0; k < by_node[n].size(); ++k) {
        const Item& item = by_node[n][k];
        void* raw = nullptr;
        bool io_ok = true;
        if (item.ask >= 0) {
          io_ok = read_reply(ctx[n], deadline, &raw);
          if (raw != nullptr) freeReplyObject(raw);
          raw = nullptr;
        }
        if (io_ok) io_ok = read_reply(ctx[n], deadline, &raw);
        if (!io_ok) {
          fail_node(n, "reply from " + nodes_[n].addr.text() + ": " +
                           (ctx[n]->err != 0 ? ctx[n]->errstr : "timed out"));
          ctx[n] = nullptr;
          // This key and the node's later ones: once more on a fresh map.
          for (size_t j = k; j < by_node[n].size(); ++j) {
            attempt + 1 < kMaxAttempts ? retry.push_back({by_node[n][j].index})
                                       : (void)++result.failed;
          }
          break;
        }
        any_node_answered = true;
        const auto* r = static_cast<const redisReply*>(raw);
        if (r->type == REDIS_REPLY_ERROR) {
          const std::string_view text(r->str, r->len);
          if (starts_with(text, "MOVED ") || starts_with(text, "ASK ")) {
            const bool moved = text[0] == 'M';
            const auto to = parse_redirect(text.substr(moved ? 6 : 4));
            if (to && attempt + 1 < kMaxAttempts) {
              const auto at = static_cast<int32_t>(node_index(to->to));
              if (moved) {
                ++counters_.moved;
                slot_node_[to->slot] = at;  // until the next map, which MOVED makes due
                nodes_[static_cast<size_t>(at)].master = true;
                stale_ = true;
                retry.push_back({item.index});
              } else {
                ++counters_.asked;
                retry.push_back({item.index, at});
              }
            } else {
              ++result.failed;
              note_error(std::string(text));
            }
          } else {
            ++counters_.error_replies;
            ++result.failed;
            note_error(nodes_[n].addr.text() + ": " + std::string(text));
          }
        } else if (reply(item.index, *r)) {
          ++result.answered;
        } else {
          ++result.failed;
        }
        freeReplyObject(raw);
      }
    }
    todo = std::move(retry);
  }
  result.failed += static_cast<uint32_t>(todo.size());
  counters_.key_failures += result.failed;
  result.unreachable = !any_node_answered && result.failed != 0;
  publish_view();
  return result;
}

ClusterClient::BatchResult ClusterClient::get(std::span<const std::string> keys, const Found& found,
                                              std::vector<uint8_t>* absent) {
  static constexpr char kGet[] = "GET";
  if (absent != nullptr) absent->assign(keys.size(), 0);
  return run(
      keys,
      [&keys](size_t i, std::vector<const char*>& argv, std::vector<size_t>& len) {
        argv = {kGet, keys[i].data()};
        len = {3, keys[i].size()};
      },
      [&found, absent](size_t i, const redisReply& r) {
        if (r.type == REDIS_REPLY_STRING) {
          found(i, std::span(reinterpret_cast<const std::byte*>(r.str), r.len));
          return true;
        }
        if (r.type != REDIS_REPLY_NIL) return false;
        if (absent != nullptr) (*absent)[i] = 1;
        return true;
      });
}

ClusterClient::BatchResult ClusterClient::set(std::span<const std::string> keys,
                                              std::span<const std::span<const std::byte>> values,
                                              uint32_t ttl_s, std::vector<uint8_t>* written) {
  if (written != nullptr) written->assign(keys.size(), 0);
  static constexpr char kSet[] = "SET";
  static constexpr char kEx[] = "EX";
  const std::string ttl = std::to_string(ttl_s);
  return run(
      keys,
      [&](size_t i, std::vector<const char*>& argv, std::vector<size_t>& len) {
        argv = {kSet, keys[i].data(), reinterpret_cast<const char*>(values[i].data())};
        len = {3, keys[i].size(), values[i].size()};
        if (ttl_s != 0) {
          argv.insert(argv.end(), {kEx, ttl.data()});
          len.insert(len.end(), {2, ttl.size()});
        }
      },
      [written](size_t i, const redisReply& r) {
        const bool ok = r.type == REDIS_REPLY_STATUS;
        if (ok && written != nullptr) (*written)[i] = 1;
        return ok;
      });
}

void ClusterClient::publish_view() {
  ClusterView v = counters_;
  const uint64_t now = now_ns();
  v.nodes = 0;
  v.reachable = 0;
  for (const Node& n : nodes_) {
    if (!n.master) continue;
    ++v.nodes;
    if (n.retry_at_ns <= now) ++v.reachable;
  }
  v.slots_covered = static_cast<uint32_t>(
      std::count_if(slot_node_.begin(), slot_node_.end(), [](int32_t at) { return at >= 0; }));
  std::lock_guard lock(view_mu_);
  view_ = std::move(v);
}

ClusterView ClusterClient::view() const {
  std::lock_guard lock(view_mu_);
  return view_;
}

}  // namespace kvpool::daemon::remote

#include "client/connection/connection.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <variant>

#include "common/paths.h"

namespace kvpool::client {

namespace {

Error error(Errc code, std::string message) {
  return Error{Status(code), std::move(message)};
}

// One recvmsg into dst[0, cap): returns bytes read, 0 on an orderly close, -errno on error.
// Descriptors passed with the bytes are appended to *passed_fds when it is given, else closed.
ssize_t receive(int fd, std::byte* dst, size_t cap, std::vector<int>* passed_fds) {
  for (;;) {
    iovec iov{dst, cap};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * wire::kMaxSegments)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t r = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; ++i) {
          int received = -1;
          std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof received);
          if (passed_fds != nullptr) {
            passed_fds->push_back(received);
          } else {
            ::close(received);  // not expected here: do not leak it
          }
        }
      }
    }
    return r;
  }
}

int write_all(int fd, const std::byte* src, size_t n) {
  size_t put = 0;
  while (put < n) {
    const ssize_t r = ::send(fd, src + put, n - put, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    put += static_cast<size_t>(r);
  }
  return 0;
}

constexpr uint16_t kNoticeOpcode =
    static_cast<uint16_t>(static_cast<uint16_t>(wire::Opcode::pool_changed) | wire::kReplyBit);

// Epochs are u32 counters: a is newer than b when it is ahead by less than half the range.
bool newer(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(a - b) > 0;
}

// Rounds of segments requests one sync may take before it gives up on a pool that keeps changing.
constexpr int kMaxSyncRounds = 16;

// "" when a segments reply may replace `had` (only the segment list and what follows from it may
// change), else what changed.
std::string why_incompatible(const wire::PoolInfo& had, const wire::PoolInfo& now) {
  if (now.geometry != had.geometry) return "its geometry";
  if (now.layout != had.layout) return "its layout";
  if (now.page_stride != had.page_stride) return "its page stride";
  if (now.segment_pages != had.segment_pages || now.segment_stride != had.segment_stride) {
    return "its segments' pages or stride";
  }
  if (now.backend != had.backend) return "its backend";
  if (now.reserved_bytes != had.reserved_bytes) return "its reserved bytes";
  if (now.device_uuid != had.device_uuid) return "its device";
  return {};
}

template <typename T>
Result<T> expect(Result<wire::Reply> r) {
  if (!r.ok()) return r.error();
  if (auto* v = std::get_if<T>(&r.value())) return std::move(*v);
  return error(Errc::malformed_frame, "reply of the wrong kind");
}

}  // namespace

std::string default_socket_path() {
  if (const char* s = std::getenv("KVPOOL_SOCKET"); s != nullptr && *s != '\0') return s;
  return kvpool::default_socket_path();
}

Result<std::unique_ptr<Connection>> Connection::attach(const std::string& socket_path,
                                                       const std::string& worker_name,
                                                       const std::string& pool_name, Memory memory,
                                                       uint64_t link_session,
                                                       const HashScheme& hash_scheme) {
  if (worker_name.size() > wire::kMaxNameBytes || pool_name.size() > wire::kMaxNameBytes) {
    return error(Errc::invalid_argument, "worker and pool names are limited to " +
                                             std::to_string(wire::kMaxNameBytes) + " bytes");
  }
  if (hash_scheme.name.size() > wire::kMaxSchemeBytes) {
    return error(Errc::invalid_argument, "a hash scheme's name is limited to " +
                                             std::to_string(wire::kMaxSchemeBytes) + " bytes");
  }
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof addr.sun_path) {
    return error(Errc::invalid_argument, "socket path too long: " + socket_path);
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return error(Errc::internal, std::string("socket: ") + std::strerror(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    ::close(fd);
    std::string why;
    if (e == ENOENT) {
      why = "kvpoold is not running: there is no socket at " + socket_path;
    } else if (e == ECONNREFUSED) {
      why = "kvpoold is not running: nothing listens on " + socket_path + " (a stale socket)";
    } else if (e == EACCES) {
      why = "permission denied on " + socket_path +
            " (is this user in the socket's group? see kvpoold's socket.group)";
    } else {
      why = "cannot connect to " + socket_path + ": " + std::strerror(e);
    }
    return error(Errc::connection_lost, why);
  }
  std::unique_ptr<Connection> c(new Connection(fd));
  c->out_.clear();
  const uint32_t id = c->next_id_++;
  wire::encode_request(id, wire::HelloRequest{worker_name, pool_name, link_session, hash_scheme},
                       c->out_);
  std::vector<int> fds;
  auto reply = c->round_trip(id, &fds);
  auto hello = expect<wire::HelloReply>(std::move(reply));
  auto close_fds = [&fds] {
    for (int f : fds)
      ::close(f);
  };
  if (!hello.ok()) {
    close_fds();
    return hello.error();
  }
  c->pool_ = hello.value().pool;
  c->notified_epoch_ = c->pool_.epoch;
  c->session_id_ = hello.value().session_id;
  c->hash_scheme_ = hash_scheme;
  if (memory == Memory::none) {
    close_fds();
    return c;
  }
  auto mapping = PoolMapping::map(c->pool_, fds);
  close_fds();  // a mapping holds what it needs; the descriptors are not needed after
  if (!mapping.ok()) return mapping.error();
  c->mapping_ = std::move(mapping.value());
  c->base_ = c->mapping_->base();
  return c;
}

Connection::~Connection() {
  mapping_.reset();
  if (fd_ >= 0) ::close(fd_);
}

float* Connection::page_scales(PageId p) const {
  const uint64_t bytes = page_scale_bytes(pool_.geometry);
  if (bytes == 0 || base_ == nullptr) return nullptr;
  return reinterpret_cast<float*>(base_ + pool_.scales_offset + uint64_t{p} * bytes);
}

Error Connection::broken(Error e) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  in_have_ = 0;
  e.message += " (connection closed: the reply stream is out of step)";
  return e;
}

Error Connection::lost(const std::string& what) {
  lost_ = true;
  return error(Errc::connection_lost, "connection to kvpoold lost: " + what);
}

bool Connection::peer_closed() const {
  if (lost_ || fd_ < 0) return true;
  pollfd p{fd_, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

void Connection::consume(size_t n) {
  std::memmove(in_.data(), in_.data() + n, in_have_ - n);
  in_have_ -= n;
}

Result<wire::FrameHeader> Connection::read_frame(std::vector<int>* passed_fds, int send_error) {
  // Read as much as is there: a whole small reply usually arrives in one recvmsg.
  if (in_.size() < kReadChunk) in_.resize(kReadChunk);
  size_t need = wire::kHeaderBytes;
  std::optional<wire::FrameHeader> header;
  for (;;) {
    if (!header && in_have_ >= wire::kHeaderBytes) {
      auto h = wire::decode_header(std::span(in_).first(wire::kHeaderBytes));
      if (!h.ok()) return broken(h.error());
      header = h.value();
      need = wire::kHeaderBytes + header->length;
      if (in_.size() < need) in_.resize(need);
    }
    if (header && in_have_ >= need) return *header;
    const ssize_t r = receive(fd_, in_.data() + in_have_, in_.size() - in_have_, passed_fds);
    if (r <= 0) {
      const bool started = in_have_ > 0;
      if (send_error != 0) return lost(std::string("send: ") + std::strerror(send_error));
      if (r == 0)
        return lost(started ? "the daemon closed the connection mid-reply"
                            : "the daemon closed the connection");
      return lost(std::strerror(static_cast<int>(-r)));
    }
    in_have_ += static_cast<size_t>(r);
  }
}

Result<Ok> Connection::take_notice(const wire::FrameHeader& header) {
  auto epoch =
      wire::decode_pool_changed(header, std::span(in_).subspan(wire::kHeaderBytes, header.length));
  consume(wire::kHeaderBytes + header.length);
  if (!epoch.ok()) return broken(epoch.error());
  if (newer(epoch.value(), notified_epoch_)) notified_epoch_ = epoch.value();
  return Ok{};
}

Result<wire::Reply> Connection::round_trip(uint32_t request_id, std::vector<int>* passed_fds) {
  if (fd_ < 0) return lost("connection already failed");
  // A daemon that refuses the connection sends its reason and closes, possibly before our
  // request is out: so a failed send still reads whatever reply is waiting.
  const int send_error = write_all(fd_, out_.data(), out_.size());
  wire::FrameHeader header;
  for (;;) {
    auto h = read_frame(passed_fds, send_error);
    if (!h.ok()) return h.error();
    header = h.value();
    if (header.opcode != kNoticeOpcode) break;
    // A pool_changed notice, pushed between replies: noted, and the reply is still to come.
    if (auto n = take_notice(header); !n.ok()) return n.error();
  }
  const auto payload = std::span(in_).subspan(wire::kHeaderBytes, header.length);
  auto reply = wire::decode_reply(header, payload);
  // What follows the reply (a notice pushed after it) stays for the next read.
  consume(wire::kHeaderBytes + header.length);
  // Request id 0 is the daemon refusing the connection itself (e.g. too many sessions).
  if (header.request_id != request_id && header.request_id != 0) {
    return broken(error(Errc::malformed_frame, "reply to request " +
                                                   std::to_string(header.request_id) +
                                                   ", expected " + std::to_string(request_id)));
  }
  return reply;
}

bool Connection::names_unmapped_page(const wire::Reply& reply) const {
  const uint32_t n = pool_.num_pages;
  if (const auto* a = std::get_if<wire::AllocReply>(&reply)) {
    return std::any_of(a->pages.begin(), a->pages.end(), [n](PageId p) { return p >= n; });
  }
  if (const auto* l = std::get_if<wire::LookupReply>(&reply)) {
    // kNoPage: a block before a sliding window's hit, no page at all.
    return std::any_of(l->pages.begin(), l->pages.end(),
                       [n](PageId p) { return p >= n && p != kNoPage; });
  }
  if (const auto* v = std::get_if<wire::ReserveReply>(&reply)) {
    return std::any_of(v->pages.begin(), v->pages.end(),
                       [n](PageId p) { return p >= n && p != kNoPage; });
  }
  if (const auto* p = std::get_if<wire::PublishReply>(&reply)) {
    return std::any_of(p->results.begin(), p->results.end(),
                       [n](const PublishResult& r) { return r.page >= n; });
  }
  return false;
}

void Connection::adopt(const wire::PoolInfo& info) {
  // The session's own facts (its tenant) are the hello's; the rest is the pool's, as it is now.
  std::string tenant = std::move(pool_.tenant);
  pool_ = info;
  pool_.tenant = std::move(tenant);
}

Result<bool> Connection::sync() {
  struct Guard {
    bool& flag;
    explicit Guard(bool& f) : flag(f) { flag = true; }
    ~Guard() { flag = false; }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
  } guard(syncing_);
  bool changed = false;
  for (int round = 0; round < kMaxSyncRounds; ++round) {
    out_.clear();
    const uint32_t id = next_id_++;
    wire::encode_request(id, wire::SegmentsRequest{}, out_);
    std::vector<int> fds;
    auto r = expect<wire::SegmentsReply>(round_trip(id, &fds));
    struct Closer {
      std::vector<int>& fds;
      ~Closer() {
        for (int f : fds)
          ::close(f);
      }
    } closer{fds};
    if (!r.ok()) return r.error();
    const wire::PoolInfo& info = r.value().pool;
    if (std::string what = why_incompatible(pool_, info); !what.empty()) {
      return error(Errc::malformed_frame, "segments reply for pool " + pool_.pool_name +
                                              " changes " + what +
                                              ", which a resize never changes");
    }
    // The reply may be newer than every notice read so far (a change that happened after them).
    if (newer(info.epoch, notified_epoch_)) notified_epoch_ = info.epoch;
    if (info.epoch != pool_.epoch || info.segments != pool_.segments) {
      if (mapping_) {
        auto u = mapping_->update(info, fds);
        if (!u.ok()) return u.error();
      }
      adopt(info);
      changed = true;
    }
    if (!newer(notified_epoch_, pool_.epoch)) return changed;
  }
  return error(Errc::internal, "pool " + pool_.pool_name + " kept changing: still behind after " +
                                   std::to_string(kMaxSyncRounds) + " segments requests");
}

Result<bool> Connection::poll_notices() {
  if (fd_ < 0) return lost("connection already failed");
  for (;;) {
    if (in_have_ == 0) {
      pollfd p{fd_, POLLIN, 0};
      const int n = ::poll(&p, 1, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return error(Errc::internal, std::string("poll: ") + std::strerror(errno));
      if (n == 0) break;  // nothing waiting
    }
    // A frame has started (or bytes, or the daemon's close, are waiting): read it whole.
    auto h = read_frame(nullptr, 0);
    if (!h.ok()) return h.error();
    if (h.value().opcode != kNoticeOpcode) {
      return broken(error(Errc::malformed_frame, "a frame of opcode " +
                                                     std::to_string(h.value().opcode) +
                                                     " arrived with no request in flight"));
    }
    if (auto t = take_notice(h.value()); !t.ok()) return t.error();
  }
  if (!newer(notified_epoch_, pool_.epoch)) return false;
  return sync();
}

Result<wire::Reply> Connection::call(const wire::Request& request) {
  // Limits the daemon would refuse are refused here, with the reason, before anything is sent.
  const size_t items = std::visit(
      [](const auto& r) -> size_t {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, wire::RetainRequest> ||
                      std::is_same_v<T, wire::ReleaseRequest>) {
          return r.pages.size();
        } else if constexpr (std::is_same_v<T, wire::LookupRequest>) {
          return r.chain.size();
        } else if constexpr (std::is_same_v<T, wire::PublishRequest>) {
          return r.items.size();
        } else if constexpr (std::is_same_v<T, wire::AllocRequest>) {
          return r.count;
        } else {
          return 0;
        }
      },
      request);
  if (items > wire::kMaxBatch) {
    return error(Errc::invalid_argument, "batch of " + std::to_string(items) +
                                             " items exceeds the protocol's limit of " +
                                             std::to_string(wire::kMaxBatch));
  }
  out_.clear();
  const uint32_t id = next_id_++;
  wire::encode_request(id, request, out_);
  auto reply = round_trip(id, nullptr);
  if (syncing_ || fd_ < 0) return reply;
  const bool beyond = reply.ok() && names_unmapped_page(reply.value());
  if (!beyond && !newer(notified_epoch_, pool_.epoch)) return reply;
  // The pool changed (a notice came) or the reply names a page past the mapped ones: map what
  // is new before the caller sees the reply. A failed sync fails a successful call (its pages
  // could not be used), and is retried by the next call after a failed one.
  auto synced = sync();
  if (!reply.ok()) return reply;
  if (!synced.ok()) return synced.error();
  if (names_unmapped_page(reply.value())) {
    return error(Errc::malformed_frame, "reply names a page beyond the pool's " +
                                            std::to_string(pool_.num_pages) +
                                            " pages, even after syncing its segments");
  }
  return reply;
}

Result<std::vector<PageId>> Connection::alloc(uint32_t count, const PageHints& hints) {
  auto r = expect<wire::AllocReply>(call(wire::AllocRequest{count, hints}));
  if (!r.ok()) return r.error();
  if (r.value().pages.size() != count) {
    return broken(error(Errc::malformed_frame, "alloc reply with " +
                                                   std::to_string(r.value().pages.size()) +
                                                   " pages for " + std::to_string(count)));
  }
  return std::move(r.value().pages);
}

Result<Ok> Connection::retain(std::span<const PageId> pages, const PageHints& hints) {
  auto r =
      expect<wire::RetainReply>(call(wire::RetainRequest{{pages.begin(), pages.end()}, hints}));
  if (!r.ok()) return r.error();
  return Ok{};
}

Result<Ok> Connection::release(std::span<const PageId> pages) {
  auto r = expect<wire::ReleaseReply>(call(wire::ReleaseRequest{{pages.begin(), pages.end()}}));
  if (!r.ok()) return r.error();
  return Ok{};
}

Result<std::vector<PageId>> Connection::lookup(std::span<const BlockHash> chain,
                                               const PageHints& hints) {
  auto r = lookup_with_tiers(chain, hints);
  if (!r.ok()) return r.error();
  return std::move(r.value().pages);
}

Result<wire::LookupReply> Connection::lookup_with_tiers(std::span<const BlockHash> chain,
                                                        const PageHints& hints) {
  auto r =
      expect<wire::LookupReply>(call(wire::LookupRequest{{chain.begin(), chain.end()}, hints}));
  if (!r.ok()) return r.error();
  if (r.value().pages.size() > chain.size()) {
    return broken(error(Errc::malformed_frame, "lookup reply with more hits than hashes"));
  }
  return std::move(r.value());
}

Result<wire::GroupLookupReply> Connection::lookup_groups(std::span<const BlockHash> chain,
                                                         const PageHints& hints) {
  auto r = expect<wire::GroupLookupReply>(
      call(wire::GroupLookupRequest{{chain.begin(), chain.end()}, hints}));
  if (!r.ok()) return r.error();
  if (r.value().hits() > chain.size() || r.value().groups.size() != pool_.groups.size()) {
    return broken(error(Errc::malformed_frame,
                        "lookup_groups reply with " + std::to_string(r.value().hits()) +
                            " hits of " + std::to_string(r.value().groups.size()) + " groups for " +
                            std::to_string(chain.size()) + " hashes of " +
                            std::to_string(pool_.groups.size()) + " groups"));
  }
  return std::move(r.value());
}

Result<wire::ReserveReply> Connection::reserve(uint32_t max_tokens, std::span<const PageId> seeds,
                                               const PageHints& hints) {
  const uint64_t want = (uint64_t{max_tokens} + pool_.geometry.tokens_per_page - 1) /
                        std::max<uint32_t>(1, pool_.geometry.tokens_per_page);
  if (want > wire::kMaxBatch) {
    return error(Errc::invalid_argument, "reserve: max_tokens " + std::to_string(max_tokens) +
                                             " needs " + std::to_string(want) +
                                             " pages, more than one reply carries (" +
                                             std::to_string(wire::kMaxBatch) + ")");
  }
  auto r = expect<wire::ReserveReply>(
      call(wire::ReserveRequest{max_tokens, {seeds.begin(), seeds.end()}, hints}));
  if (!r.ok()) return r.error();
  if (r.value().pages.size() != want) {
    return broken(error(Errc::malformed_frame, "reserve reply with " +
                                                   std::to_string(r.value().pages.size()) +
                                                   " pages for " + std::to_string(want)));
  }
  return std::move(r.value());
}

Result<Ok> Connection::unreserve(uint64_t reservation) {
  auto r = expect<wire::UnreserveReply>(call(wire::UnreserveRequest{reservation}));
  if (!r.ok()) return r.error();
  return Ok{};
}

Result<std::vector<PublishResult>> Connection::publish(std::span<const PublishItem> items,
                                                       const PageHints& hints,
                                                       const PublishChain& chain) {
  const uint64_t tpp = pool_.geometry.tokens_per_page;
  if (!chain.token_ids.empty() && chain.token_ids.size() != items.size() * tpp) {
    return error(Errc::invalid_argument, "publish: " + std::to_string(chain.token_ids.size()) +
                                             " token ids for " + std::to_string(items.size()) +
                                             " blocks of " + std::to_string(tpp) +
                                             " tokens (tokens_per_page): pass " +
                                             std::to_string(items.size() * tpp) + " or none");
  }
  if (chain.lora_name.size() > wire::kMaxNameBytes) {
    return error(Errc::invalid_argument,
                 "publish: lora_name is " + std::to_string(chain.lora_name.size()) +
                     " bytes; at most " + std::to_string(wire::kMaxNameBytes));
  }
  // A frame carries at most kMaxBatch items and kMaxBatch token ids: a longer call goes in
  // parts, each continuing the chain from the last block of the one before.
  const size_t per_call =
      chain.token_ids.empty() ? wire::kMaxBatch : std::max<size_t>(1, wire::kMaxBatch / tpp);
  std::vector<PublishResult> results;
  results.reserve(items.size());
  size_t i = 0;
  do {
    const size_t n = std::min(items.size() - i, per_call);
    wire::PublishRequest req{{items.begin() + static_cast<std::ptrdiff_t>(i),
                              items.begin() + static_cast<std::ptrdiff_t>(i + n)},
                             hints,
                             chain.parent,
                             {},
                             std::string(chain.lora_name)};
    if (i > 0) req.parent = items[i - 1].hash;
    if (!chain.token_ids.empty()) {
      const auto ids = chain.token_ids.subspan(i * tpp, n * tpp);
      req.token_ids.assign(ids.begin(), ids.end());
    }
    auto r = expect<wire::PublishReply>(call(std::move(req)));
    if (!r.ok()) {
      // The parts before were published; their duplicates' pages were retained for this
      // session, which will not learn of them: give those back.
      std::vector<PageId> retained;
      for (const PublishResult& done : results) {
        if (done.kind == PublishResult::Kind::duplicate) retained.push_back(done.page);
      }
      if (!retained.empty()) (void)release(retained);
      return r.error();
    }
    if (r.value().results.size() != n) {
      return broken(error(Errc::malformed_frame,
                          "publish reply with " + std::to_string(r.value().results.size()) +
                              " results for " + std::to_string(n) + " items"));
    }
    results.insert(results.end(), r.value().results.begin(), r.value().results.end());
    i += n;
  } while (i < items.size());
  return results;
}

Result<wire::StatsReply> Connection::stats() {
  return expect<wire::StatsReply>(call(wire::StatsRequest{}));
}

Result<uint32_t> Connection::evict(uint32_t n) {
  auto r = expect<wire::EvictReply>(call(wire::EvictRequest{n}));
  if (!r.ok()) return r.error();
  return r.value().evicted;
}

Result<uint32_t> Connection::flush() {
  auto r = expect<wire::FlushReply>(call(wire::FlushRequest{}));
  if (!r.ok()) return r.error();
  return r.value().flushed;
}

Result<uint32_t> Connection::copy(std::span<const wire::PageCopy> pairs) {
  auto r = expect<wire::CopyReply>(call(wire::CopyRequest{{pairs.begin(), pairs.end()}}));
  if (!r.ok()) return r.error();
  return r.value().copied;
}

Result<std::vector<uint8_t>> Connection::pages() {
  auto r = expect<wire::PagesReply>(call(wire::PagesRequest{}));
  if (!r.ok()) return r.error();
  return std::move(r.value().states);
}

Result<std::vector<wire::SessionInfo>> Connection::sessions() {
  auto r = expect<wire::SessionsReply>(call(wire::SessionsRequest{}));
  if (!r.ok()) return r.error();
  return std::move(r.value().sessions);
}

// Operations, metrics and events -------------------------------------------------------------

Result<wire::PrefixesReply> Connection::prefixes(uint32_t limit) {
  return expect<wire::PrefixesReply>(call(wire::PrefixesRequest{limit}));
}

Result<wire::ReloadReply> Connection::reload() {
  return expect<wire::ReloadReply>(call(wire::ReloadRequest{}));
}

Result<wire::SnapshotReply> Connection::snapshot() {
  return expect<wire::SnapshotReply>(call(wire::SnapshotRequest{}));
}

// Elastic pools -----------------------------------------------------------------------------

Result<uint32_t> Connection::resize(uint32_t pages) {
  auto r = expect<wire::ResizeReply>(call(wire::ResizeRequest{pages}));
  if (!r.ok()) return r.error();
  // The daemon pushed its notice before this reply, so call() has synced already; a daemon that
  // did not is asked here.
  if (r.value().pages != pool_.num_pages) {
    auto s = sync();
    if (!s.ok()) return s.error();
  }
  return r.value().pages;
}

Result<wire::PoolInfo> Connection::segments() {
  auto r = expect<wire::SegmentsReply>(call(wire::SegmentsRequest{}));
  if (!r.ok()) return r.error();
  return std::move(r.value().pool);
}

}  // namespace kvpool::client

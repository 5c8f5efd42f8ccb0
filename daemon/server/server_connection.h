// Server::Connection: one client connection of kvpoold's Server — its socket, input and output
// buffers, framing, the limits that apply to it (docs/ARCHITECTURE.md, "Limits") and the
// session it carries. Included by server.cpp only; see server.h for the behaviour as a whole.
//
// Thread-safety: the event loop's thread only; a CopyJob it hands out runs on the CopyWorker
// and comes back through copy_done on the loop.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/check.h"
#include "daemon/server/server.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace asio = boost::asio;
using Local = asio::local::stream_protocol;

// One client connection: buffers, framing and the session it carries.
//
// States: reading (a read is outstanding, reading_), serving (serve() handles buffered frames;
// no read is outstanding, so the input buffer may move), paused (backlog over the limit, or a
// copy in flight: buffered frames wait), closing (an error reply queued, then closed), closed.
// serve() is the only place that starts a read, so at most one is ever outstanding.
class Server::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Server& server, Local::socket socket, std::unique_ptr<SessionState> session)
      : server_(server),
        socket_(std::move(socket)),
        session_(std::move(session)),
        frame_timer_(server.io_),
        hello_timer_(server.io_) {}

  void start() {
    const auto timeout = std::chrono::milliseconds(server_.service_.config().hello_timeout_ms);
    hello_timer_.expires_after(timeout);
    hello_timer_.async_wait(
        [self = shared_from_this(), timeout](const boost::system::error_code& ec) {
          if (ec || self->closed_ || self->session_->attached) return;
          ++self->server_.service_.connection_stats().closed_by_limits;
          self->close("no hello within limits.hello_timeout_ms (" +
                      std::to_string(timeout.count()) + " ms)");
        });
    serve(0);
  }

  // Closes the socket and releases the session (idempotent). With a copy in flight the release
  // waits for it (copy_done), since the copy still reads and writes the session's pages.
  void close(std::string_view reason) {
    if (closed_) return;
    closed_ = true;
    frame_timer_.cancel();
    hello_timer_.cancel();
    boost::system::error_code ignored;
    socket_.close(ignored);
    if (subscribed_) server_.subscribers_.erase(this);
    drop_fds();
    // Assigning {} would keep the capacity: these really give the memory back.
    std::vector<std::byte>().swap(in_);
    std::vector<std::byte>().swap(out_);
    in_len_ = 0;
    sent_ = 0;
    account();
    log_event(LogLevel::info, "session_close",
              {kv("session", session_->id), kv("reason", std::string(reason)),
               kv("held_pages", session_->held_pages)});
    if (!copy_in_flight_) release();
  }

  // The daemon is stopping and its CopyWorker stopped: a copy in flight has run or never will,
  // and its completion will not be waited for. A connection closed while copying is released
  // now.
  void abandon_copy() {
    if (!copy_in_flight_) return;
    copy_in_flight_ = false;
    if (closed_) release();
  }

  uint64_t accounted() const { return accounted_; }

  // Operations, metrics and events: a subscribed connection ---------------------------------

  // Appends the events this subscriber has not seen, as long as less than
  // kMaxSubscriberBacklogBytes wait for it, and sends what it can. A subscriber that does not
  // read stops here; its cursor stays where it is and the ring moves on without it.
  void pump_events() {
    pump_posted_ = false;
    if (!subscribed_ || closed_ || close_after_flush_) return;
    bool added = false;
    while (pending_bytes() < kMaxSubscriberBacklogBytes) {
      batch_.events.clear();
      server_.service_.collect_events(*session_, kEventsPerFrame, batch_);
      if (batch_.events.empty()) break;
      wire::encode_event_batch(session_->subscription->request_id, batch_, out_);
      added = true;
    }
    if (added) flush();
    account();
  }

  // Queues a pool_changed notice when the session's pool has a segment list it was not told of.
  void notify_pool_change() {
    if (closed_ || subscribed_ || close_after_flush_ || !session_->attached) return;
    const uint32_t epoch = session_->pool->info().epoch;
    if (session_->known_epoch == epoch) return;
    session_->known_epoch = epoch;
    wire::encode_pool_changed(epoch, out_);
    flush();
    account();
  }

  // Queues an error reply and closes once it is sent (or could not be).
  void fail(uint32_t request_id, uint16_t opcode, const wire::Error& e) {
    wire::encode_error(request_id, opcode, e, out_);
    close_after_flush_ = true;
    close_reason_ = e.message;
  }

 private:
  // The session goes back to the Service and the connection leaves the server.
  void release() {
    server_.service_.close_session(*session_);
    server_.closed(shared_from_this());
  }

  // Handles the complete frames buffered, sends the replies, then decides what waits for what:
  // more bytes from the peer (a read), the peer reading its replies (paused), a copy, or another
  // turn (posted, so that other connections are served first). `arrival`: when the read that
  // brought the bytes returned (0 = now, or latency is not timed).
  void serve(uint64_t arrival) {
    if (closed_) return;
    KVPOOL_CHECK(!reading_);
    const bool timed = server_.service_.request_latency().enabled();
    if (timed && arrival == 0) arrival = LatencyRecorder::now_ns();
    const bool progressed = process_frames(timed ? arrival : 0);
    if (closed_) return;
    if (progressed) {
      // The activity hook runs before the replies leave, so that whoever reads the stats after
      // a reply (kvpoolctl flush && kvpoolctl status) finds what the hook published.
      if (server_.activity_ != nullptr) server_.activity_->on_activity();
      server_.publish_kv_events();
      server_.notify_pool_changes();
      server_.start_background_jobs();
      flush();
      server_.pump_subscribers();
      if (closed_) return;
    }
    shrink_input();
    account();
    if (closed_) return;
    if (close_after_flush_) {
      // Answered and closing: read nothing more; a peer that never takes the answer is closed
      // at the frame timeout anyway.
      arm_frame_timer("closing: the peer did not read its error reply within the frame timeout");
      return;
    }
    if (copy_in_flight_ || pending_bytes() > kMaxBacklogBytes || !fds_to_pass_.empty()) {
      // Paused: buffered requests wait for the copy or for the peer to read (backpressure). A
      // partial frame waiting here is our doing, not the peer's, so its timer stops.
      if (!copy_in_flight_) reading_paused_ = true;
      disarm_frame_timer();
      return;
    }
    if (!subscribed_ && complete_frame_buffered()) {
      // The turn's budget ran out: come back after the others.
      disarm_frame_timer();
      asio::post(server_.io_, [self = shared_from_this()] { self->serve(0); });
      return;
    }
    // Waiting for the peer. A frame left incomplete must finish within the frame timeout; the
    // clock restarts whenever a frame completed.
    if (in_len_ > 0) {
      if (progressed || !timer_active_) {
        arm_frame_timer("incomplete frame: no full frame within the frame timeout");
      }
    } else {
      disarm_frame_timer();
    }
    wait_readable();
  }

  // Reading goes through async_read_some: Asio keeps the socket registered edge-triggered and
  // reads when epoll reports data, so a request costs one epoll_wait and one recv (an async_wait
  // would re-arm the descriptor with an epoll_ctl per request).
  void wait_readable() {
    if (closed_ || reading_) return;
    // An idle connection reads into a small buffer; one in the middle of frames into a larger
    // one, so that bulk requests take few reads.
    const size_t room = in_len_ == 0 ? kIdleReadBytes : kReadChunk;
    if (in_.size() - in_len_ < room) {
      // Room for the rest of the frame being read, at once rather than by doubling, so an 8 MiB
      // frame costs 8 MiB and not 16.
      const size_t want = std::max(in_len_ + room, frame_end_);
      if (want > in_.capacity()) in_.reserve(want);
      in_.resize(in_len_ + room);
      account();
      if (closed_) return;
    }
    reading_ = true;
    socket_.async_read_some(
        asio::buffer(in_.data() + in_len_, in_.size() - in_len_),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          self->reading_ = false;
          if (ec) {
            if (ec == asio::error::eof) return self->close("peer closed the connection");
            if (ec != asio::error::operation_aborted) self->close(ec.message());
            return;
          }
          if (self->closed_) return;
          self->in_len_ += n;
          self->serve(0);
        });
  }

  // True when a whole frame waits in the input buffer.
  bool complete_frame_buffered() const {
    if (in_len_ < wire::kHeaderBytes) return false;
    const auto header = wire::decode_header(std::span<const std::byte>(in_.data(), in_len_));
    return !header.ok() || in_len_ >= wire::kHeaderBytes + header.value().length;
  }

  // Handles the complete frames at the front of the input buffer, within this turn's budget and
  // while the output backlog allows; returns whether any was handled. `arrival`: 0 = not timed.
  bool process_frames(uint64_t arrival) {
    size_t pos = 0;
    size_t frames = 0;
    const size_t out_at_start = out_.size();
    frame_end_ = 0;
    // A reply with descriptors is sent before the next frame is read: one at a time.
    while (!close_after_flush_ && !subscribed_ && !copy_in_flight_ && fds_to_pass_.empty() &&
           in_len_ - pos >= wire::kHeaderBytes) {
      // Checked before each reply is built, so a pipeline of large replies stops here.
      if (pending_bytes() > kMaxBacklogBytes || frames == kMaxFramesPerTurn ||
          out_.size() - out_at_start >= kMaxReplyBytesPerTurn) {
        break;
      }
      const std::span<const std::byte> avail(in_.data() + pos, in_len_ - pos);
      const auto header = wire::decode_header(avail);
      if (!header.ok()) {
        const wire::FrameHeader raw = wire::read_header_fields(avail);
        fail(raw.request_id, raw.opcode, header.error());
        break;
      }
      const wire::FrameHeader& h = header.value();
      if (!session_->attached && h.length > kMaxPreHelloPayload) {
        fail(h.request_id, h.opcode,
             wire::Error{Status(Errc::frame_too_large, kNoItem, h.length),
                         "a frame before hello may carry at most " +
                             std::to_string(kMaxPreHelloPayload) + " bytes; this one announces " +
                             std::to_string(h.length)});
        break;
      }
      const size_t total = wire::kHeaderBytes + h.length;
      if (avail.size() < total) {
        frame_end_ = total;  // wait for the rest of the frame
        break;
      }
      ++frames;
      const auto payload = avail.subspan(wire::kHeaderBytes, h.length);
      const auto request = wire::decode_request(h, payload);
      pos += total;
      if (!request.ok()) {
        // The frame's length was sound, so the stream stays in step: answer and go on.
        wire::encode_error(h.request_id, h.opcode, request.error(), out_);
        continue;
      }
      std::span<const int> fds;
      std::unique_ptr<CopyJob> copy;
      const size_t reply_at = out_.size();
      server_.service_.handle(*session_, h.request_id, request.value(), out_, &fds, &copy);
      if (copy) {
        start_copy(std::move(copy), arrival);
        break;
      }
      if (!fds.empty()) {
        // Copies of the pool's descriptors: an elastic pool may close or reallocate its own
        // before this reply leaves.
        for (const int fd : fds) {
          const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
          if (dup >= 0) fds_to_pass_.push_back(dup);
        }
        if (fds_to_pass_.size() != fds.size()) {
          log_event(LogLevel::error, "fd_copy_failed",
                    {kv("session", session_->id), kv("error", std::strerror(errno))});
        }
        fds_at_ = reply_at;
      }
      if (arrival != 0) {
        server_.service_.request_latency().record(h.opcode, LatencyRecorder::now_ns() - arrival);
      }
      if (!hello_done_ && session_->attached) {
        hello_done_ = true;
        hello_timer_.cancel();
      }
      if (session_->subscription && !subscribed_) {
        subscribed_ = true;
        server_.subscribers_.insert(this);
        server_.pumped_seq_ = 0;  // a replay from an old sequence is due even with no new event
      }
    }
    if (subscribed_ && in_len_ > pos && !close_after_flush_) {
      // A subscribed connection only receives; a request now would interleave with events.
      fail(session_->subscription->request_id, static_cast<uint16_t>(wire::Opcode::subscribe),
           wire::Error{Status(Errc::invalid_argument),
                       "a subscribed connection takes no more requests"});
      pos = in_len_;
    }
    // Keep the unconsumed tail at the front of the buffer.
    if (pos > 0) {
      std::memmove(in_.data(), in_.data() + pos, in_len_ - pos);
      in_len_ -= pos;
    }
    return pos > 0 || close_after_flush_;
  }

  // Runs a copy too large for the loop on the CopyWorker; the connection handles nothing more
  // until copy_done.
  void start_copy(std::unique_ptr<CopyJob> job, uint64_t arrival) {
    copy_in_flight_ = true;
    copy_arrival_ = arrival;
    server_.worker_for(*job).submit(std::move(job),
                                    [self = shared_from_this()](std::unique_ptr<CopyJob> done) {
                                      self->copy_done(std::move(done));
                                    });
  }

  void copy_done(std::unique_ptr<CopyJob> job) {
    if (!copy_in_flight_) return;  // abandoned: the daemon is stopping
    copy_in_flight_ = false;
    if (closed_) {
      // Closed while copying: the reply has nowhere to go; the session's pages go back now.
      std::vector<std::byte> discarded;
      session_->closing = true;
      if (auto next = server_.service_.finish_copy(*job, discarded)) {
        // Not made for a closing session today; if ever, it runs where copies run, and comes
        // back here.
        start_copy(std::move(next), copy_arrival_);
        return;
      }
      release();
      return;
    }
    if (auto next = server_.service_.finish_copy(*job, out_)) {
      // A remote fetch whose promotion's copies follow off the loop: they answer.
      start_copy(std::move(next), copy_arrival_);
      return;
    }
    // What the job changed reaches the other sessions even if this one sends nothing more.
    if (server_.activity_ != nullptr) server_.activity_->on_activity();
    server_.publish_kv_events();
    server_.notify_pool_changes();
    server_.start_background_jobs();
    if (copy_arrival_ != 0) {
      server_.service_.request_latency().record(static_cast<uint16_t>(job->op),
                                                LatencyRecorder::now_ns() - copy_arrival_);
    }
    flush();
    serve(0);
  }

  // After a large frame the input buffer goes back to an idle connection's size. Only between
  // reads (no read may be writing into it).
  void shrink_input() {
    if (in_.capacity() <= 2 * kReadChunk || in_len_ > kIdleReadBytes) return;
    std::vector<std::byte> smaller(kIdleReadBytes);
    std::memcpy(smaller.data(), in_.data(), in_len_);
    in_.swap(smaller);
  }

  // Tells the server how many bytes this connection's buffers hold; may close connections
  // (this one included) when the daemon's budget is passed. Counted: the input buffer's size
  // (what was received or zero-filled for reading; room reserved for a frame's rest is not
  // touched yet), the queued output, or the output buffer kept between replies.
  void account() {
    const uint64_t now = in_.size() + (out_.empty() ? out_.capacity() : out_.size());
    const bool grew = now > accounted_;
    uint64_t& total = server_.service_.connection_stats().buffered_bytes;  // every connection's
    total = total - accounted_ + now;
    accounted_ = now;
    if (grew && total > server_.service_.config().max_buffered_bytes) {
      server_.enforce_buffer_budget();
    }
  }

  // Closes the connection with `reason` unless something re-arms or disarms the timer first.
  void arm_frame_timer(const char* reason) {
    const uint64_t generation = ++timer_generation_;
    timer_active_ = true;
    frame_timer_.expires_after(server_.frame_timeout_);
    frame_timer_.async_wait(
        [self = shared_from_this(), generation, reason](const boost::system::error_code& ec) {
          if (ec || self->closed_ || generation != self->timer_generation_) return;
          ++self->server_.service_.connection_stats().closed_by_limits;
          self->close(reason);
        });
  }

  void disarm_frame_timer() {
    if (!timer_active_) return;
    ++timer_generation_;
    timer_active_ = false;
    frame_timer_.cancel();
  }

  size_t pending_bytes() const { return out_.size() - sent_; }

  // Sends what is queued without blocking; waits for writability when the socket is full.
  void flush() {
    while (!closed_ && sent_ < out_.size()) {
      size_t len = out_.size() - sent_;
      msghdr msg{};
      iovec iov{};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * wire::kMaxSegments)] = {};
      const bool with_fds = !fds_to_pass_.empty() && fds_at_ == sent_;
      if (!fds_to_pass_.empty() && fds_at_ > sent_) len = fds_at_ - sent_;  // fds ride on fds_at_
      iov.iov_base = out_.data() + sent_;
      iov.iov_len = len;
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (with_fds) {
        const size_t fd_bytes = sizeof(int) * fds_to_pass_.size();
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(fd_bytes);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(fd_bytes);
        std::memcpy(CMSG_DATA(c), fds_to_pass_.data(), fd_bytes);
      }
      const ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        if (with_fds) drop_fds();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!write_waiting_) {
          write_waiting_ = true;
          socket_.async_wait(Local::socket::wait_write,
                             [self = shared_from_this()](const boost::system::error_code& ec) {
                               self->write_waiting_ = false;
                               if (ec || self->closed_) return;
                               self->flush();
                             });
        }
        return;
      }
      return close(n < 0 ? "send: " + std::string(std::strerror(errno)) : "send returned 0");
    }
    if (closed_) return;
    out_.clear();
    sent_ = 0;
    fds_at_ = 0;
    if (out_.capacity() > kKeptOutputBytes) {
      // A large reply's buffer goes back; the next reply allocates what it needs.
      std::vector<std::byte>().swap(out_);
      account();
      if (closed_) return;
    }
    if (close_after_flush_) return close(close_reason_);
    if (reading_paused_) {
      // The backlog is gone: the requests waiting in the input buffer come first, then reads.
      reading_paused_ = false;
      asio::post(server_.io_, [self = shared_from_this()] { self->serve(0); });
    }
    // A subscriber that took everything may have more events waiting; the pump runs from the
    // loop rather than from here so that a fast reader cannot recurse.
    if (subscribed_ && !pump_posted_ &&
        session_->subscription->cursor < server_.service_.events().next_seq()) {
      pump_posted_ = true;
      asio::post(server_.io_, [self = shared_from_this()] { self->pump_events(); });
    }
  }

  static constexpr size_t kReadChunk = size_t{64} * 1024;
  static constexpr size_t kIdleReadBytes = size_t{4} * 1024;
  static constexpr size_t kKeptOutputBytes = size_t{1} << 20;
  static constexpr size_t kMaxSubscriberBacklogBytes = size_t{256} * 1024;
  static constexpr size_t kEventsPerFrame = 256;

  Server& server_;
  Local::socket socket_;
  std::unique_ptr<SessionState> session_;
  asio::steady_timer frame_timer_;
  asio::steady_timer hello_timer_;

  std::vector<std::byte> in_;
  size_t in_len_ = 0;
  size_t frame_end_ = 0;  // bytes the incomplete frame at the front needs in all; 0 = unknown
  std::vector<std::byte> out_;
  size_t sent_ = 0;
  uint64_t accounted_ = 0;  // buffer bytes as last told to the server (account())
  // Our copies of the pool's descriptors (≤ kMaxSegments), sent once, with the byte at fds_at_,
  // then closed.
  std::vector<int> fds_to_pass_;

 public:
  ~Connection() { drop_fds(); }

 private:
  void drop_fds() {
    for (const int fd : fds_to_pass_)
      ::close(fd);
    fds_to_pass_.clear();
  }
  size_t fds_at_ = 0;

  bool closed_ = false;
  bool close_after_flush_ = false;
  std::string close_reason_;
  bool reading_ = false;         // an async_read_some is outstanding
  bool reading_paused_ = false;  // backpressure: serve() again once the backlog is sent
  bool write_waiting_ = false;
  bool timer_active_ = false;
  uint64_t timer_generation_ = 0;  // a timer firing for an older generation is stale
  bool hello_done_ = false;        // attached: the hello deadline no longer applies
  bool copy_in_flight_ = false;    // a CopyJob of this session is with the CopyWorker
  uint64_t copy_arrival_ = 0;

  // Operations, metrics and events.
  bool subscribed_ = false;
  bool pump_posted_ = false;
  wire::EventBatch batch_;  // reused for every event frame
};

}  // namespace kvpool::daemon

// Connection and the pool_changed notice, against a scripted daemon on a Unix socket (no
// kvpoold): a notice read on the way to a reply makes the call sync the mapping before it
// returns; a notice that arrives after a reply waits in the buffer for poll_notices(); a reply
// naming a page past the mapped pool syncs without a notice; Memory::none sessions only follow
// the PoolInfo.

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/connection/connection.h"
#include "common/device/memfd_vmm.h"
#include "common/device/vmm.h"

namespace kvpool::client {
namespace {

constexpr uint64_t kStride = 4096;
constexpr uint64_t kSegPages = 4;
constexpr uint64_t kSeg = kSegPages * kStride;
constexpr uint32_t kMaxPages = 16;
constexpr uint64_t kReserved = kMaxPages * kStride;

bool read_all(int fd, void* dst, size_t n) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void send_with_fds(int fd, const std::vector<std::byte>& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  const ssize_t sent = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  ASSERT_EQ(sent, static_cast<ssize_t>(bytes.size()));
}

// A daemon of one session: answers hello and segments with the pool it is given (and its fds),
// alloc with the pages it is told to hand out, each preceded or followed by a notice when told.
class ScriptedDaemon {
 public:
  ScriptedDaemon()
      : api_(std::make_shared<device::MemfdVmm>(device::MemfdVmm::system_page_size())) {
    char dir[] = "/tmp/kvpool-notice-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/kvpool.sock";
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listen_, 1), 0);
    grow();
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedDaemon() {
    ::shutdown(listen_, SHUT_RDWR);
    {
      std::lock_guard lock(mu_);
      if (conn_ >= 0) ::shutdown(conn_, SHUT_RDWR);
    }
    thread_.join();
    ::close(listen_);
    if (conn_ >= 0) ::close(conn_);
    for (int fd : fds_)
      ::close(fd);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

  // One more segment after the last / the last one less; each increments the epoch.
  void grow() {
    std::lock_guard lock(mu_);
    auto h = api_->create(kSeg);
    ASSERT_TRUE(h.ok()) << h.error().message;
    auto fd = api_->export_fd(h.value());
    ASSERT_TRUE(fd.ok()) << fd.error().message;
    api_->release(h.value());
    fds_.push_back(fd.value());
    if (fds_.size() > 1) ++epoch_;  // the first is the pool as created
  }
  void shrink() {
    std::lock_guard lock(mu_);
    ::close(fds_.back());
    fds_.pop_back();
    ++epoch_;
  }
  uint32_t epoch() const {
    std::lock_guard lock(mu_);
    return epoch_;
  }
  // Pushes a notice of the current epoch now.
  void notify() {
    std::lock_guard lock(mu_);
    std::vector<std::byte> out;
    wire::encode_pool_changed(epoch_, out);
    send_with_fds(conn_, out, {});
  }
  void hand_out(std::vector<PageId> pages, bool notice_before, bool notice_after) {
    std::lock_guard lock(mu_);
    pages_ = std::move(pages);
    notice_before_ = notice_before;
    notice_after_ = notice_after;
  }
  int segments_requests() const { return segments_requests_.load(); }

 private:
  wire::PoolInfo pool_locked() const {
    wire::PoolInfo p;
    p.geometry = Geometry{1, 1, 8, 4, KvDtype::fp16};
    p.pool_name = "elastic";
    p.backend = "fake-device";
    p.tenant = "tenant-a";
    p.page_stride = kStride;
    p.reserved_bytes = kReserved;
    p.scales_offset = kReserved;
    p.max_pages = kMaxPages;
    p.epoch = epoch_;
    for (size_t i = 0; i < fds_.size(); ++i)
      p.segments.push_back(wire::SegmentInfo{kSeg, {}, i * kSeg});
    p.segment_bytes = fds_.size() * kSeg;
    p.num_pages = static_cast<uint32_t>(fds_.size() * kSegPages);
    return p;
  }

  void serve() {
    const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    {
      std::lock_guard lock(mu_);
      conn_ = c;
    }
    for (;;) {
      std::vector<std::byte> head(wire::kHeaderBytes);
      if (!read_all(c, head.data(), head.size())) return;
      auto h = wire::decode_header(head);
      ASSERT_TRUE(h.ok());
      std::vector<std::byte> payload(h.value().length);
      if (!read_all(c, payload.data(), payload.size())) return;
      auto req = wire::decode_request(h.value(), payload);
      ASSERT_TRUE(req.ok()) << req.error().message;
      const uint32_t id = h.value().request_id;
      std::lock_guard lock(mu_);
      std::vector<std::byte> out;
      if (std::holds_alternative<wire::HelloRequest>(req.value())) {
        wire::encode_reply(id, wire::HelloReply{1, pool_locked()}, out);
        send_with_fds(c, out, fds_);
      } else if (std::holds_alternative<wire::SegmentsRequest>(req.value())) {
        ++segments_requests_;
        wire::PoolInfo p = pool_locked();
        p.tenant = "not the session's";  // the client keeps what hello said
        wire::encode_reply(id, wire::SegmentsReply{p}, out);
        send_with_fds(c, out, fds_);
      } else if (std::holds_alternative<wire::AllocRequest>(req.value())) {
        if (notice_before_) wire::encode_pool_changed(epoch_, out);
        wire::encode_reply(id, wire::AllocReply{pages_}, out);
        if (notice_after_) wire::encode_pool_changed(epoch_, out);
        send_with_fds(c, out, {});  // notices and reply in one write: one recvmsg may take all
      } else {
        wire::encode_reply(id, wire::StatsReply{}, out);
        send_with_fds(c, out, {});
      }
    }
  }

  std::shared_ptr<device::MemfdVmm> api_;
  std::string dir_;
  std::string path_;
  int listen_ = -1;
  int conn_ = -1;
  std::thread thread_;
  mutable std::mutex mu_;
  std::vector<int> fds_;
  uint32_t epoch_ = 7;
  std::vector<PageId> pages_;
  bool notice_before_ = false;
  bool notice_after_ = false;
  std::atomic<int> segments_requests_{0};
};

TEST(ConnectionNotices, NoticeBeforeAReplySyncsBeforeTheCallReturns) {
  ScriptedDaemon d;
  auto c = Connection::attach(d.path(), "w");
  ASSERT_TRUE(c.ok()) << c.error().message;
  Connection& conn = *c.value();
  EXPECT_EQ(conn.num_pages(), kSegPages);
  EXPECT_EQ(conn.pool().epoch, 7u);
  std::byte* const base = conn.base();
  std::memset(conn.page(0), 0x11, kStride);

  d.grow();
  d.hand_out({kSegPages}, /*notice_before=*/true, /*notice_after=*/false);
  auto pages = conn.alloc(1);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  EXPECT_EQ(d.segments_requests(), 1);
  EXPECT_EQ(conn.num_pages(), 2 * kSegPages);
  EXPECT_EQ(conn.bytes(), 2 * kSeg);
  EXPECT_EQ(conn.pool().epoch, d.epoch());
  EXPECT_EQ(conn.pool().tenant, "tenant-a");
  EXPECT_EQ(conn.base(), base);
  std::memset(conn.page(pages.value()[0]), 0x22, kStride);  // mapped: no fault
  EXPECT_EQ(*conn.page(0), std::byte{0x11});

  // Nothing waiting: poll_notices changes nothing and asks nothing.
  auto polled = conn.poll_notices();
  ASSERT_TRUE(polled.ok()) << polled.error().message;
  EXPECT_FALSE(polled.value());
  EXPECT_EQ(d.segments_requests(), 1);
}

TEST(ConnectionNotices, NoticeAfterAReplyWaitsForPollNotices) {
  ScriptedDaemon d;
  auto c = Connection::attach(d.path(), "w");
  ASSERT_TRUE(c.ok()) << c.error().message;
  Connection& conn = *c.value();
  d.grow();
  // The reply hands out page 0 (mapped already); the notice comes right behind it, in the same
  // write, so the client's read takes both: the notice must stay buffered, not be lost.
  d.hand_out({0}, /*notice_before=*/false, /*notice_after=*/true);
  ASSERT_TRUE(conn.alloc(1).ok());
  // The call does not wait for bytes after its reply; whether it saw the notice depends on the
  // read. Either way poll_notices() leaves the mapping at the daemon's epoch.
  auto polled = conn.poll_notices();
  ASSERT_TRUE(polled.ok()) << polled.error().message;
  EXPECT_EQ(conn.pool().epoch, d.epoch());
  EXPECT_EQ(conn.num_pages(), 2 * kSegPages);
  std::memset(conn.page(2 * kSegPages - 1), 0x33, kStride);

  // A shrink announced while idle: poll_notices() unmaps it and says so.
  d.shrink();
  d.notify();
  polled = conn.poll_notices();
  ASSERT_TRUE(polled.ok()) << polled.error().message;
  EXPECT_TRUE(polled.value());
  EXPECT_EQ(conn.num_pages(), kSegPages);
  EXPECT_EQ(conn.pool().epoch, d.epoch());
  // The stream is in step: a call still works.
  EXPECT_TRUE(conn.stats().ok());
}

TEST(ConnectionNotices, APagePastThePoolSyncsWithoutANotice) {
  ScriptedDaemon d;
  auto c = Connection::attach(d.path(), "w");
  ASSERT_TRUE(c.ok()) << c.error().message;
  Connection& conn = *c.value();
  d.grow();
  d.hand_out({kSegPages + 1}, false, false);
  auto pages = conn.alloc(1);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  EXPECT_EQ(d.segments_requests(), 1);
  EXPECT_EQ(conn.num_pages(), 2 * kSegPages);
  std::memset(conn.page(pages.value()[0]), 0x44, kStride);

  // A page the daemon's own segment list does not cover either is an error, not a crash.
  d.hand_out({kMaxPages}, false, false);
  auto bad = conn.alloc(1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("beyond the pool"), std::string::npos) << bad.error().message;
}

TEST(ConnectionNotices, SessionsWithoutMemoryFollowThePoolInfo) {
  ScriptedDaemon d;
  auto c = Connection::attach(d.path(), "ctl", "", Connection::Memory::none);
  ASSERT_TRUE(c.ok()) << c.error().message;
  Connection& conn = *c.value();
  EXPECT_EQ(conn.base(), nullptr);
  d.grow();
  d.notify();
  auto polled = conn.poll_notices();
  ASSERT_TRUE(polled.ok()) << polled.error().message;
  EXPECT_TRUE(polled.value());
  EXPECT_EQ(conn.num_pages(), 2 * kSegPages);
  EXPECT_EQ(conn.base(), nullptr);

  auto seg = conn.segments();
  ASSERT_TRUE(seg.ok()) << seg.error().message;
  EXPECT_EQ(seg.value().segments.size(), 2u);
  EXPECT_EQ(seg.value().epoch, d.epoch());
}

}  // namespace
}  // namespace kvpool::client

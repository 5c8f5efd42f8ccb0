#include "daemon/server/server.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/server/server_connection.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// True when something accepts connections on `path` (another daemon is running there).
bool socket_answers(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

Server::Server(asio::io_context& io, Service& service, std::chrono::milliseconds frame_timeout)
    : io_(io),
      service_(service),
      frame_timeout_(frame_timeout),
      acceptor_(io),
      accept_backoff_(io),
      copy_worker_(io),
      remote_fetch_worker_(io, CopyWorker::kFetchNice),
      remote_store_worker_(io, CopyWorker::kStoreNice) {}

Server::~Server() {
  stop();
}

wire::Result<bool> Server::listen(const std::string& path, uint32_t mode,
                                  const std::string& group) {
  auto fail = [&](const std::string& what) {
    return wire::Error{Status(Errc::internal), "socket " + path + ": " + what};
  };
  if (path.size() >= sizeof(sockaddr_un::sun_path)) return fail("path is too long");
  std::error_code fec;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::exists(dir, fec)) {
    std::filesystem::create_directories(dir, fec);
    if (fec) return fail("cannot create directory " + dir.string() + ": " + fec.message());
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return fail("exists and is not a socket");
    if (socket_answers(path)) return fail("another kvpoold is listening there");
    ::unlink(path.c_str());
  }
  gid_t gid = static_cast<gid_t>(-1);
  if (!group.empty()) {
    const struct group* g = ::getgrnam(group.c_str());
    if (g == nullptr) return fail("group " + group + " does not exist");
    gid = g->gr_gid;
  }
  boost::system::error_code ec;
  acceptor_.open(Local(), ec);
  if (ec) return fail("socket: " + ec.message());
  const mode_t old_mask = ::umask(0177);  // born 0600, widened below: never briefly too open
  acceptor_.bind(Local::endpoint(path), ec);
  ::umask(old_mask);
  if (ec) return fail("bind: " + ec.message());
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0)
    return fail("chmod: " + std::string(std::strerror(errno)));
  if (gid != static_cast<gid_t>(-1) && ::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return fail("chown to group " + group + ": " + std::string(std::strerror(errno)));
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen: " + ec.message());
  acceptor_.non_blocking(true, ec);  // accept_with_reserve's accept must not wait
  if (ec) return fail("non-blocking: " + ec.message());
  reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  path_ = path;
  accept();
  return true;
}

void Server::accept() {
  acceptor_.async_accept([this](const boost::system::error_code& ec, Local::socket socket) {
    if (stopping_) return;
    if (ec == asio::error::operation_aborted) return;
    if (ec && !accept_with_reserve(ec)) {
      // Out of descriptors (EMFILE/ENFILE) or memory: the pending connection stays queued and
      // accept would fail again at once. Wait a little instead of spinning, and say so once per
      // wait rather than per attempt.
      log_event(LogLevel::warn, "accept_failed",
                {kv("error", ec.message()), kv("retry_ms", kAcceptBackoff.count())});
      accept_backoff_.expires_after(kAcceptBackoff);
      accept_backoff_.async_wait([this](const boost::system::error_code& wait_ec) {
        if (!wait_ec && !stopping_) accept();
      });
      return;
    }
    if (!ec) serve(std::move(socket));
    if (reserve_fd_ < 0) reserve_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    accept();
  });
}

bool Server::accept_with_reserve(const boost::system::error_code& ec) {
  if (ec != asio::error::no_descriptors && ec.value() != ENFILE) return false;
  if (reserve_fd_ < 0) return false;
  // Something else took every descriptor (a flood on another endpoint, say): spend the one held
  // in reserve on the worker waiting, rather than leave workers unserved until it passes.
  ::close(reserve_fd_);
  reserve_fd_ = -1;
  boost::system::error_code accept_ec;
  Local::socket socket(io_);
  acceptor_.accept(socket, accept_ec);  // non-blocking: fails if the connection went away
  log_event(LogLevel::warn, "accept_from_reserve",
            {kv("error", ec.message()), kv("accepted", !accept_ec)});
  if (accept_ec) return false;
  serve(std::move(socket));
  return true;
}

void Server::serve(Local::socket socket) {
  ucred cred{};
  socklen_t len = sizeof cred;
  PeerCredentials peer;
  if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer = PeerCredentials{cred.pid, cred.uid, cred.gid};
  }
  auto session = service_.open_session(peer);
  if (!session.ok()) {
    // Refused: say why in an error frame, then close.
    std::vector<std::byte> out;
    wire::encode_error(0, static_cast<uint16_t>(wire::Opcode::hello), session.error(), out);
    (void)::send(socket.native_handle(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ++service_.connection_stats().sessions_refused;
    log_event(LogLevel::warn, "session_refused",
              {kv("pid", peer.pid), kv("uid", peer.uid), kv("error", session.error().message)});
    return;
  }
  log_event(LogLevel::debug, "session_open",
            {kv("session", session.value()->id), kv("pid", peer.pid), kv("uid", peer.uid)});
  auto c = std::make_shared<Connection>(*this, std::move(socket), std::move(session.value()));
  connections_.insert(c);
  c->start();
  if (activity_ != nullptr) activity_->on_activity();
}

void Server::closed(const std::shared_ptr<Connection>& c) {
  connections_.erase(c);
  publish_kv_events();
  if (activity_ != nullptr) activity_->on_activity();
}

void Server::pump_subscribers() {
  if (!subscribers_.empty() && service_.events().next_seq() != pumped_seq_) {
    pumped_seq_ = service_.events().next_seq();
    // Pumping may close a subscriber (a failed send), which edits the set: walk a copy.
    std::vector<std::shared_ptr<Connection>> subscribers;
    subscribers.reserve(subscribers_.size());
    for (Connection* c : subscribers_)
      subscribers.push_back(c->shared_from_this());
    for (const auto& c : subscribers)
      c->pump_events();
  }
}

void Server::notify_pool_changes() {
  if (!service_.take_pool_change()) return;
  // Sending may close a connection, which edits the set: walk a copy.
  const std::vector<std::shared_ptr<Connection>> all(connections_.begin(), connections_.end());
  for (const auto& c : all)
    c->notify_pool_change();
}

void Server::start_background_jobs() {
  if (stopping_) return;
  while (auto job = service_.take_background_job()) {
    worker_for(*job).submit(std::move(job), [this](std::unique_ptr<CopyJob> done) {
      if (stopping_) return;
      service_.finish_background(*done);
      notify_pool_changes();
      publish_kv_events();
      if (activity_ != nullptr) activity_->on_activity();
      start_background_jobs();
    });
  }
}

void Server::publish_kv_events() {
  if (kv_publisher_ == nullptr) return;
  for (const auto& pool : service_.pools())
    kv_publisher_->publish(pool->name(), pool->kv_format(), pool->take_kv_events());
}

void Server::enforce_buffer_budget() {
  const uint64_t budget = service_.config().max_buffered_bytes;
  const uint64_t& buffered = service_.connection_stats().buffered_bytes;
  while (buffered > budget && !connections_.empty()) {
    const auto largest = std::max_element(
        connections_.begin(), connections_.end(),
        [](const auto& a, const auto& b) { return a->accounted() < b->accounted(); });
    const std::shared_ptr<Connection> c = *largest;  // close() may erase it from the set
    if (c->accounted() == 0) break;
    log_event(
        LogLevel::warn, "buffer_budget_exceeded",
        {kv("buffered_bytes", buffered), kv("limit", budget), kv("closing_bytes", c->accounted())});
    ++service_.connection_stats().closed_by_limits;
    c->close("its buffers (" + std::to_string(c->accounted()) +
             " bytes) were the largest when all connections passed limits.max_buffered_bytes (" +
             std::to_string(budget) + " bytes)");
  }
}

void Server::stop() {
  if (stopping_) return;
  stopping_ = true;
  activity_ = nullptr;  // whoever set it may be gone by now
  kv_publisher_ = nullptr;
  boost::system::error_code ignored;
  acceptor_.close(ignored);
  accept_backoff_.cancel();
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
  // A running copy finishes first: the pools' memory must not be released under it.
  copy_worker_.stop();
  remote_fetch_worker_.stop();
  remote_store_worker_.stop();
  const std::vector<std::shared_ptr<Connection>> all(connections_.begin(), connections_.end());
  for (const auto& c : all)
    c->abandon_copy();
  while (!connections_.empty())
    (*connections_.begin())->close("daemon stopping");
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace kvpool::daemon

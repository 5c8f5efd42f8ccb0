#include "daemon/telemetry/metrics_http.h"

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "common/prometheus.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// Everything the endpoint's thread owns.
struct MetricsHttp::State {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  Render render;
  std::thread thread;
  std::vector<std::weak_ptr<Session>> sessions;
  int active = 0;
  bool accepting = false;
  bool stopping = false;

  void accept();
  void session_ended();
  // Closes the connection that has waited longest for a request; false when every one is busy
  // writing a response.
  bool close_longest_waiting();
};

class MetricsHttp::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(State& state, tcp::socket socket) : state_(state), stream_(std::move(socket)) {}
  ~Session() { state_.session_ended(); }

  void start() { read_request(); }
  void close() {
    waiting_ = false;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }
  // Waiting for a request (not writing a response), and since when.
  bool waiting() const { return waiting_; }
  std::chrono::steady_clock::time_point waiting_since() const { return waiting_since_; }

 private:
  void read_request() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kMaxHeaderBytes));
    parser_->body_limit(0);
    waiting_ = true;
    waiting_since_ = std::chrono::steady_clock::now();
    // A kept-alive connection that has nothing more to ask goes soon; a new one gets the time a
    // slow network needs for its first request.
    stream_.expires_after(served_ == 0 ? std::chrono::seconds(kTimeout) : kIdleTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    waiting_ = false;
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || state_.stopping) {
      return close();
    }
    if (ec) {
      // The request is malformed or too large; answer once and close.
      const bool too_large = ec == http::error::header_limit;
      respond(too_large ? http::status::request_header_fields_too_large : http::status::bad_request,
              std::string(too_large ? "request header too large" : "bad request") + ": " +
                  ec.message() + "\n",
              /*keep_alive=*/false, /*head=*/false);
      return;
    }
    const auto& req = parser_->get();
    const bool keep = req.keep_alive() && ++served_ < kMaxRequestsPerConnection;
    const beast::string_view target = req.target();
    if (target != "/metrics" && target.substr(0, 9) != "/metrics?") {
      return respond(http::status::not_found, "not found: kvpoold serves /metrics\n", keep, false);
    }
    const bool head = req.method() == http::verb::head;
    if (req.method() != http::verb::get && !head) {
      return respond(http::status::method_not_allowed, "use GET or HEAD\n", keep, false);
    }
    std::optional<std::string> body = state_.render();
    if (!body) {
      return respond(http::status::service_unavailable, "no stats snapshot yet\n", keep, head);
    }
    respond(http::status::ok, std::move(*body), keep, head, stats::kPrometheusContentType);
  }

  void respond(http::status status, std::string body, bool keep_alive, bool head,
               std::string_view content_type = "text/plain; charset=utf-8") {
    response_.emplace(status, 11);
    response_->set(http::field::server, "kvpoold");
    response_->set(http::field::content_type,
                   beast::string_view(content_type.data(), content_type.size()));
    if (status == http::status::method_not_allowed) response_->set(http::field::allow, "GET, HEAD");
    response_->keep_alive(keep_alive);
    response_->body() = std::move(body);
    response_->prepare_payload();
    if (head) response_->body().clear();  // Content-Length stays that of the GET body
    stream_.expires_after(kTimeout);
    http::async_write(stream_, *response_,
                      [self = shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        if (ec || !keep_alive || self->state_.stopping) return self->close();
                        self->read_request();
                      });
  }

  State& state_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_{kMaxHeaderBytes + 1024};  // bounded: the header limit and a little
  std::optional<http::request_parser<http::empty_body>> parser_;
  std::optional<http::response<http::string_body>> response_;
  int served_ = 0;
  bool waiting_ = false;
  std::chrono::steady_clock::time_point waiting_since_{};
};

bool MetricsHttp::State::close_longest_waiting() {
  std::shared_ptr<Session> oldest;
  for (const auto& w : sessions) {
    auto session = w.lock();
    if (session && session->waiting() &&
        (!oldest || session->waiting_since() < oldest->waiting_since())) {
      oldest = std::move(session);
    }
  }
  if (!oldest) return false;
  oldest->close();  // its read ends with operation_aborted and the session goes
  return true;
}

void MetricsHttp::State::accept() {
  if (stopping) {
    accepting = false;
    return;
  }
  accepting = true;
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    accepting = false;
    if (stopping || ec == asio::error::operation_aborted) return;
    if (!ec && active >= kMaxConnections && !close_longest_waiting()) {
      // Every connection is writing a response: this one is turned away rather than queued.
      beast::error_code ignored;
      socket.close(ignored);
    } else if (!ec) {
      ++active;
      auto s = std::make_shared<Session>(*this, std::move(socket));
      std::erase_if(sessions, [](const std::weak_ptr<Session>& w) { return w.expired(); });
      sessions.push_back(s);
      s->start();
    } else {
      log_event(LogLevel::warn, "metrics_accept_failed", {kv("error", ec.message())});
    }
    accept();
  });
}

void MetricsHttp::State::session_ended() {
  --active;
}

MetricsHttp::MetricsHttp(std::unique_ptr<State> state) : state_(std::move(state)) {}

wire::Result<std::unique_ptr<MetricsHttp>> MetricsHttp::start(const ListenAddress& address,
                                                              Render render) {
  const std::string where = address.v6 ? "[" + address.host + "]:" + std::to_string(address.port)
                                       : address.host + ":" + std::to_string(address.port);
  auto fail = [&](const char* step, const beast::error_code& ec) {
    return wire::Error{Status(Errc::internal),
                       "metrics.listen " + where + ": " + step + ": " + ec.message()};
  };
  auto state = std::make_unique<State>();
  state->render = std::move(render);
  beast::error_code ec;
  const auto ip = asio::ip::make_address(address.host, ec);
  if (ec) return fail("address", ec);
  const tcp::endpoint endpoint(ip, address.port);
  state->acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("socket", ec);
  state->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  state->acceptor.bind(endpoint, ec);
  if (ec) return fail("bind", ec);
  state->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen", ec);
  const tcp::endpoint local = state->acceptor.local_endpoint(ec);
  std::unique_ptr<MetricsHttp> m(new MetricsHttp(std::move(state)));
  m->bound_ = address.v6 ? "[" + address.host + "]:" + std::to_string(local.port())
                         : address.host + ":" + std::to_string(local.port());
  State& s = *m->state_;
  s.accept();
  s.thread = std::thread([&s] { s.io.run(); });
  return m;
}

MetricsHttp::~MetricsHttp() {
  State& s = *state_;
  // Close everything from the endpoint's own thread; run() returns once the last handler ran.
  asio::post(s.io, [&s] {
    s.stopping = true;
    beast::error_code ignored;
    s.acceptor.close(ignored);
    for (const auto& w : s.sessions) {
      if (auto session = w.lock()) session->close();
    }
  });
  if (s.thread.joinable()) s.thread.join();
}

}  // namespace kvpool::daemon

// libFuzzer target: one client's byte stream through kvpoold's framing and Service dispatch.
//
// Why: the wire decoder and Service::handle are what every local process can reach with
// arbitrary bytes, and the daemon is shared by every tenant of the machine. This target drives
// both with exactly what a client could write on its connection, without sockets, and checks the
// pool's books afterwards.
//
// The input is cut into frames as Server::Connection::process_frames does: decode_header on the
// next 16 bytes (a bad header is answered and ends the stream, since it cannot be
// resynchronised), then decode_request on exactly header.length payload bytes (a payload that
// does not decode is answered and the stream goes on), until a subscribe turns the connection
// into an event stream that takes no more requests (the events it may see are then collected as
// the server pumps them), or the bytes run out (an incomplete last frame is what the frame
// timeout closes). Every decoded request goes to a real Service: the host backend with two small
// pools of tiny geometries, a tenant limited to one pool, quotas, an admin group and a trivial
// reload handler. The Service is kept from one input to the next and built afresh whenever an
// input changed anything a session can observe (see service()), so every input starts from the
// same state and a crash reproduces on its own.
//
// The session's credentials come from the low two bits of the first frame's request id (the
// corpus picks them in its hello): 0 root (admin), 1 uid 1000 (tenant "alpha", pool "default"
// only), 2 uid 2000 (the default tenant, not an admin), 3 uid 3000 gid 0 (admin through
// admin_group "root").
//
// Checked on every input, aborting (a libFuzzer crash) on the first violation:
//   - a request that decodes re-encodes to the very bytes it came from and decodes again to an
//     equal request;
//   - every frame the daemon would send (replies, error replies, event batches) decodes as a
//     client decodes it and re-encodes to the same bytes; descriptors go with hello replies only;
//   - once the session is closed no session is open, no page is in use and
//     PagePool::check_invariants() is empty.
// KVPOOL_FUZZ_TRACE=1 in the environment prints each frame the daemon sends.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/memory/host_backend.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace {

using namespace kvpool;
using namespace kvpool::daemon;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "frame_fuzz: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// KVPOOL_FUZZ_TRACE: print every frame the daemon sends (opcode and status), to see what a seed
// or a crashing input does.
const bool trace = std::getenv("KVPOOL_FUZZ_TRACE") != nullptr;

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

Config fuzz_config() {
  Config c = default_config();
  c.backend = "host";
  c.max_sessions = 8;
  // The tenant limit below the session's, so that one session can reach both.
  c.max_pages_per_session = 48;
  c.max_pages_per_tenant = 40;
  c.admin_group = "root";
  c.log_level = "error";
  c.events.ring_events = 64;
  // An 8-bit pool (its copies move scales too) and a 16-bit one; 128- and 64-byte pages.
  PoolConfig small;
  small.name = "default";
  small.geometry = Geometry{1, 1, 16, 4, KvDtype::int8};
  small.capacity = Capacity{Capacity::Unit::pages, 64, 0.0};
  PoolConfig other;
  other.name = "bf16";
  other.geometry = Geometry{1, 2, 4, 2, KvDtype::bf16};
  other.capacity = Capacity{Capacity::Unit::pages, 16, 0.0};
  c.pools = {small, other};
  TenantConfig alpha;
  alpha.name = "alpha";
  alpha.uids = {1000};
  alpha.pools = {"default"};
  c.tenants = {alpha};
  c.default_tenant = "default";
  return c;
}

std::unique_ptr<Service> make_service() {
  auto created = Service::create(fuzz_config(), std::make_unique<HostBackend>());
  if (!created.ok()) fail("Service::create: " + created.error().message);
  Service* s = created.value().get();
  // What a reload does to a running daemon, without a file: the same config again.
  s->set_reload_handler([s] {
    const Config same = s->config();
    wire::ReloadReply r;
    r.message = "<fuzz>";
    r.restart = s->apply_live(same);
    return r;
  });
  return std::move(created.value());
}

// What a session can observe of the Service beyond session and owner ids and the clock: the
// pools' counters and page states, and the event sequence. Equal fingerprints = same behaviour.
std::vector<uint64_t> fingerprint(const Service& svc) {
  std::vector<uint64_t> f = {svc.events().next_seq(), svc.session_count()};
  for (const auto& pool : svc.pools()) {
    const core::PoolStats st = pool->pages().stats();
    const core::PoolCounters& c = st.counters;
    f.insert(f.end(),
             {st.free, st.in_use, st.cached, st.owners, c.lookups, c.lookup_blocks, c.hit_blocks,
              c.allocated, c.released, c.published, c.duplicates, c.evicted, c.flushed});
  }
  return f;
}

// The Service for the next input: a fresh one whenever the last input changed what a session
// can observe (pages handed out, cached or published, counters, events), so every input runs
// against the same state and a crash reproduces on its own; otherwise the same one, which keeps
// the inputs that never get that far (most mutations) cheap. Building one costs more than most
// inputs (the shared-memory segment, the latency tables).
Service& service() {
  static std::unique_ptr<Service> svc;
  static std::vector<uint64_t> fresh;
  if (!svc || fingerprint(*svc) != fresh) {
    svc.reset();
    svc = make_service();
    fresh = fingerprint(*svc);
  }
  return *svc;
}

constexpr PeerCredentials kPeers[4] = {
    {0, 0, 0},        // root
    {0, 1000, 1000},  // tenant alpha
    {0, 2000, 2000},  // the default tenant
    {0, 3000, 0},     // admin through admin_group (gid 0 = root)
};

// Checks the frames the daemon wrote to `out` as a client reads them, then empties it.
void check_sent(std::vector<std::byte>& out) {
  const std::span<const std::byte> all(out);
  size_t pos = 0;
  std::vector<std::byte> again;
  while (pos < all.size()) {
    const auto header = wire::decode_header(all.subspan(pos));
    if (!header.ok()) fail("a frame the daemon sent: " + header.error().message);
    const wire::FrameHeader& h = header.value();
    if (all.size() - pos - wire::kHeaderBytes < h.length) fail("a sent frame is cut short");
    const auto frame = all.subspan(pos, wire::kHeaderBytes + h.length);
    const auto payload = frame.subspan(wire::kHeaderBytes);
    again.clear();
    constexpr auto kEventBatch =
        static_cast<uint16_t>(static_cast<uint16_t>(wire::Opcode::event_batch) | wire::kReplyBit);
    // An event batch carries status ok; an error answering a request of opcode event_batch
    // (which is not a request) has the same frame opcode and reads as any error reply.
    uint16_t status = 0;
    if (payload.size() >= sizeof status) std::memcpy(&status, payload.data(), sizeof status);
    if (h.opcode == kEventBatch && status == static_cast<uint16_t>(Errc::ok)) {
      const auto batch = wire::decode_event_batch(h, payload);
      if (!batch.ok()) fail("an event batch the daemon sent: " + batch.error().message);
      wire::encode_event_batch(h.request_id, batch.value(), again);
    } else {
      const auto reply = wire::decode_reply(h, payload);
      if (reply.ok()) {
        wire::encode_reply(h.request_id, reply.value(), again);
      } else {
        wire::encode_error(h.request_id, h.opcode, reply.error(), again);
      }
    }
    if (trace) {
      std::fprintf(stderr, "frame_fuzz: sent %s reply %s\n",
                   std::string(wire::opcode_name(h.opcode & ~wire::kReplyBit)).c_str(),
                   std::string(errc_name(static_cast<Errc>(status))).c_str());
    }
    if (!same_bytes(again, frame)) {
      fail("a frame the daemon sent (opcode " + std::to_string(h.opcode) +
           ") does not re-encode to its own bytes");
    }
    pos += frame.size();
  }
  out.clear();
}

// A request that decoded must be exactly what encode_request writes for it.
void check_round_trip(const wire::FrameHeader& h, std::span<const std::byte> frame,
                      const wire::Request& request) {
  std::vector<std::byte> again;
  wire::encode_request(h.request_id, request, again);
  if (!same_bytes(again, frame)) {
    fail("request opcode " + std::to_string(h.opcode) + " re-encodes to other bytes");
  }
  const auto h2 = wire::decode_header(again);
  if (!h2.ok() || !(h2.value() == h)) fail("a re-encoded request's header differs");
  const auto r2 = wire::decode_request(
      h2.value(), std::span<const std::byte>(again).subspan(wire::kHeaderBytes));
  if (!r2.ok()) fail("a re-encoded request does not decode: " + r2.error().message);
  if (!(r2.value() == request)) fail("a re-encoded request decodes to another request");
}

// Everything the session held is back: nothing in use, the books consistent.
void check_closed(const Service& svc) {
  if (svc.session_count() != 0) fail("a session is still open after close");
  for (const auto& pool : svc.pools()) {
    const core::PoolStats st = pool->pages().stats();
    if (st.in_use != 0 || st.owners != 0) {
      fail("pool " + pool->name() + ": " + std::to_string(st.in_use) +
           " pages in use after the session closed");
    }
    if (std::string broken = pool->pages().check_invariants(); !broken.empty()) {
      fail("pool " + pool->name() + ": " + broken);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::error);  // the daemon's log lines would drown libFuzzer's
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Service& svc = service();
  const std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);

  PeerCredentials peer = kPeers[0];
  if (size >= wire::kHeaderBytes) {
    uint32_t first_id = 0;
    std::memcpy(&first_id, data + 12, sizeof first_id);
    peer = kPeers[first_id % 4];
  }
  auto opened = svc.open_session(peer);
  if (!opened.ok()) fail("open_session: " + opened.error().message);
  SessionState& session = *opened.value();

  std::vector<std::byte> out;
  size_t pos = 0;
  while (size - pos >= wire::kHeaderBytes) {
    const std::span<const std::byte> avail = in.subspan(pos);
    const auto header = wire::decode_header(avail);
    if (!header.ok()) {
      // Answered, then the connection closes: nothing after a bad header is read.
      const wire::FrameHeader raw = wire::read_header_fields(avail);
      wire::encode_error(raw.request_id, raw.opcode, header.error(), out);
      check_sent(out);
      break;
    }
    const wire::FrameHeader& h = header.value();
    const size_t total = wire::kHeaderBytes + h.length;
    if (avail.size() < total) break;  // incomplete: the frame timeout would close it
    const auto frame = avail.first(total);
    const auto request = wire::decode_request(h, frame.subspan(wire::kHeaderBytes));
    pos += total;
    if (!request.ok()) {
      wire::encode_error(h.request_id, h.opcode, request.error(), out);
      check_sent(out);
      continue;
    }
    check_round_trip(h, frame, request.value());
    std::span<const int> fds;
    svc.handle(session, h.request_id, request.value(), out, &fds);
    // Only the replies that describe the pool's memory (hello, segments) carry its descriptors.
    if (!fds.empty() && !std::holds_alternative<wire::HelloRequest>(request.value()) &&
        !std::holds_alternative<wire::SegmentsRequest>(request.value())) {
      fail("descriptors passed with a reply that is neither hello's nor segments'");
    }
    check_sent(out);
    if (session.subscription) break;  // an event stream from now on
  }

  if (session.subscription) {
    // What the server pumps to a subscriber: everything it may see, in frames of 256 events.
    wire::EventBatch batch;
    for (int frames = 0; frames < 64; ++frames) {
      batch.events.clear();
      svc.collect_events(session, 256, batch);
      if (batch.events.empty()) break;
      wire::encode_event_batch(session.subscription->request_id, batch, out);
      check_sent(out);
    }
  }

  svc.close_session(session);
  check_closed(svc);
  return 0;
}

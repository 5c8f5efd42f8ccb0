// The kvpool wire codec (see protocol.h for the layouts): framing (the header), the opcode tables,
// the dispatch from an opcode to its payload codec, the public encode_* and decode_* functions,
// and the payload codecs of the pool operations (opcodes 1..12, hello .. copy). Those of the
// operations, metrics and events block (opcodes 20+) are in protocol_ops.cpp; Writer, Reader and
// the error-text helpers they share are in wire_codec.h.
//
// How decoding stays safe: every read goes through Reader, which holds a pointer and the number
// of bytes left in the span it was given and refuses (returns false, recording the cause) any read
// larger than that, so nothing is ever read past the span. A batch count is checked against
// kMaxBatch and against the bytes that are actually left before a vector is sized, so a forged
// count can neither allocate nor read anything; a string length is checked against kMaxNameBytes
// and the bytes left before a string is built. Enumerations (dtype, publish result kind, status
// code) are range-checked before they are cast. A payload must be consumed exactly. Every failure
// becomes an Error whose message names the message type, the field and the numbers involved.
//
// Encoding computes the exact frame size first, grows the output once and writes into it with
// memcpy; arrays of plain little-endian integers are copied in one piece.
#include "common/protocol.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "common/protocol_ops_codec.h"
#include "common/wire_codec.h"

namespace kvpool::wire {
namespace {

using codec::cat;
using codec::Hex;
using codec::kHashBytes;
using codec::kU16;
using codec::kU32;
using codec::kU64;
using codec::kU8;
using codec::make_error;
using codec::Reader;
using codec::Writer;

// The payload codecs of opcodes 20+ (protocol_ops_codec.h) join the overload sets of those below.
using codec::body_size;
using codec::get_body;
using codec::put_body;

constexpr size_t kNumOpcodes = std::variant_size_v<Request>;
static_assert(std::variant_size_v<Reply> == kNumOpcodes);

// Variant alternative → opcode. Opcodes are wire values and need not be contiguous: 1..12 are
// the pool operations, 20.. the operations, metrics and events block.
constexpr std::array<uint16_t, kNumOpcodes> kOpcodeNumbers = {1, 2,  3,  4,  5,  6,  7,  8,
                                                              9, 10, 11, 12, 20, 21, 22, 23};
static_assert(kOpcodeNumbers[11] == static_cast<uint16_t>(Opcode::copy));
static_assert(kOpcodeNumbers[kNumOpcodes - 1] == static_cast<uint16_t>(Opcode::snapshot));

constexpr std::array<std::string_view, kNumOpcodes> kRequestNames = {
    "hello", "alloc",    "retain", "release", "lookup",   "publish", "stats",     "evict",
    "flush", "sessions", "pages",  "copy",    "prefixes", "reload",  "subscribe", "snapshot"};
constexpr std::array<std::string_view, kNumOpcodes> kReplyNames = {
    "hello reply",    "alloc reply",    "retain reply",    "release reply",
    "lookup reply",   "publish reply",  "stats reply",     "evict reply",
    "flush reply",    "sessions reply", "pages reply",     "copy reply",
    "prefixes reply", "reload reply",   "subscribe reply", "snapshot reply"};

// Wire sizes of the fixed parts.
constexpr size_t kPublishItemBytes = kU32 + kHashBytes;
constexpr size_t kPublishResultBytes = kU8 + kU32;
constexpr size_t kPoolInfoFixedBytes =
    4 * kU32 + kU8 + kU32 + 2 * kU64 + 3 * kU32 + kU32 + 16 + kU32;  // … device, uuid, n segments
constexpr size_t kSegmentFixedBytes = kU64 + kU32;
constexpr size_t kPageCopyBytes = 2 * kU32;
constexpr size_t kStatsBytes = 5 * kU32 + 9 * kU64 + kU32;
constexpr size_t kSessionFixedBytes = kU64 + 3 * kU32 + 3 * kU32;  // numbers + 3 string lengths
constexpr size_t kErrorFixedBytes = kU16 + kU32 + kU64 + kU32;     // status, item, value, length
constexpr size_t kMaxErrorMessageBytes = kMaxPayloadBytes - kErrorFixedBytes;

// Page ids and hashes are copied as whole arrays: their in-memory layout is the wire layout.
static_assert(sizeof(PageId) == kU32);
static_assert(sizeof(PageCopy) == kPageCopyBytes && offsetof(PageCopy, dst) == kU32);
static_assert(std::is_trivially_copyable_v<BlockHash> && sizeof(BlockHash) == kHashBytes &&
              offsetof(BlockHash, lo) == 0 && offsetof(BlockHash, hi) == kU64);

// A known Errc value. No default: a new code that is not listed here is a -Wswitch warning.
bool is_known_errc(uint16_t v) {
  switch (static_cast<Errc>(v)) {
    case Errc::ok:
    case Errc::invalid_argument:
    case Errc::invalid_page:
    case Errc::invalid_owner:
    case Errc::not_held:
    case Errc::out_of_pages:
    case Errc::exceeds_capacity:
    case Errc::already_published:
    case Errc::duplicate_item:
    case Errc::refcount_overflow:
    case Errc::malformed_frame:
    case Errc::unsupported_version:
    case Errc::unknown_opcode:
    case Errc::frame_too_large:
    case Errc::not_attached:
    case Errc::already_attached:
    case Errc::no_such_pool:
    case Errc::quota_exceeded:
    case Errc::permission_denied:
    case Errc::too_many_sessions:
    case Errc::connection_lost:
    case Errc::internal:
      return true;
  }
  return false;
}

// Pool operations (opcodes 1..12): sizes and writers ------------------------------------------

// Payload sizes (replies: without the status code).
size_t body_size(const HelloRequest& m) {
  return 2 * kU32 + m.worker_name.size() + m.pool_name.size();
}
size_t body_size(const AllocRequest&) {
  return kU32;
}
size_t body_size(const RetainRequest& m) {
  return kU32 + m.pages.size() * kU32;
}
size_t body_size(const ReleaseRequest& m) {
  return kU32 + m.pages.size() * kU32;
}
size_t body_size(const LookupRequest& m) {
  return kU32 + m.chain.size() * kHashBytes;
}
size_t body_size(const PublishRequest& m) {
  return kU32 + m.items.size() * kPublishItemBytes;
}
size_t body_size(const StatsRequest&) {
  return 0;
}
size_t body_size(const HelloReply& m) {
  size_t n = kU64 + kPoolInfoFixedBytes + m.pool.pool_name.size() + m.pool.backend.size() +
             m.pool.tenant.size();
  for (const SegmentInfo& seg : m.pool.segments)
    n += kSegmentFixedBytes + seg.handle.size();
  return n;
}
size_t body_size(const AllocReply& m) {
  return kU32 + m.pages.size() * kU32;
}
size_t body_size(const RetainReply&) {
  return 0;
}
size_t body_size(const ReleaseReply&) {
  return 0;
}
size_t body_size(const LookupReply& m) {
  return kU32 + m.pages.size() * kU32;
}
size_t body_size(const PublishReply& m) {
  return kU32 + m.results.size() * kPublishResultBytes;
}
size_t body_size(const StatsReply&) {
  return kStatsBytes;
}
size_t body_size(const EvictRequest&) {
  return kU32;
}
size_t body_size(const FlushRequest&) {
  return 0;
}
size_t body_size(const SessionsRequest&) {
  return 0;
}
size_t body_size(const PagesRequest&) {
  return 0;
}
size_t body_size(const CopyRequest& m) {
  return kU32 + m.pairs.size() * kPageCopyBytes;
}
size_t body_size(const CopyReply&) {
  return kU32;
}
size_t body_size(const PagesReply& m) {
  return kU32 + m.states.size();
}
size_t body_size(const EvictReply&) {
  return kU32;
}
size_t body_size(const FlushReply&) {
  return kU32;
}
size_t body_size(const SessionsReply& m) {
  size_t n = kU32;
  for (const SessionInfo& s : m.sessions) {
    n += kSessionFixedBytes + s.worker.size() + s.tenant.size() + s.pool.size();
  }
  return n;
}

void put_body(Writer& w, const HelloRequest& m) {
  w.str(m.worker_name);
  w.str(m.pool_name);
}
void put_body(Writer& w, const AllocRequest& m) {
  w.put(m.count);
}
void put_body(Writer& w, const RetainRequest& m) {
  w.array(m.pages);
}
void put_body(Writer& w, const ReleaseRequest& m) {
  w.array(m.pages);
}
void put_body(Writer& w, const LookupRequest& m) {
  w.array(m.chain);
}
void put_body(Writer& w, const PublishRequest& m) {
  w.put(static_cast<uint32_t>(m.items.size()));
  for (const PublishItem& it : m.items) {
    w.put(it.page);
    w.put(it.hash.lo);
    w.put(it.hash.hi);
  }
}
void put_body(Writer&, const StatsRequest&) {}
void put_body(Writer& w, const HelloReply& m) {
  const PoolInfo& p = m.pool;
  w.put(m.session_id);
  w.put(p.geometry.layers);
  w.put(p.geometry.kv_heads);
  w.put(p.geometry.head_dim);
  w.put(p.geometry.tokens_per_page);
  w.put(static_cast<uint8_t>(p.geometry.dtype));
  w.put(p.num_pages);
  w.put(p.page_stride);
  w.put(p.segment_bytes);
  w.str(p.pool_name);
  w.str(p.backend);
  w.str(p.tenant);
  w.put(p.device);
  w.raw(p.device_uuid.data(), p.device_uuid.size());
  w.put(static_cast<uint32_t>(p.segments.size()));
  for (const SegmentInfo& seg : p.segments) {
    w.put(seg.bytes);
    w.put(static_cast<uint32_t>(seg.handle.size()));
    w.raw(seg.handle.data(), seg.handle.size());
  }
}
void put_body(Writer& w, const AllocReply& m) {
  w.array(m.pages);
}
void put_body(Writer&, const RetainReply&) {}
void put_body(Writer&, const ReleaseReply&) {}
void put_body(Writer& w, const LookupReply& m) {
  w.array(m.pages);
}
void put_body(Writer& w, const PublishReply& m) {
  w.put(static_cast<uint32_t>(m.results.size()));
  for (const PublishResult& r : m.results) {
    w.put(static_cast<uint8_t>(r.kind));
    w.put(r.page);
  }
}
void put_body(Writer& w, const StatsReply& m) {
  w.put(m.total);
  w.put(m.free);
  w.put(m.in_use);
  w.put(m.cached);
  w.put(m.sessions);
  w.put(m.lookups);
  w.put(m.lookup_blocks);
  w.put(m.hit_blocks);
  w.put(m.allocated);
  w.put(m.released);
  w.put(m.published);
  w.put(m.duplicates);
  w.put(m.evicted);
  w.put(m.flushed);
  w.put(m.session_held_pages);
}
void put_body(Writer& w, const EvictRequest& m) {
  w.put(m.count);
}
void put_body(Writer&, const FlushRequest&) {}
void put_body(Writer&, const SessionsRequest&) {}
void put_body(Writer&, const PagesRequest&) {}
void put_body(Writer& w, const CopyRequest& m) {
  w.array(m.pairs);
}
void put_body(Writer& w, const CopyReply& m) {
  w.put(m.copied);
}
void put_body(Writer& w, const PagesReply& m) {
  w.put(static_cast<uint32_t>(m.states.size()));
  for (const uint8_t st : m.states)
    w.put(st);
}
void put_body(Writer& w, const EvictReply& m) {
  w.put(m.evicted);
}
void put_body(Writer& w, const FlushReply& m) {
  w.put(m.flushed);
}
void put_body(Writer& w, const SessionsReply& m) {
  w.put(static_cast<uint32_t>(m.sessions.size()));
  for (const SessionInfo& s : m.sessions) {
    w.put(s.id);
    w.put(s.pid);
    w.put(s.uid);
    w.put(s.held_pages);
    w.str(s.worker);
    w.str(s.tenant);
    w.str(s.pool);
  }
}

// Framing -------------------------------------------------------------------------------------

// Appends header + `payload` bytes to `out` (growing it at most once) and lets `body` write the
// payload.
template <typename Body>
void put_frame(uint32_t request_id, uint16_t opcode, size_t payload, std::vector<std::byte>& out,
               Body&& body) {
  assert(payload <= UINT32_MAX);  // the limits keep real frames far below this
  const size_t base = out.size();
  const size_t end = base + kHeaderBytes + payload;
  if (end > out.capacity()) out.reserve(std::max(end, 2 * out.capacity()));
  out.resize(end);
  Writer w(out.data() + base);
  w.put(kFrameMagic);
  w.put(static_cast<uint32_t>(payload));
  w.put(kProtocolVersion);
  w.put(opcode);
  w.put(request_id);
  std::forward<Body>(body)(w);
  assert(w.pos() == out.data() + end);
}

// Pool operations (opcodes 1..12): readers ----------------------------------------------------

bool get_body(Reader& r, HelloRequest& m) {
  return r.str(m.worker_name, "worker_name") && r.str(m.pool_name, "pool_name");
}
bool get_body(Reader& r, AllocRequest& m) {
  if (!r.get(m.count, "count")) return false;
  if (m.count > kMaxBatch) {
    return r.fail(m.count,
                  cat({r.what(), ": count ", m.count, " is above kMaxBatch (", kMaxBatch, ")"}));
  }
  return true;
}
bool get_body(Reader& r, RetainRequest& m) {
  return r.array(m.pages, "count");
}
bool get_body(Reader& r, ReleaseRequest& m) {
  return r.array(m.pages, "count");
}
bool get_body(Reader& r, LookupRequest& m) {
  return r.array(m.chain, "count");
}
bool get_body(Reader& r, PublishRequest& m) {
  uint32_t n = 0;
  if (!r.count(n, kPublishItemBytes, "count")) return false;
  const std::byte* p = r.take(size_t{n} * kPublishItemBytes, "items");
  if (p == nullptr) return false;
  m.items.resize(n);
  for (PublishItem& it : m.items) {
    std::memcpy(&it.page, p, kU32);
    std::memcpy(&it.hash.lo, p + kU32, kU64);
    std::memcpy(&it.hash.hi, p + kU32 + kU64, kU64);
    p += kPublishItemBytes;
  }
  return true;
}
bool get_body(Reader&, StatsRequest&) {
  return true;
}

bool get_body(Reader& r, HelloReply& m) {
  PoolInfo& p = m.pool;
  uint8_t dtype = 0;
  if (!(r.get(m.session_id, "session_id") && r.get(p.geometry.layers, "layers") &&
        r.get(p.geometry.kv_heads, "kv_heads") && r.get(p.geometry.head_dim, "head_dim") &&
        r.get(p.geometry.tokens_per_page, "tokens_per_page") && r.get(dtype, "dtype"))) {
    return false;
  }
  if (dtype > static_cast<uint8_t>(KvDtype::int8)) {
    return r.fail(dtype, cat({r.what(), ": dtype ", dtype, " is not a KvDtype"}));
  }
  p.geometry.dtype = static_cast<KvDtype>(dtype);
  if (!(r.get(p.num_pages, "num_pages") && r.get(p.page_stride, "page_stride") &&
        r.get(p.segment_bytes, "segment_bytes") && r.str(p.pool_name, "pool_name") &&
        r.str(p.backend, "backend") && r.str(p.tenant, "tenant") && r.get(p.device, "device"))) {
    return false;
  }
  const std::byte* uuid = r.take(p.device_uuid.size(), "device_uuid");
  if (uuid == nullptr) return false;
  std::memcpy(p.device_uuid.data(), uuid, p.device_uuid.size());
  uint32_t n = 0;
  if (!r.get(n, "segment count")) return false;
  if (n > kMaxSegments) {
    return r.fail(n,
                  cat({r.what(), ": ", n, " segments, above kMaxSegments (", kMaxSegments, ")"}));
  }
  p.segments.resize(n);
  for (SegmentInfo& seg : p.segments) {
    uint32_t len = 0;
    if (!(r.get(seg.bytes, "segment bytes") && r.get(len, "segment handle length"))) return false;
    if (len > kMaxHandleBytes) {
      return r.fail(len, cat({r.what(), ": segment handle of ", len,
                              " bytes, above kMaxHandleBytes (", kMaxHandleBytes, ")"}));
    }
    const std::byte* h = r.take(len, "segment handle");
    if (h == nullptr) return false;
    seg.handle.assign(reinterpret_cast<const uint8_t*>(h),
                      reinterpret_cast<const uint8_t*>(h) + len);
  }
  return true;
}
bool get_body(Reader& r, AllocReply& m) {
  return r.array(m.pages, "count");
}
bool get_body(Reader&, RetainReply&) {
  return true;
}
bool get_body(Reader&, ReleaseReply&) {
  return true;
}
bool get_body(Reader& r, LookupReply& m) {
  return r.array(m.pages, "hits");
}
bool get_body(Reader& r, PublishReply& m) {
  uint32_t n = 0;
  if (!r.count(n, kPublishResultBytes, "count")) return false;
  const std::byte* p = r.take(size_t{n} * kPublishResultBytes, "results");
  if (p == nullptr) return false;
  m.results.resize(n);
  for (uint32_t i = 0; i < n; ++i, p += kPublishResultBytes) {
    const auto kind = static_cast<uint8_t>(p[0]);
    if (kind > static_cast<uint8_t>(PublishResult::Kind::duplicate)) {
      return r.fail(kind,
                    cat({r.what(), ": result kind ", kind, " (item ", i,
                         ") is neither stored (0) nor duplicate (1)"}),
                    i);
    }
    m.results[i].kind = static_cast<PublishResult::Kind>(kind);
    std::memcpy(&m.results[i].page, p + kU8, kU32);
  }
  return true;
}
bool get_body(Reader& r, StatsReply& m) {
  return r.get(m.total, "total") && r.get(m.free, "free") && r.get(m.in_use, "in_use") &&
         r.get(m.cached, "cached") && r.get(m.sessions, "sessions") &&
         r.get(m.lookups, "lookups") && r.get(m.lookup_blocks, "lookup_blocks") &&
         r.get(m.hit_blocks, "hit_blocks") && r.get(m.allocated, "allocated") &&
         r.get(m.released, "released") && r.get(m.published, "published") &&
         r.get(m.duplicates, "duplicates") && r.get(m.evicted, "evicted") &&
         r.get(m.flushed, "flushed") && r.get(m.session_held_pages, "session_held_pages");
}
bool get_body(Reader& r, EvictRequest& m) {
  return r.get(m.count, "count");
}
bool get_body(Reader&, FlushRequest&) {
  return true;
}
bool get_body(Reader&, SessionsRequest&) {
  return true;
}
bool get_body(Reader&, PagesRequest&) {
  return true;
}
bool get_body(Reader& r, CopyRequest& m) {
  return r.array(m.pairs, "count");
}
bool get_body(Reader& r, CopyReply& m) {
  return r.get(m.copied, "copied");
}
bool get_body(Reader& r, PagesReply& m) {
  uint32_t n = 0;
  if (!r.get(n, "count")) return false;
  const std::byte* p = r.take(n, "states");  // checks the bytes are there before any resize
  if (p == nullptr) return false;
  m.states.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const auto st = static_cast<uint8_t>(p[i]);
    if (st > PagesReply::kCached) {
      return r.fail(st, cat({r.what(), ": page state ", st, " (page ", i, ") is not 0, 1 or 2"}),
                    i);
    }
    m.states[i] = st;
  }
  return true;
}
bool get_body(Reader& r, EvictReply& m) {
  return r.get(m.evicted, "evicted");
}
bool get_body(Reader& r, FlushReply& m) {
  return r.get(m.flushed, "flushed");
}
bool get_body(Reader& r, SessionsReply& m) {
  uint32_t n = 0;
  if (!r.count(n, kSessionFixedBytes, "count")) return false;
  m.sessions.resize(n);
  for (SessionInfo& s : m.sessions) {
    if (!(r.get(s.id, "id") && r.get(s.pid, "pid") && r.get(s.uid, "uid") &&
          r.get(s.held_pages, "held_pages") && r.str(s.worker, "worker") &&
          r.str(s.tenant, "tenant") && r.str(s.pool, "pool"))) {
      return false;
    }
  }
  return true;
}

// Opcode → decoder: entry i decodes alternative i (opcode i + 1) of the variant V in place.
template <typename V>
using BodyDecoder = bool (*)(Reader&, V&);

template <typename V, size_t I>
bool decode_alternative(Reader& r, V& out) {
  return get_body(r, out.template emplace<I>());
}

template <typename V, size_t... I>
constexpr std::array<BodyDecoder<V>, sizeof...(I)> make_decoders(std::index_sequence<I...>) {
  return {&decode_alternative<V, I>...};
}

constexpr auto kRequestDecoders = make_decoders<Request>(std::make_index_sequence<kNumOpcodes>{});
constexpr auto kReplyDecoders = make_decoders<Reply>(std::make_index_sequence<kNumOpcodes>{});

// Opcode → variant index for opcodes below kOpcodeTableSize; kNumOpcodes where none.
constexpr size_t kOpcodeTableSize = 64;
static_assert(kOpcodeNumbers[kNumOpcodes - 1] < kOpcodeTableSize);
constexpr std::array<uint8_t, kOpcodeTableSize> kOpcodeIndex = [] {
  std::array<uint8_t, kOpcodeTableSize> t{};
  t.fill(static_cast<uint8_t>(kNumOpcodes));
  for (size_t i = 0; i < kNumOpcodes; ++i)
    t[kOpcodeNumbers[i]] = static_cast<uint8_t>(i);
  return t;
}();

// The variant index of the operation `op` names, else kNumOpcodes.
size_t opcode_index(uint16_t op) {
  return op < kOpcodeTableSize ? kOpcodeIndex[op] : kNumOpcodes;
}

Error length_mismatch(std::string_view what, const FrameHeader& h, size_t payload) {
  return make_error(
      Errc::malformed_frame, payload,
      cat({what, ": header length ", h.length, " but the payload holds ", payload, " bytes"}));
}

}  // namespace

Opcode opcode_of(const Request& r) {
  return static_cast<Opcode>(kOpcodeNumbers[r.index()]);
}
Opcode opcode_of(const Reply& r) {
  return static_cast<Opcode>(kOpcodeNumbers[r.index()]);
}

uint16_t opcode_number(size_t index) {
  return index < kNumOpcodes ? kOpcodeNumbers[index] : 0;
}

std::string_view opcode_name(uint16_t opcode) {
  if (opcode == static_cast<uint16_t>(Opcode::event_batch)) return "event_batch";
  const size_t i = opcode_index(opcode);
  return i == kNumOpcodes ? std::string_view() : kRequestNames[i];
}

void encode_request(uint32_t request_id, const Request& request, std::vector<std::byte>& out) {
  const auto opcode = static_cast<uint16_t>(opcode_of(request));
  std::visit(
      [&](const auto& m) {
        put_frame(request_id, opcode, body_size(m), out, [&](Writer& w) { put_body(w, m); });
      },
      request);
}

void encode_reply(uint32_t request_id, const Reply& reply, std::vector<std::byte>& out) {
  const auto opcode = static_cast<uint16_t>(static_cast<uint16_t>(opcode_of(reply)) | kReplyBit);
  std::visit(
      [&](const auto& m) {
        put_frame(request_id, opcode, kU16 + body_size(m), out, [&](Writer& w) {
          w.put(static_cast<uint16_t>(Errc::ok));
          put_body(w, m);
        });
      },
      reply);
}

void encode_error(uint32_t request_id, uint16_t opcode, const Error& error,
                  std::vector<std::byte>& out) {
  // An error reply must never read as success: an ok status here is a caller bug, sent as
  // internal. The message is cut so that the frame stays within kMaxPayloadBytes.
  const Errc code = error.status.ok() ? Errc::internal : error.status.code();
  const std::string_view message = std::string_view(error.message).substr(0, kMaxErrorMessageBytes);
  put_frame(request_id, static_cast<uint16_t>(opcode | kReplyBit),
            kErrorFixedBytes + message.size(), out, [&](Writer& w) {
              w.put(static_cast<uint16_t>(code));
              w.put(error.status.item());
              w.put(error.status.value());
              w.str(message);
            });
}

Result<FrameHeader> decode_header(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return make_error(Errc::invalid_argument, bytes.size(),
                      cat({"frame header needs ", kHeaderBytes, " bytes, got ", bytes.size()}));
  }
  FrameHeader h;
  const std::byte* p = bytes.data();
  std::memcpy(&h.magic, p, kU32);
  std::memcpy(&h.length, p + 4, kU32);
  std::memcpy(&h.version, p + 8, kU16);
  std::memcpy(&h.opcode, p + 10, kU16);
  std::memcpy(&h.request_id, p + 12, kU32);
  if (h.magic != kFrameMagic) {
    return make_error(
        Errc::malformed_frame, h.magic,
        cat({"frame magic ", Hex{h.magic, 8}, " is not KVPL (", Hex{kFrameMagic, 8}, ")"}));
  }
  if (h.version != kProtocolVersion) {
    return make_error(Errc::unsupported_version, h.version,
                      cat({"frame version ", h.version, " is not supported (this side speaks ",
                           kProtocolVersion, ")"}));
  }
  if (h.length > kMaxPayloadBytes) {
    return make_error(Errc::frame_too_large, h.length,
                      cat({"frame payload of ", h.length, " bytes is above kMaxPayloadBytes (",
                           kMaxPayloadBytes, ")"}));
  }
  return h;
}

Result<Request> decode_request(const FrameHeader& header, std::span<const std::byte> payload) {
  const size_t index = opcode_index(header.opcode);  // a reply bit makes it unknown here
  if (index == kNumOpcodes) {
    return make_error(Errc::unknown_opcode, header.opcode,
                      cat({"opcode ", Hex{header.opcode, 4}, " is not a request"}));
  }
  if (payload.size() != header.length) {
    return length_mismatch(kRequestNames[index], header, payload.size());
  }
  Reader r(payload, kRequestNames[index]);
  Request request;
  if (!kRequestDecoders[index](r, request) || !r.finish()) return r.take_error();
  return request;
}

Result<Reply> decode_reply(const FrameHeader& header, std::span<const std::byte> payload) {
  if ((header.opcode & kReplyBit) == 0) {
    return make_error(Errc::unknown_opcode, header.opcode,
                      cat({"opcode ", Hex{header.opcode, 4}, " is not a reply (no reply bit)"}));
  }
  const size_t index = opcode_index(static_cast<uint16_t>(header.opcode & ~kReplyBit));
  // An error can answer any opcode, even one this side does not know.
  const std::string_view what = index == kNumOpcodes ? "reply" : kReplyNames[index];
  if (payload.size() != header.length) return length_mismatch(what, header, payload.size());
  Reader r(payload, what);
  uint16_t code = 0;
  if (!r.get(code, "status code")) return r.take_error();
  if (!is_known_errc(code)) {
    r.fail(code, cat({what, ": status code ", code, " is not a known error code"}));
    return r.take_error();
  }
  if (code != static_cast<uint16_t>(Errc::ok)) {
    uint32_t item = kNoItem;
    uint64_t value = 0;
    std::string message;
    if (!(r.get(item, "error item") && r.get(value, "error value") &&
          r.str(message, "error message", kMaxErrorMessageBytes, "the message limit") &&
          r.finish())) {
      return r.take_error();
    }
    return Error{Status(static_cast<Errc>(code), item, value), std::move(message)};
  }
  if (index == kNumOpcodes) {
    return make_error(Errc::unknown_opcode, header.opcode,
                      cat({"reply opcode ", Hex{header.opcode, 4}, " names no operation"}));
  }
  Reply reply;
  if (!kReplyDecoders[index](r, reply) || !r.finish()) return r.take_error();
  return reply;
}

// Events pushed to a subscriber ----------------------------------------------------------------

void encode_event_batch(uint32_t request_id, const EventBatch& batch, std::vector<std::byte>& out) {
  put_frame(request_id,
            static_cast<uint16_t>(static_cast<uint16_t>(Opcode::event_batch) | kReplyBit),
            kU16 + body_size(batch), out, [&](Writer& w) {
              w.put(static_cast<uint16_t>(Errc::ok));
              put_body(w, batch);
            });
}

Result<EventBatch> decode_event_batch(const FrameHeader& header,
                                      std::span<const std::byte> payload) {
  constexpr auto kOp =
      static_cast<uint16_t>(static_cast<uint16_t>(Opcode::event_batch) | kReplyBit);
  if (header.opcode != kOp) {
    return make_error(Errc::unknown_opcode, header.opcode,
                      cat({"opcode ", Hex{header.opcode, 4}, " is not an event batch"}));
  }
  if (payload.size() != header.length)
    return length_mismatch("event batch", header, payload.size());
  Reader r(payload, "event batch");
  uint16_t code = 0;
  if (!r.get(code, "status code")) return r.take_error();
  if (code != static_cast<uint16_t>(Errc::ok)) {
    r.fail(code, cat({"event batch: status code ", code, " is not ok"}));
    return r.take_error();
  }
  EventBatch batch;
  if (!get_body(r, batch) || !r.finish()) return r.take_error();
  return batch;
}

}  // namespace kvpool::wire

// The kvpool wire codec (see protocol.h for the layouts): framing (the header), the opcode tables,
// the dispatch from an opcode to its payload codec, and the public encode_* and decode_*
// functions. The payload codecs are in protocol_pool.cpp (the pool operations, opcodes 1..12,
// hello .. copy) and protocol_ops.cpp (the operations, metrics and events block, opcodes 20+);
// Writer, Reader and the error-text helpers they share are in wire_codec.h.
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
#include "common/wire/protocol.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/wire/body_codec.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire {
namespace {

using codec::cat;
using codec::Hex;
using codec::kU16;
using codec::kU32;
using codec::kU64;
using codec::make_error;
using codec::Reader;
using codec::Writer;

// The payload codecs (body_codec.h), found through these names.
using codec::body_size;
using codec::get_body;
using codec::put_body;

constexpr size_t kNumOpcodes = std::variant_size_v<Request>;
static_assert(std::variant_size_v<Reply> == kNumOpcodes);

// Variant alternative → opcode, names and columns, from the table (protocol.h). Opcodes are
// wire values and need not be contiguous.
#define KVPOOL_NUMBER(name, number, ...) number,
#define KVPOOL_NAME(name, ...) #name,
#define KVPOOL_REPLY_NAME(name, ...) #name " reply",
#define KVPOOL_ADMIN(name, number, Request, Reply, admin, attach) admin,
#define KVPOOL_ATTACH(name, number, Request, Reply, admin, attach) attach,
constexpr std::array<uint16_t, kNumOpcodes> kOpcodeNumbers = {KVPOOL_WIRE_OPCODES(KVPOOL_NUMBER)};
constexpr std::array<std::string_view, kNumOpcodes> kRequestNames = {
    KVPOOL_WIRE_OPCODES(KVPOOL_NAME)};
constexpr std::array<std::string_view, kNumOpcodes> kReplyNames = {
    KVPOOL_WIRE_OPCODES(KVPOOL_REPLY_NAME)};
constexpr std::array<bool, kNumOpcodes> kAdminOnlyColumn = {KVPOOL_WIRE_OPCODES(KVPOOL_ADMIN)};
constexpr std::array<bool, kNumOpcodes> kNeedsAttachColumn = {KVPOOL_WIRE_OPCODES(KVPOOL_ATTACH)};
#undef KVPOOL_NUMBER
#undef KVPOOL_NAME
#undef KVPOOL_REPLY_NAME
#undef KVPOOL_ADMIN
#undef KVPOOL_ATTACH

// Wire sizes of an error reply's fixed part and the longest message it can carry.
constexpr size_t kErrorFixedBytes = kU16 + kU32 + kU64 + kU32;  // status, item, value, length
constexpr size_t kMaxErrorMessageBytes = kMaxPayloadBytes - kErrorFixedBytes;

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
    case Errc::pin_limit_exceeded:
    case Errc::pages_in_use:
      return true;
  }
  return false;
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
// Every number fits the index and names one row only.
static_assert([] {
  std::array<bool, kOpcodeTableSize> seen{};
  for (const uint16_t n : kOpcodeNumbers) {
    if (n == 0 || n >= kOpcodeTableSize || seen[n] ||
        n == static_cast<uint16_t>(Opcode::event_batch) ||
        n == static_cast<uint16_t>(Opcode::pool_changed)) {
      return false;
    }
    seen[n] = true;
  }
  return true;
}());
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

bool opcode_admin_only(Opcode op) {
  const size_t i = opcode_index(static_cast<uint16_t>(op));
  return i != kNumOpcodes && kAdminOnlyColumn[i];
}

bool opcode_needs_attach(Opcode op) {
  const size_t i = opcode_index(static_cast<uint16_t>(op));
  return i != kNumOpcodes && kNeedsAttachColumn[i];
}

std::string_view opcode_name(uint16_t opcode) {
  if (opcode == static_cast<uint16_t>(Opcode::event_batch)) return "event_batch";
  if (opcode == static_cast<uint16_t>(Opcode::pool_changed)) return "pool_changed";
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

FrameHeader read_header_fields(std::span<const std::byte> bytes) {
  assert(bytes.size() >= kHeaderBytes);
  FrameHeader h;
  const std::byte* p = bytes.data();
  std::memcpy(&h.magic, p, kU32);
  std::memcpy(&h.length, p + 4, kU32);
  std::memcpy(&h.version, p + 8, kU16);
  std::memcpy(&h.opcode, p + 10, kU16);
  std::memcpy(&h.request_id, p + 12, kU32);
  return h;
}

Result<FrameHeader> decode_header(std::span<const std::byte> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return make_error(Errc::invalid_argument, bytes.size(),
                      cat({"frame header needs ", kHeaderBytes, " bytes, got ", bytes.size()}));
  }
  const FrameHeader h = read_header_fields(bytes);
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

void encode_pool_changed(uint32_t epoch, std::vector<std::byte>& out) {
  put_frame(0, static_cast<uint16_t>(static_cast<uint16_t>(Opcode::pool_changed) | kReplyBit),
            kU16 + kU32, out, [&](Writer& w) {
              w.put(static_cast<uint16_t>(Errc::ok));
              w.put(epoch);
            });
}

Result<uint32_t> decode_pool_changed(const FrameHeader& header,
                                     std::span<const std::byte> payload) {
  constexpr auto kOp =
      static_cast<uint16_t>(static_cast<uint16_t>(Opcode::pool_changed) | kReplyBit);
  if (header.opcode != kOp) {
    return make_error(Errc::unknown_opcode, header.opcode,
                      cat({"opcode ", Hex{header.opcode, 4}, " is not a pool_changed notice"}));
  }
  if (payload.size() != header.length)
    return length_mismatch("pool_changed notice", header, payload.size());
  Reader r(payload, "pool_changed notice");
  uint16_t code = 0;
  uint32_t epoch = 0;
  if (!r.get(code, "status code")) return r.take_error();
  if (code != static_cast<uint16_t>(Errc::ok)) {
    r.fail(code, cat({"pool_changed notice: status code ", code, " is not ok"}));
    return r.take_error();
  }
  if (!r.get(epoch, "epoch") || !r.finish()) return r.take_error();
  return epoch;
}

const char* event_kind_name(uint8_t kind) {
  switch (kind) {
    case Event::kStored:
      return "stored";
    case Event::kRemoved:
      return "removed";
    case Event::kCleared:
      return "cleared";
    case Event::kGap:
      return "gap";
    case Event::kResized:
      return "resized";
    default:
      return "unknown";
  }
}

const char* event_cause_name(uint8_t cause) {
  switch (cause) {
    case Event::kEvicted:
      return "evicted";
    case Event::kFlushed:
      return "flushed";
    case Event::kGrown:
      return "grown";
    case Event::kShrunk:
      return "shrunk";
    default:
      return "";
  }
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

// The payload codecs of the operations, metrics and events block (opcodes 20+: prefixes, reload,
// subscribe, snapshot) and of the event_batch push frame's body; see protocol.h for the layouts.
// Framing and opcode dispatch are in protocol.cpp, the shared Writer and Reader in wire_codec.h.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/wire/body_codec.h"
#include "common/wire/protocol.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire::codec {
namespace {

constexpr size_t kPrefixEntryFixedBytes =
    kHashBytes + 5 * kU32 + kU8 + kU32;  // incl. tenant length
constexpr size_t kEventFixedBytes = kU64 + 2 * kU8 + kU32 + kU64 + kHashBytes + kU32;
constexpr size_t kMaxSnapshotBytes = kMaxPayloadBytes - kU16 - 2 * kU32;

}  // namespace

// Sizes and writers ---------------------------------------------------------------------------

size_t body_size(const PrefixesRequest&) {
  return kU32;
}
size_t body_size(const ReloadRequest&) {
  return 0;
}
size_t body_size(const SubscribeRequest&) {
  return kU64;
}
size_t body_size(const SnapshotRequest&) {
  return 0;
}
size_t body_size(const PrefixesReply& m) {
  size_t n = 2 * kU32;
  for (const PrefixEntry& e : m.entries)
    n += kPrefixEntryFixedBytes + e.tenant.size();
  return n;
}
size_t body_size(const ReloadReply& m) {
  size_t n = kU8 + kU32 + m.message.size() + kU32;
  for (const std::string& k : m.restart)
    n += kU32 + k.size();
  return n;
}
size_t body_size(const SubscribeReply&) {
  return 3 * kU64;
}
size_t body_size(const SnapshotReply& m) {
  return 2 * kU32 + m.bytes.size();
}
size_t body_size(const EventBatch& m) {
  size_t n = kU32;
  for (const Event& e : m.events)
    n += kEventFixedBytes + e.tenant.size();
  return n;
}

void put_body(Writer& w, const PrefixesRequest& m) {
  w.put(m.limit);
}
void put_body(Writer&, const ReloadRequest&) {}
void put_body(Writer& w, const SubscribeRequest& m) {
  w.put(m.from_seq);
}
void put_body(Writer&, const SnapshotRequest&) {}
void put_body(Writer& w, const PrefixesReply& m) {
  w.put(m.indexed);
  w.put(static_cast<uint32_t>(m.entries.size()));
  for (const PrefixEntry& e : m.entries) {
    w.put(e.hash.lo);
    w.put(e.hash.hi);
    w.put(e.page);
    w.put(e.depth);
    w.put(e.hits);
    w.put(e.age_s);
    w.put(e.idle_s);
    w.put(e.state);
    w.str(e.tenant);
  }
}
void put_body(Writer& w, const ReloadReply& m) {
  w.put(m.outcome);
  w.str(m.message);
  w.put(static_cast<uint32_t>(m.restart.size()));
  for (const std::string& k : m.restart)
    w.str(k);
}
void put_body(Writer& w, const SubscribeReply& m) {
  w.put(m.stream_id);
  w.put(m.next_seq);
  w.put(m.oldest_seq);
}
void put_body(Writer& w, const SnapshotReply& m) {
  w.put(m.layout_version);
  w.put(static_cast<uint32_t>(m.bytes.size()));
  w.raw(m.bytes.data(), m.bytes.size());
}
void put_body(Writer& w, const EventBatch& m) {
  w.put(static_cast<uint32_t>(m.events.size()));
  for (const Event& e : m.events) {
    w.put(e.seq);
    w.put(e.kind);
    w.put(e.cause);
    w.put(e.page);
    w.put(e.count);
    w.put(e.hash.lo);
    w.put(e.hash.hi);
    w.str(e.tenant);
  }
}

// Readers -------------------------------------------------------------------------------------

bool get_body(Reader& r, PrefixesRequest& m) {
  if (!r.get(m.limit, "limit")) return false;
  if (m.limit == 0 || m.limit > kMaxPrefixes) {
    return r.fail(m.limit, cat({r.what(), ": limit ", m.limit, " is not in 1..", kMaxPrefixes}));
  }
  return true;
}
bool get_body(Reader&, ReloadRequest&) {
  return true;
}
bool get_body(Reader& r, SubscribeRequest& m) {
  return r.get(m.from_seq, "from_seq");
}
bool get_body(Reader&, SnapshotRequest&) {
  return true;
}
bool get_body(Reader& r, PrefixesReply& m) {
  uint32_t n = 0;
  if (!(r.get(m.indexed, "indexed") && r.count(n, kPrefixEntryFixedBytes, "count"))) return false;
  if (n > kMaxPrefixes) {
    return r.fail(n, cat({r.what(), ": count ", n, " is above kMaxPrefixes (", kMaxPrefixes, ")"}));
  }
  m.entries.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    PrefixEntry& e = m.entries[i];
    if (!(r.get(e.hash.lo, "hash") && r.get(e.hash.hi, "hash") && r.get(e.page, "page") &&
          r.get(e.depth, "depth") && r.get(e.hits, "hits") && r.get(e.age_s, "age_s") &&
          r.get(e.idle_s, "idle_s") && r.get(e.state, "state") && r.str(e.tenant, "tenant"))) {
      return false;
    }
    if (e.state != PagesReply::kInUse && e.state != PagesReply::kCached) {
      return r.fail(e.state, cat({r.what(), ": state ", e.state, " (entry ", i, ") is not 1 or 2"}),
                    i);
    }
  }
  return true;
}
bool get_body(Reader& r, ReloadReply& m) {
  uint32_t n = 0;
  if (!(r.get(m.outcome, "outcome") &&
        r.str(m.message, "message", kMaxMessageBytes, "kMaxMessageBytes") &&
        r.count(n, kU32, "restart count"))) {
    return false;
  }
  if (m.outcome > ReloadReply::kNoConfigFile) {
    return r.fail(m.outcome, cat({r.what(), ": outcome ", m.outcome, " is not 0, 1 or 2"}));
  }
  if (n > kMaxRestartKeys) {
    return r.fail(n, cat({r.what(), ": ", n, " restart keys, above ", kMaxRestartKeys}));
  }
  m.restart.resize(n);
  for (std::string& k : m.restart) {
    if (!r.str(k, "restart key")) return false;
  }
  return true;
}
bool get_body(Reader& r, SubscribeReply& m) {
  return r.get(m.stream_id, "stream_id") && r.get(m.next_seq, "next_seq") &&
         r.get(m.oldest_seq, "oldest_seq");
}
bool get_body(Reader& r, SnapshotReply& m) {
  uint32_t n = 0;
  if (!(r.get(m.layout_version, "layout_version") && r.get(n, "length"))) return false;
  if (n > kMaxSnapshotBytes) {
    return r.fail(n, cat({r.what(), ": ", n, " snapshot bytes, above ", kMaxSnapshotBytes}));
  }
  const std::byte* p = r.take(n, "snapshot");
  if (p == nullptr) return false;
  m.bytes.assign(p, p + n);
  return true;
}
bool get_body(Reader& r, EventBatch& m) {
  uint32_t n = 0;
  if (!r.count(n, kEventFixedBytes, "count")) return false;
  m.events.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    Event& e = m.events[i];
    if (!(r.get(e.seq, "seq") && r.get(e.kind, "kind") && r.get(e.cause, "cause") &&
          r.get(e.page, "page") && r.get(e.count, "count") && r.get(e.hash.lo, "hash") &&
          r.get(e.hash.hi, "hash") && r.str(e.tenant, "tenant"))) {
      return false;
    }
    if (e.kind > Event::kResized || e.cause > Event::kShrunk) {
      return r.fail(e.kind,
                    cat({r.what(), ": event ", i, " has kind ", e.kind, " and cause ", e.cause,
                         " (kinds 0..4, causes 0..4)"}),
                    i);
    }
  }
  return true;
}

}  // namespace kvpool::wire::codec

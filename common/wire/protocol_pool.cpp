// The payload codecs of the pool operations (opcodes 1..12: hello, alloc, retain, release, lookup,
// publish, stats, evict, flush, sessions, pages, copy); see protocol.h for the layouts. Framing and
// opcode dispatch are in protocol.cpp, the shared Writer and Reader in wire_codec.h.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/stats_counters.h"
#include "common/wire/body_codec.h"
#include "common/wire/protocol.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire::codec {
namespace {

// Wire sizes of the fixed parts.
constexpr size_t kPublishItemBytes = kU32 + kHashBytes;
constexpr size_t kPublishResultBytes = kU8 + kU32;
constexpr uint8_t kChainParent = 1;  // publish's chain.flags: a parent hash follows
// … uuid, then reserved_bytes, scales_offset, max_pages, epoch, n segments.
constexpr size_t kPoolInfoFixedBytes =
    4 * kU32 + 3 * kU8 + kU32 + kU32 + 2 * kU64 + 3 * kU32 + kU32 + 16 + 2 * kU64 + 2 * kU32 + kU32;
constexpr size_t kSegmentFixedBytes = 2 * kU64 + kU32;
constexpr size_t kPageCopyBytes = 2 * kU32;
constexpr size_t kStatsBytes = 6 * kU32;
constexpr size_t kSessionFixedBytes = kU64 + 3 * kU32 + 3 * kU32;  // numbers + 3 string lengths

// Page ids and hashes are copied as whole arrays: their in-memory layout is the wire layout.
static_assert(sizeof(PageId) == kU32);
static_assert(sizeof(PageCopy) == kPageCopyBytes && offsetof(PageCopy, dst) == kU32);
static_assert(std::is_trivially_copyable_v<BlockHash> && sizeof(BlockHash) == kHashBytes &&
              offsetof(BlockHash, lo) == 0 && offsetof(BlockHash, hi) == kU64);

}  // namespace

// Sizes and writers ---------------------------------------------------------------------------

namespace {

// The hints of alloc, retain, lookup and publish (see protocol.h): a flag on the first count and
// a trailer after the items.
constexpr size_t kHintsBytes = 1 + kU32;
size_t hints_size(const PageHints& h) {
  return h.empty() ? 0 : kHintsBytes;
}
uint32_t flagged(uint32_t count, const PageHints& h) {
  return h.empty() ? count : count | kHintsFlag;
}
void put_hints(Writer& w, const PageHints& h) {
  if (h.empty()) return;
  w.put(static_cast<uint8_t>(h.priority));
  w.put(h.pin_ttl_ms);
}
// Reads the first count, taking the hints flag off it.
bool get_flagged(Reader& r, uint32_t& n, bool& hinted) {
  if (!r.get(n, "count")) return false;
  hinted = (n & kHintsFlag) != 0;
  n &= ~kHintsFlag;
  return true;
}
bool get_hints(Reader& r, bool hinted, PageHints& h) {
  if (!hinted) return true;
  uint8_t priority = 0;
  if (!r.get(priority, "hints.priority") || !r.get(h.pin_ttl_ms, "hints.pin_ttl_ms")) return false;
  if (priority > kMaxPriority) {
    return r.fail(priority, cat({r.what(), ": hints.priority ", unsigned{priority},
                                 " is not a priority class (0 none, 1 one_off, 2 conversation, "
                                 "3 system)"}));
  }
  h.priority = static_cast<Priority>(priority);
  // One encoding per request: hints that say nothing are sent as no hints.
  if (h.empty()) {
    return r.fail(0, cat({r.what(),
                          ": hints flag set but the hints say nothing (priority none, "
                          "no pin): send none"}));
  }
  return true;
}

}  // namespace

// Payload sizes (replies: without the status code).
size_t body_size(const HelloRequest& m) {
  size_t n = 2 * kU32 + m.worker_name.size() + m.pool_name.size();
  if (!m.hash_scheme.name.empty()) return n + kU64 + kU32 + m.hash_scheme.name.size() + kHashBytes;
  return n + (m.link_session != 0 ? kU64 : 0);
}
size_t body_size(const AllocRequest& m) {
  return kU32 + hints_size(m.hints);
}
size_t body_size(const RetainRequest& m) {
  return kU32 + m.pages.size() * kU32 + hints_size(m.hints);
}
size_t body_size(const ReleaseRequest& m) {
  return kU32 + m.pages.size() * kU32;
}
size_t body_size(const LookupRequest& m) {
  return kU32 + m.chain.size() * kHashBytes + hints_size(m.hints);
}
size_t body_size(const PublishRequest& m) {
  size_t n = kU32 + m.items.size() * kPublishItemBytes + hints_size(m.hints);
  if (m.has_chain()) {
    n += kU8 + (m.parent ? kHashBytes : 0) + kU32 + m.token_ids.size() * kU32 + kU32 +
         m.lora_name.size();
  }
  return n;
}
size_t body_size(const StatsRequest&) {
  return 0;
}
size_t pool_info_size(const PoolInfo& p) {
  size_t n = kPoolInfoFixedBytes + p.pool_name.size() + p.backend.size() + p.tenant.size();
  for (const SegmentInfo& seg : p.segments)
    n += kSegmentFixedBytes + seg.handle.size();
  n += kU32 + p.model.size() + 2 * kU32;
  for (const std::string& g : p.groups)
    n += kU32 + g.size();
  return n + kU32 + kU64;  // segment_pages, segment_stride
}
size_t body_size(const HelloReply& m) {
  return kU64 + pool_info_size(m.pool);
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
  return kU32 + m.pages.size() * (kU32 + 1);
}
size_t body_size(const PublishReply& m) {
  return kU32 + m.results.size() * kPublishResultBytes;
}
size_t body_size(const StatsReply& m) {
  return kStatsBytes + kU32 + m.counters.size() * kU64 + kU32 + m.daemon_counters.size() * kU64;
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
  if (!m.hash_scheme.name.empty()) {
    w.put(m.link_session);
    w.str(m.hash_scheme.name);
    w.put(m.hash_scheme.check.lo);
    w.put(m.hash_scheme.check.hi);
  } else if (m.link_session != 0) {
    w.put(m.link_session);
  }
}
void put_body(Writer& w, const AllocRequest& m) {
  w.put(flagged(m.count, m.hints));
  put_hints(w, m.hints);
}
void put_body(Writer& w, const RetainRequest& m) {
  w.put(flagged(static_cast<uint32_t>(m.pages.size()), m.hints));
  w.raw(m.pages.data(), m.pages.size() * sizeof(PageId));
  put_hints(w, m.hints);
}
void put_body(Writer& w, const ReleaseRequest& m) {
  w.array(m.pages);
}
void put_body(Writer& w, const LookupRequest& m) {
  w.put(flagged(static_cast<uint32_t>(m.chain.size()), m.hints));
  w.raw(m.chain.data(), m.chain.size() * sizeof(BlockHash));
  put_hints(w, m.hints);
}
void put_body(Writer& w, const PublishRequest& m) {
  w.put(flagged(static_cast<uint32_t>(m.items.size()), m.hints));
  for (const PublishItem& it : m.items) {
    w.put(it.page);
    w.put(it.hash.lo);
    w.put(it.hash.hi);
  }
  put_hints(w, m.hints);
  if (!m.has_chain()) return;
  w.put(static_cast<uint8_t>(m.parent ? kChainParent : 0));
  if (m.parent) {
    w.put(m.parent->lo);
    w.put(m.parent->hi);
  }
  w.array(m.token_ids);
  w.str(m.lora_name);
}
void put_body(Writer&, const StatsRequest&) {}
void put_pool_info(Writer& w, const PoolInfo& p) {
  w.put(p.geometry.layers);
  w.put(p.geometry.kv_heads);
  w.put(p.geometry.head_dim);
  w.put(p.geometry.tokens_per_page);
  w.put(static_cast<uint8_t>(p.geometry.dtype));
  w.put(static_cast<uint8_t>(p.layout));
  w.put(static_cast<uint8_t>(p.geometry.kind));
  w.put(p.geometry.window);
  w.put(p.num_pages);
  w.put(p.page_stride);
  w.put(p.segment_bytes);
  w.str(p.pool_name);
  w.str(p.backend);
  w.str(p.tenant);
  w.put(p.device);
  w.raw(p.device_uuid.data(), p.device_uuid.size());
  w.put(p.reserved_bytes);
  w.put(p.scales_offset);
  w.put(p.max_pages);
  w.put(p.epoch);
  w.put(static_cast<uint32_t>(p.segments.size()));
  for (const SegmentInfo& seg : p.segments) {
    w.put(seg.offset);
    w.put(seg.bytes);
    w.put(static_cast<uint32_t>(seg.handle.size()));
    w.raw(seg.handle.data(), seg.handle.size());
  }
  w.str(p.model);
  w.put(p.group);
  w.put(static_cast<uint32_t>(p.groups.size()));
  for (const std::string& g : p.groups)
    w.str(g);
  w.put(p.segment_pages);
  w.put(p.segment_stride);
}
void put_body(Writer& w, const HelloReply& m) {
  w.put(m.session_id);
  put_pool_info(w, m.pool);
}
void put_body(Writer& w, const AllocReply& m) {
  w.array(m.pages);
}
void put_body(Writer&, const RetainReply&) {}
void put_body(Writer&, const ReleaseReply&) {}
void put_body(Writer& w, const LookupReply& m) {
  w.array(m.pages);
  // One tier byte per hit; a reply built without them says every hit came from the device tier.
  for (size_t i = 0; i < m.pages.size(); ++i)
    w.put(i < m.tiers.size() ? m.tiers[i] : kTierDevice);
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
  w.put(m.session_held_pages);
  w.array(m.counters);
  w.array(m.daemon_counters);
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

// Readers -------------------------------------------------------------------------------------

bool get_body(Reader& r, HelloRequest& m) {
  if (!(r.str(m.worker_name, "worker_name") && r.str(m.pool_name, "pool_name"))) return false;
  if (r.left() == 0) return true;
  const bool scheme = r.left() > kU64;  // names, link_session, then the hash scheme
  if (!r.get(m.link_session, "link_session")) return false;
  if (!scheme) {
    if (m.link_session == 0) {
      return r.fail(0, cat({r.what(), ": link_session 0 names no session: send none"}));
    }
    return true;
  }
  if (!r.str(m.hash_scheme.name, "hash_scheme", kMaxSchemeBytes, "kMaxSchemeBytes") ||
      !r.get(m.hash_scheme.check.lo, "hash_scheme.check") ||
      !r.get(m.hash_scheme.check.hi, "hash_scheme.check")) {
    return false;
  }
  if (m.hash_scheme.name.empty()) {
    return r.fail(0, cat({r.what(), ": an empty hash_scheme says nothing: send none"}));
  }
  return true;
}
bool get_body(Reader& r, AllocRequest& m) {
  bool hinted = false;
  if (!get_flagged(r, m.count, hinted)) return false;
  if (m.count > kMaxBatch) {
    return r.fail(m.count,
                  cat({r.what(), ": count ", m.count, " is above kMaxBatch (", kMaxBatch, ")"}));
  }
  return get_hints(r, hinted, m.hints);
}
bool get_body(Reader& r, RetainRequest& m) {
  uint32_t n = 0;
  bool hinted = false;
  return get_flagged(r, n, hinted) && r.check_count(n, kU32, "count") &&
         r.items(m.pages, n, "pages") && get_hints(r, hinted, m.hints);
}
bool get_body(Reader& r, ReleaseRequest& m) {
  return r.array(m.pages, "count");
}
bool get_body(Reader& r, LookupRequest& m) {
  uint32_t n = 0;
  bool hinted = false;
  return get_flagged(r, n, hinted) && r.check_count(n, kHashBytes, "count") &&
         r.items(m.chain, n, "chain") && get_hints(r, hinted, m.hints);
}
bool get_body(Reader& r, PublishRequest& m) {
  uint32_t n = 0;
  bool hinted = false;
  if (!get_flagged(r, n, hinted) || !r.check_count(n, kPublishItemBytes, "count")) return false;
  const std::byte* p = r.take(size_t{n} * kPublishItemBytes, "items");
  if (p == nullptr) return false;
  m.items.resize(n);
  for (PublishItem& it : m.items) {
    std::memcpy(&it.page, p, kU32);
    std::memcpy(&it.hash.lo, p + kU32, kU64);
    std::memcpy(&it.hash.hi, p + kU32 + kU64, kU64);
    p += kPublishItemBytes;
  }
  if (!get_hints(r, hinted, m.hints)) return false;
  if (r.left() == 0) return true;
  uint8_t flags = 0;
  if (!r.get(flags, "chain.flags")) return false;
  if ((flags & ~kChainParent) != 0) {
    return r.fail(flags, cat({r.what(), ": chain.flags ", unsigned{flags},
                              " sets bits this protocol does not know (bit 0: parent)"}));
  }
  if ((flags & kChainParent) != 0) {
    BlockHash parent;
    if (!r.get(parent.lo, "chain.parent") || !r.get(parent.hi, "chain.parent")) return false;
    m.parent = parent;
  }
  if (!r.array(m.token_ids, "chain.token_ids") || !r.str(m.lora_name, "chain.lora_name")) {
    return false;
  }
  // One encoding per request: a chain that says nothing is sent as none.
  if (!m.has_chain()) {
    return r.fail(0, cat({r.what(), ": a chain with no parent, token ids or adapter: send none"}));
  }
  return true;
}
bool get_body(Reader&, StatsRequest&) {
  return true;
}

bool get_pool_info(Reader& r, PoolInfo& p) {
  uint8_t dtype = 0;
  uint8_t layout = 0;
  if (!(r.get(p.geometry.layers, "layers") && r.get(p.geometry.kv_heads, "kv_heads") &&
        r.get(p.geometry.head_dim, "head_dim") &&
        r.get(p.geometry.tokens_per_page, "tokens_per_page") && r.get(dtype, "dtype"))) {
    return false;
  }
  if (dtype > static_cast<uint8_t>(KvDtype::int8)) {
    return r.fail(dtype, cat({r.what(), ": dtype ", dtype, " is not a KvDtype"}));
  }
  p.geometry.dtype = static_cast<KvDtype>(dtype);
  if (!r.get(layout, "layout")) return false;
  if (layout > static_cast<uint8_t>(kMaxKvLayout)) {
    return r.fail(layout, cat({r.what(), ": layout ", layout, " is not a KvLayout"}));
  }
  p.layout = static_cast<KvLayout>(layout);
  uint8_t kind = 0;
  if (!r.get(kind, "kind")) return false;
  if (kind > static_cast<uint8_t>(kMaxAttentionKind)) {
    return r.fail(kind, cat({r.what(), ": kind ", kind, " is not an AttentionKind"}));
  }
  p.geometry.kind = static_cast<AttentionKind>(kind);
  if (!(r.get(p.geometry.window, "window") && r.get(p.num_pages, "num_pages") &&
        r.get(p.page_stride, "page_stride") && r.get(p.segment_bytes, "segment_bytes") &&
        r.str(p.pool_name, "pool_name") && r.str(p.backend, "backend") &&
        r.str(p.tenant, "tenant") && r.get(p.device, "device"))) {
    return false;
  }
  const std::byte* uuid = r.take(p.device_uuid.size(), "device_uuid");
  if (uuid == nullptr) return false;
  std::memcpy(p.device_uuid.data(), uuid, p.device_uuid.size());
  if (!(r.get(p.reserved_bytes, "reserved_bytes") && r.get(p.scales_offset, "scales_offset") &&
        r.get(p.max_pages, "max_pages") && r.get(p.epoch, "epoch"))) {
    return false;
  }
  uint32_t n = 0;
  if (!r.get(n, "segment count")) return false;
  if (n > kMaxSegments) {
    return r.fail(n,
                  cat({r.what(), ": ", n, " segments, above kMaxSegments (", kMaxSegments, ")"}));
  }
  p.segments.resize(n);
  for (SegmentInfo& seg : p.segments) {
    uint32_t len = 0;
    if (!(r.get(seg.offset, "segment offset") && r.get(seg.bytes, "segment bytes") &&
          r.get(len, "segment handle length"))) {
      return false;
    }
    if (len > kMaxHandleBytes) {
      return r.fail(len, cat({r.what(), ": segment handle of ", len,
                              " bytes, above kMaxHandleBytes (", kMaxHandleBytes, ")"}));
    }
    const std::byte* h = r.take(len, "segment handle");
    if (h == nullptr) return false;
    seg.handle.assign(reinterpret_cast<const uint8_t*>(h),
                      reinterpret_cast<const uint8_t*>(h) + len);
  }
  uint32_t g = 0;
  if (!(r.str(p.model, "model") && r.get(p.group, "group") && r.get(g, "group count"))) {
    return false;
  }
  if (g > kMaxGroups) {
    return r.fail(g, cat({r.what(), ": ", g, " groups, above kMaxGroups (", kMaxGroups, ")"}));
  }
  if ((g == 0) != p.model.empty() || (g != 0 && p.group >= g)) {
    return r.fail(p.group, cat({r.what(), ": group ", p.group, " of ", g, " groups of model \"",
                                std::string_view(p.model), "\""}));
  }
  p.groups.resize(g);
  for (std::string& name : p.groups) {
    if (!r.str(name, "group name")) return false;
  }
  if (!(r.get(p.segment_pages, "segment_pages") && r.get(p.segment_stride, "segment_stride"))) {
    return false;
  }
  if ((p.segment_pages == 0) != (p.segment_stride == 0) ||
      (p.segment_pages != 0 && p.layout != KvLayout::layer_major)) {
    return r.fail(
        p.segment_pages,
        cat({r.what(), ": segment_pages ", p.segment_pages, " and segment_stride ",
             p.segment_stride, " (both set, and only for a layer_major pool, or both 0)"}));
  }
  return true;
}
bool get_body(Reader& r, HelloReply& m) {
  return r.get(m.session_id, "session_id") && get_pool_info(r, m.pool);
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
namespace {

// A lookup reply's tiers after its `hits` pages: known tiers, and kTierNone with kNoPage only.
bool get_tiers(Reader& r, LookupReply& m) {
  const std::byte* p = r.take(m.pages.size(), "tiers");
  if (p == nullptr) return false;
  m.tiers.resize(m.pages.size());
  for (size_t i = 0; i < m.pages.size(); ++i) {
    m.tiers[i] = static_cast<uint8_t>(p[i]);
    if (m.tiers[i] > kTierRemote && m.tiers[i] != kTierNone) {
      r.fail(m.tiers[i], "lookup hit " + std::to_string(i) + ": tier " +
                             std::to_string(m.tiers[i]) + " is not a known tier");
      return false;
    }
    // A block with no page (before a sliding window's hit) is tier none, and only it.
    if ((m.tiers[i] == kTierNone) != (m.pages[i] == kNoPage)) {
      r.fail(m.pages[i], "lookup hit " + std::to_string(i) + ": page " +
                             std::to_string(m.pages[i]) + " with tier " +
                             std::to_string(m.tiers[i]) +
                             " (kNoPage goes with tier none, 255, and only it)");
      return false;
    }
  }
  return true;
}

}  // namespace

bool get_body(Reader& r, LookupReply& m) {
  return r.array(m.pages, "hits") && get_tiers(r, m);
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
         r.get(m.session_held_pages, "session_held_pages") && r.array(m.counters, "counters") &&
         r.array(m.daemon_counters, "daemon_counters");
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

// Elastic pools ------------------------------------------------------------------------------

size_t body_size(const SegmentsRequest&) {
  return 0;
}
size_t body_size(const ResizeRequest&) {
  return kU32;
}
size_t body_size(const SegmentsReply& m) {
  return pool_info_size(m.pool);
}
size_t body_size(const ResizeReply&) {
  return kU32;
}
void put_body(Writer&, const SegmentsRequest&) {}
void put_body(Writer& w, const ResizeRequest& m) {
  w.put(m.pages);
}
void put_body(Writer& w, const SegmentsReply& m) {
  put_pool_info(w, m.pool);
}
void put_body(Writer& w, const ResizeReply& m) {
  w.put(m.pages);
}
bool get_body(Reader&, SegmentsRequest&) {
  return true;
}
bool get_body(Reader& r, ResizeRequest& m) {
  return r.get(m.pages, "pages");
}
bool get_body(Reader& r, SegmentsReply& m) {
  return get_pool_info(r, m.pool);
}
bool get_body(Reader& r, ResizeReply& m) {
  return r.get(m.pages, "pages");
}

// lookup_groups: the lookup's request layout; the reply is each group's lookup reply.
size_t body_size(const GroupLookupRequest& m) {
  return kU32 + m.chain.size() * kHashBytes + hints_size(m.hints);
}
void put_body(Writer& w, const GroupLookupRequest& m) {
  w.put(flagged(static_cast<uint32_t>(m.chain.size()), m.hints));
  w.raw(m.chain.data(), m.chain.size() * sizeof(BlockHash));
  put_hints(w, m.hints);
}
bool get_body(Reader& r, GroupLookupRequest& m) {
  uint32_t n = 0;
  bool hinted = false;
  return get_flagged(r, n, hinted) && r.check_count(n, kHashBytes, "count") &&
         r.items(m.chain, n, "chain") && get_hints(r, hinted, m.hints);
}
size_t body_size(const GroupLookupReply& m) {
  return 2 * kU32 + m.groups.size() * size_t{m.hits()} * (kU32 + 1);
}
void put_body(Writer& w, const GroupLookupReply& m) {
  const uint32_t hits = m.hits();
  w.put(hits);
  w.put(static_cast<uint32_t>(m.groups.size()));
  for (const LookupReply& g : m.groups) {
    w.raw(g.pages.data(), size_t{hits} * sizeof(PageId));
    for (uint32_t i = 0; i < hits; ++i)
      w.put(i < g.tiers.size() ? g.tiers[i] : kTierDevice);
  }
}
bool get_body(Reader& r, GroupLookupReply& m) {
  uint32_t hits = 0;
  uint32_t g = 0;
  if (!r.get(hits, "hits") || !r.get(g, "group count")) return false;
  if (g == 0 || g > kMaxGroups) {
    return r.fail(g, cat({r.what(), ": ", g, " groups; a model has 1 to ", kMaxGroups}));
  }
  if (!r.check_count(hits, size_t{g} * (kU32 + 1), "hits")) return false;
  m.groups.resize(g);
  for (LookupReply& l : m.groups) {
    if (!r.items(l.pages, hits, "pages") || !get_tiers(r, l)) return false;
  }
  return true;
}

// reserve and unreserve.
size_t body_size(const ReserveRequest& m) {
  return 2 * kU32 + m.seeds.size() * kU32 + hints_size(m.hints);
}
void put_body(Writer& w, const ReserveRequest& m) {
  w.put(m.max_tokens);
  w.put(flagged(static_cast<uint32_t>(m.seeds.size()), m.hints));
  w.raw(m.seeds.data(), m.seeds.size() * sizeof(PageId));
  put_hints(w, m.hints);
}
bool get_body(Reader& r, ReserveRequest& m) {
  uint32_t n = 0;
  bool hinted = false;
  return r.get(m.max_tokens, "max_tokens") && get_flagged(r, n, hinted) &&
         r.check_count(n, kU32, "count") && r.items(m.seeds, n, "seeds") &&
         get_hints(r, hinted, m.hints);
}
size_t body_size(const ReserveReply& m) {
  return kU64 + kU32 + m.pages.size() * kU32;
}
void put_body(Writer& w, const ReserveReply& m) {
  w.put(m.reservation);
  w.array(m.pages);
}
bool get_body(Reader& r, ReserveReply& m) {
  return r.get(m.reservation, "reservation") && r.array(m.pages, "count");
}
size_t body_size(const UnreserveRequest&) {
  return kU64;
}
void put_body(Writer& w, const UnreserveRequest& m) {
  w.put(m.reservation);
}
bool get_body(Reader& r, UnreserveRequest& m) {
  return r.get(m.reservation, "reservation");
}
size_t body_size(const UnreserveReply&) {
  return 0;
}
void put_body(Writer&, const UnreserveReply&) {}
bool get_body(Reader&, UnreserveReply&) {
  return true;
}

}  // namespace kvpool::wire::codec

namespace kvpool::wire {

uint64_t StatsReply::counter(std::string_view name) const {
  for (size_t i = 0; i < counters.size() && i < stats::kNumPoolCounters; ++i) {
    if (stats::kPoolCounters[i].name == name) return counters[i];
  }
  return 0;
}

}  // namespace kvpool::wire

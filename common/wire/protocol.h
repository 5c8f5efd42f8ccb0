// The kvpool wire protocol: length-prefixed, versioned, little-endian binary frames.
//
// Frame = 16-byte header + payload:
//   u32 magic       kFrameMagic ("KVPL" read as little-endian bytes 'K','V','P','L')
//   u32 length      payload bytes after the header, ≤ kMaxPayloadBytes
//   u16 version     kProtocolVersion
//   u16 opcode      an Opcode; replies carry the request's opcode | kReplyBit
//   u32 request_id  chosen by the client, echoed in the reply
//
// Request payloads (all integers little-endian; "string" = u32 length + bytes; "hash" = u64 lo,
// u64 hi):
//   hello    string worker_name, string pool_name          (≤ kMaxNameBytes each)
//            [u64 link_session]   (a session of the same process attached to another group of
//            the same hybrid model, which this one joins; absent, never 0, when there is none)
//            [u64 link_session (0: none), string hash_scheme (1..kMaxSchemeBytes), hash check]
//                                 (how the worker hashes blocks; present only with a name)
//   alloc    u32 count                                [hints]
//   retain   u32 n, n × u32 page                       [hints]
//   release  u32 n, n × u32 page
//   lookup   u32 n, n × hash                           [hints]
//   publish  u32 n, n × (u32 page, hash)               [hints] [chain]
//            chain: u8 flags (bit 0: a parent follows), [hash parent], u32 m, m × u32 token id,
//            string lora_name — present only when it says something (PublishRequest)
//   stats    (empty)
//   evict    u32 count                                      (admin)
//   flush    (empty)                                        (admin)
//   sessions (empty)
//   pages    (empty)
//   copy     u32 n, n × (u32 src, u32 dst)        (pages the session holds; dst unpublished)
//   -- operations, metrics and events (opcodes 20+; 13..19 are free) --
//   prefixes  u32 limit                                    (1..kMaxPrefixes)
//   reload    (empty)                                      (admin)
//   subscribe u64 from_seq                                 (0 = new events only)
//   snapshot  (empty)
//   lookup_groups  u32 n, n × hash                     [hints]   (a hybrid model's sessions)
//   reserve   u32 max_tokens, u32 n, n × u32 seed page   [hints]  (seeds: pages the session
//             holds, a lookup's hit say; kNoPage for the blocks a window's hit skipped)
//   unreserve u64 reservation
// [hints]: when the request's first u32 (count or n) has kHintsFlag set, the payload ends with
// u8 priority (a Priority, 0..kMaxPriority), u32 pin_ttl_ms: the client's PageHints for the pages
// the call leaves it holding (common/types.h). A client sets the flag only when its hints say
// something, so a request without hints is byte for byte what it was before hints existed.
// Every count is checked against the bytes present and against kMaxBatch before anything is
// allocated, and a payload must be consumed exactly: trailing bytes are malformed.
//
// Reply payloads start with u16 status code (an Errc). When it is not ok, the rest is
//   u32 item, u64 value, string message            (the error, see common/status.h)
// and otherwise the opcode's body:
//   hello    u64 session_id, PoolInfo (u32 layers, u32 kv_heads, u32 head_dim,
//            u32 tokens_per_page, u8 dtype, u8 layout, u8 kind (AttentionKind), u32 window,
//            u32 num_pages, u64 page_stride, u64 segment_bytes, string pool_name, string
//            backend, string tenant, i32 device, 16 bytes device uuid, u64 reserved_bytes, u64
//            scales_offset, u32 max_pages, u32 epoch, u32 n ≤ kMaxSegments, n × (u64 offset, u64
//            bytes, u32 m ≤ kMaxHandleBytes, m bytes handle), string model, u32 group, u32 g
//            ≤ kMaxGroups, g × string group name, u32 segment_pages, u64 segment_stride) — model
//            "" and g = 0 for a plain pool; segment_pages and segment_stride 0 unless the pool is a
//            segmented layer_major one (kernels/paged_kv.h);
//            descriptor backends (host, fake-device, cuda-vmm) pass one fd per segment, in segment
//            order, with this reply (SCM_RIGHTS); cuda-ipc passes none (the handles)
//   alloc    u32 n, n × u32 page
//   retain   (empty)
//   release  (empty)
//   lookup   u32 hits, hits × u32 page, hits × u8 tier (kTierDevice, kTierHost, kTierConverted,
//            kTierRemote: which tier served the block; a host-tier hit was promoted into the
//            page, an 8-bit pool's hit converted back into it, a remote one fetched into it,
//            before this reply)
//   publish  u32 n, n × (u8 kind, u32 page)
//   stats    u32 total, u32 free, u32 in_use, u32 cached, u32 sessions,
//            u32 session_held_pages, u32 n, n × u64 the pool counter table's values, u32 m, m × u64
//            the daemon counter table's values (common/stats_counters.h; rows are only appended, so
//            a client reads the ones it knows)
//   evict    u32 evicted
//   flush    u32 flushed
//   sessions u32 n, n × (u64 id, u32 pid, u32 uid, u32 held_pages, string worker,
//            string tenant, string pool)        — the sessions attached to the asker's pool
//   pages    u32 n, n × u8 state (0 free, 1 in use, 2 cached), one per page of the asker's pool
//   copy     u32 copied
//   prefixes  u32 indexed, u32 n, n × (hash, u32 page, u32 depth, u32 hits, u32 age_s,
//             u32 idle_s, u8 state, string tenant)    — most-hit indexed blocks, hits first
//   reload    u8 outcome (0 applied, 1 refused, 2 no config file), string message,
//             u32 n, n × string key                    — keys that changed but need a restart
//   subscribe u64 stream_id, u64 next_seq, u64 oldest_seq
//   snapshot  u32 layout_version, u32 n, n bytes       — common/stats_layout.h, as in the segment
//   segments  PoolInfo as in hello (its fds with it)
//   resize    u32 pages
//   lookup_groups  u32 hits, u32 g, g × (hits × u32 page, hits × u8 tier)  — per group of the
//            model in order, the pages of the one hybrid hit (kNoPage/kTierNone: not needed)
//   reserve   u64 reservation, u32 n, n × u32 page   — the block table: the seeds, then the
//            pages allocated for the rest of max_tokens
//   unreserve (empty)
// After a subscribe reply the daemon pushes, on the same connection and with the subscribe's
// request id, frames of opcode event_batch | kReplyBit (never a request, never answered):
//   event_batch  u16 status (ok), u32 n, n × (u64 seq, u8 kind, u8 cause, u32 page, u64 count,
//                hash, string tenant)
// and reads nothing more from it but its close (any further frame is an error that closes it).
//
// Encoding and decoding are pure functions: bytes in, a message or an error out; no I/O, no
// global state. Decoders never trust a length and never read past the span they are given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/block_hash.h"
#include "common/geometry.h"
#include "common/status.h"
#include "common/types.h"

namespace kvpool::wire {

inline constexpr uint32_t kFrameMagic = 0x4C50564B;  // "KVPL"
// 3: the layout byte in the hello reply; 4: the tier of each lookup hit; 5: the pool counter
// table's values in the stats reply; 6: the daemon counter table's values after them, the
// reply's nine fixed counters gone (the pool table carries them); 7: the attention kind and
// window of the pool's geometry in PoolInfo; 8: a lookup on a sliding or chunked pool may answer
// kNoPage (tier kTierNone) for blocks before the window its hit needs; 9: hybrid models (the
// model and groups in PoolInfo, hello's link_session, lookup_groups) and static reservations
// (reserve, unreserve); 10: publish's optional chain (parent, token ids, adapter name) for the
// KV events; 11: hello's hash scheme; 12: segmented layer_major pools (segment_pages and
// segment_stride in PoolInfo); 13: lookup tiers kTierConverted and kTierRemote (an older
// client would refuse them in a reply, so it is refused at hello instead).
inline constexpr uint16_t kProtocolVersion = 13;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr uint32_t kMaxPayloadBytes = 8u << 20;  // 8 MiB: a kMaxBatch publish fits
inline constexpr uint32_t kMaxBatch = 1u << 18;         // items in one batched call
inline constexpr uint32_t kHintsFlag = 1u << 31;        // on a count: hints follow the items
inline constexpr uint32_t kMaxNameBytes = 256;
inline constexpr uint32_t kMaxSchemeBytes = 64;  // a hash scheme's name in hello
inline constexpr uint16_t kReplyBit = 0x8000;
// A pool's segments travel in one SCM_RIGHTS message, which Linux limits to 253 descriptors.
inline constexpr uint32_t kMaxSegments = 253;
inline constexpr uint32_t kMaxHandleBytes = 64;  // a cudaIpcMemHandle_t
// Bytes one copy request may move, so that a daemon-side copy stays short on the event loop.
inline constexpr uint64_t kMaxCopyBytes = uint64_t{1} << 30;
inline constexpr uint32_t kMaxPrefixes = 10000;          // entries in one prefixes reply
inline constexpr uint32_t kMaxMessageBytes = 64u << 10;  // free text in a reply (reload)
inline constexpr uint32_t kMaxRestartKeys = 64;
inline constexpr uint32_t kMaxGroups = 8;  // KV groups of one hybrid model

// The opcode table: one row per request, and the only list of them. Columns: the name (the
// Opcode, the Service's handler, the text in errors and logs), the wire number (never reused;
// 13..19 are free), the request and reply types, who may call it (kAdminOnly: root or
// admin_group; the Service checks before its handler runs) and whether it needs an attached
// session (kBeforeHello: only hello). From it follow the Opcode enum, the Request and Reply
// variants (alternative i = row i), the name tables, the decoders, the codec declarations
// (body_codec.h), the Service's handler declarations and its dispatch. The recipe for a new
// opcode is in docs/ARCHITECTURE.md ("Adding an opcode").
inline constexpr bool kAdminOnly = true;
inline constexpr bool kAnyPeer = false;
inline constexpr bool kAttached = true;
inline constexpr bool kBeforeHello = false;
#define KVPOOL_WIRE_OPCODES(X)                                                       \
  X(hello, 1, HelloRequest, HelloReply, kAnyPeer, kBeforeHello)                      \
  X(alloc, 2, AllocRequest, AllocReply, kAnyPeer, kAttached)                         \
  X(retain, 3, RetainRequest, RetainReply, kAnyPeer, kAttached)                      \
  X(release, 4, ReleaseRequest, ReleaseReply, kAnyPeer, kAttached)                   \
  X(lookup, 5, LookupRequest, LookupReply, kAnyPeer, kAttached)                      \
  X(publish, 6, PublishRequest, PublishReply, kAnyPeer, kAttached)                   \
  X(stats, 7, StatsRequest, StatsReply, kAnyPeer, kAttached)                         \
  X(evict, 8, EvictRequest, EvictReply, kAdminOnly, kAttached)                       \
  X(flush, 9, FlushRequest, FlushReply, kAdminOnly, kAttached)                       \
  X(sessions, 10, SessionsRequest, SessionsReply, kAnyPeer, kAttached)               \
  X(pages, 11, PagesRequest, PagesReply, kAnyPeer, kAttached)                        \
  X(copy, 12, CopyRequest, CopyReply, kAnyPeer, kAttached)                           \
  /* operations, metrics and events */                                               \
  X(prefixes, 20, PrefixesRequest, PrefixesReply, kAnyPeer, kAttached)               \
  X(reload, 21, ReloadRequest, ReloadReply, kAdminOnly, kAttached)                   \
  X(subscribe, 22, SubscribeRequest, SubscribeReply, kAnyPeer, kAttached)            \
  X(snapshot, 23, SnapshotRequest, SnapshotReply, kAnyPeer, kAttached)               \
  /* elastic pools: the pool's PoolInfo with every segment's descriptor; a resize */ \
  X(segments, 25, SegmentsRequest, SegmentsReply, kAnyPeer, kAttached)               \
  X(resize, 26, ResizeRequest, ResizeReply, kAdminOnly, kAttached)                   \
  /* hybrid models: one lookup over every group */                                   \
  X(lookup_groups, 28, GroupLookupRequest, GroupLookupReply, kAnyPeer, kAttached)    \
  /* static reservations: a block table fixed for a sequence's whole life */         \
  X(reserve, 29, ReserveRequest, ReserveReply, kAnyPeer, kAttached)                  \
  X(unreserve, 30, UnreserveRequest, UnreserveReply, kAnyPeer, kAttached)

enum class Opcode : uint16_t {
#define KVPOOL_OPCODE_ENUM(name, number, ...) name = number,
  KVPOOL_WIRE_OPCODES(KVPOOL_OPCODE_ENUM)
#undef KVPOOL_OPCODE_ENUM
  // Pushed by the daemon, never requests: events to a subscriber, a pool's new segment list.
  event_batch = 24,
  pool_changed = 27,
};

// Who may call `op` and whether it needs an attached session (the table's last columns); false
// for an opcode that is not a request.
bool opcode_admin_only(Opcode op);
bool opcode_needs_attach(Opcode op);

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t length = 0;
  uint16_t version = kProtocolVersion;
  uint16_t opcode = 0;
  uint32_t request_id = 0;
  friend constexpr bool operator==(const FrameHeader&, const FrameHeader&) = default;
};

// An error with the text that names its cause.
struct Error {
  Status status;
  std::string message;
  // An error of `code` that names no item, carrying `value` (a count, a page, a limit).
  static Error of(Errc code, std::string message, uint64_t value = 0) {
    return Error{Status(code, kNoItem, value), std::move(message)};
  }
  friend bool operator==(const Error&, const Error&) = default;
};

// Either a T or an Error.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  bool ok() const { return v_.index() == 0; }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Requests ----------------------------------------------------------------------------------

struct HelloRequest {
  std::string worker_name;
  std::string pool_name;  // empty = the daemon's default pool
  // A session of this process attached to another group of the same hybrid model: this one
  // joins it, so that lookup_groups on either takes each group's pages into that group's
  // session. 0: none.
  uint64_t link_session = 0;
  // How this worker hashes blocks (common/block_hash.h); an empty name says nothing. The daemon
  // refuses a scheme other than its own.
  HashScheme hash_scheme{};
  friend bool operator==(const HelloRequest&, const HelloRequest&) = default;
};
struct AllocRequest {
  uint32_t count = 0;
  PageHints hints = {};
  friend bool operator==(const AllocRequest&, const AllocRequest&) = default;
};
struct RetainRequest {
  std::vector<PageId> pages;
  PageHints hints = {};
  friend bool operator==(const RetainRequest&, const RetainRequest&) = default;
};
struct ReleaseRequest {
  std::vector<PageId> pages;
  friend bool operator==(const ReleaseRequest&, const ReleaseRequest&) = default;
};
struct LookupRequest {
  std::vector<BlockHash> chain;
  PageHints hints = {};
  friend bool operator==(const LookupRequest&, const LookupRequest&) = default;
};
struct PublishRequest {
  std::vector<PublishItem> items;
  PageHints hints = {};
  // What routers need of the published blocks (docs/ARCHITECTURE.md, "KV events for routers"),
  // optional. When any is set the items are one chain: item i is the child of item i − 1, item 0
  // of `parent` (absent: item 0 is its sequence's first block). `token_ids` holds every item's
  // tokens_per_page tokens in item order (or is empty); `lora_name` names the adapter the chain
  // was computed with ("" for none).
  std::optional<BlockHash> parent{};
  std::vector<uint32_t> token_ids{};
  std::string lora_name{};
  bool has_chain() const { return parent.has_value() || !token_ids.empty() || !lora_name.empty(); }
  friend bool operator==(const PublishRequest&, const PublishRequest&) = default;
};
// A hybrid model's lookup: the block chain (one hash per block, the same in every group) and
// the hit that every group can serve (docs/ARCHITECTURE.md, "Hybrid models").
struct GroupLookupRequest {
  std::vector<BlockHash> chain;
  PageHints hints = {};
  friend bool operator==(const GroupLookupRequest&, const GroupLookupRequest&) = default;
};
// A static reservation (docs/ARCHITECTURE.md, "Static reservations"): the pages of a sequence of
// up to max_tokens, held until unreserve or the session's end, its block table fixed meanwhile.
// The first seeds.size() entries are pages the session holds (a prefix hit), each taking one
// more reference; the rest are allocated.
struct ReserveRequest {
  uint32_t max_tokens = 0;
  std::vector<PageId> seeds;
  PageHints hints = {};
  friend bool operator==(const ReserveRequest&, const ReserveRequest&) = default;
};
struct UnreserveRequest {
  uint64_t reservation = 0;
  friend bool operator==(const UnreserveRequest&, const UnreserveRequest&) = default;
};
struct StatsRequest {
  friend bool operator==(const StatsRequest&, const StatsRequest&) = default;
};

struct EvictRequest {
  uint32_t count = 0;
  friend bool operator==(const EvictRequest&, const EvictRequest&) = default;
};
struct FlushRequest {
  friend bool operator==(const FlushRequest&, const FlushRequest&) = default;
};
struct SessionsRequest {
  friend bool operator==(const SessionsRequest&, const SessionsRequest&) = default;
};
struct PagesRequest {
  friend bool operator==(const PagesRequest&, const PagesRequest&) = default;
};
// Daemon-side page copies (copy-on-write, moves): src[i] → dst[i], scales included.
struct PageCopy {
  PageId src = 0;
  PageId dst = 0;
  friend bool operator==(const PageCopy&, const PageCopy&) = default;
};
struct CopyRequest {
  std::vector<PageCopy> pairs;
  friend bool operator==(const CopyRequest&, const CopyRequest&) = default;
};

// Operations, metrics and events (opcodes 20+) ----------------------------------------------

struct PrefixesRequest {
  uint32_t limit = 0;
  friend bool operator==(const PrefixesRequest&, const PrefixesRequest&) = default;
};
struct ReloadRequest {
  friend bool operator==(const ReloadRequest&, const ReloadRequest&) = default;
};
// from_seq 0 follows new events only; N ≥ 1 replays from N what the daemon's ring still holds
// (older ones arrive as a gap event first). A from_seq beyond the next sequence is refused.
struct SubscribeRequest {
  uint64_t from_seq = 0;
  friend bool operator==(const SubscribeRequest&, const SubscribeRequest&) = default;
};
struct SnapshotRequest {
  friend bool operator==(const SnapshotRequest&, const SnapshotRequest&) = default;
};
struct SegmentsRequest {
  friend bool operator==(const SegmentsRequest&, const SegmentsRequest&) = default;
};
// Resize an elastic pool by whole segments within its min and max (admin): a pool below `pages`
// grows to the first size at or above it; one above shrinks while it stays at or above it.
struct ResizeRequest {
  uint32_t pages = 0;
  friend bool operator==(const ResizeRequest&, const ResizeRequest&) = default;
};

namespace detail {
template <typename Ignored, typename... T>
struct VariantOfRest {
  using type = std::variant<T...>;
};
}  // namespace detail

// Alternative i is the request of the table's row i.
#define KVPOOL_REQUEST_TYPE(name, number, Request, ...) , Request
using Request = detail::VariantOfRest<void KVPOOL_WIRE_OPCODES(KVPOOL_REQUEST_TYPE)>::type;
#undef KVPOOL_REQUEST_TYPE

Opcode opcode_of(const Request& r);

// Replies -----------------------------------------------------------------------------------

// One piece of a pool's memory. Segments are mapped back to back in the order given.
struct SegmentInfo {
  uint64_t bytes = 0;
  std::vector<uint8_t> handle;  // cuda-ipc: the cudaIpcMemHandle_t; empty for fd backends
  // Where the segment is mapped, from the pool's base: the running sum of the sizes before it
  // for a fixed pool, its place in the reservation for an elastic one.
  uint64_t offset = 0;
  friend bool operator==(const SegmentInfo&, const SegmentInfo&) = default;
};

struct PoolInfo {
  Geometry geometry;
  KvLayout layout = KvLayout::page_major;  // how the pool's memory orders KV (geometry.h)
  uint32_t num_pages = 0;
  uint64_t page_stride = 0;    // bytes from one page to the next in the mapping
  uint64_t segment_bytes = 0;  // bytes mapped in all: the sum of the segments' bytes
  std::string pool_name;
  std::string backend;  // "host", "fake-device", "cuda-vmm", "cuda-ipc"
  std::string tenant;   // the tenant the daemon assigned from the peer's credentials
  int32_t device = -1;  // the daemon's CUDA ordinal; −1 for host memory
  std::array<uint8_t, 16> device_uuid{};  // how a worker finds that GPU (ordinals differ)
  std::vector<SegmentInfo> segments;
  // The virtual range a worker reserves and maps the segments into (segment_bytes for a fixed
  // pool); where the scales of 8-bit pools start (page p's at scales_offset + p ·
  // page_scale_bytes); the pages the pool may grow to (num_pages for a fixed pool); and the
  // version of the segment list, which every grow or shrink increments.
  uint64_t reserved_bytes = 0;
  uint64_t scales_offset = 0;
  uint32_t max_pages = 0;
  uint32_t epoch = 0;
  // A hybrid model's group: the model, this pool's index among its groups, their names (the
  // group's pool is MODEL/NAME). Empty for a plain pool.
  std::string model;
  uint32_t group = 0;
  std::vector<std::string> groups;
  // A segmented layer_major pool (an elastic one, kernels/paged_kv.h): pages per segment and
  // bytes from one segment to the next; both 0 otherwise.
  uint32_t segment_pages = 0;
  uint64_t segment_stride = 0;
  friend bool operator==(const PoolInfo&, const PoolInfo&) = default;
};

struct HelloReply {
  uint64_t session_id = 0;
  PoolInfo pool;
  friend bool operator==(const HelloReply&, const HelloReply&) = default;
};
struct AllocReply {
  std::vector<PageId> pages;
  friend bool operator==(const AllocReply&, const AllocReply&) = default;
};
struct RetainReply {
  friend bool operator==(const RetainReply&, const RetainReply&) = default;
};
struct ReleaseReply {
  friend bool operator==(const ReleaseReply&, const ReleaseReply&) = default;
};
// Where a lookup hit was found (LookupReply::tiers).
inline constexpr uint8_t kTierDevice = 0;  // the pool itself
inline constexpr uint8_t kTierHost = 1;    // the pool's host tier, promoted for this lookup
// The 8-bit pool the pool converts its evictions into (convert_evictions_to), converted back
// into a page of the pool for this lookup: its values carry the 8-bit pool's precision.
inline constexpr uint8_t kTierConverted = 2;
// The remote tier on Redis Cluster (pools[].remote_tier), fetched and copied into a new page for
// this lookup: written by this kvpoold or another one sharing the cluster.
inline constexpr uint8_t kTierRemote = 3;
// No page: a block before the window a sliding or chunked pool's hit needs, which the caller
// does not read (PagePool::lookup_window); its page is kNoPage.
inline constexpr uint8_t kTierNone = 0xFF;

struct LookupReply {
  std::vector<PageId> pages;   // the hits, in chain order (kNoPage: not needed, kTierNone)
  std::vector<uint8_t> tiers;  // one per hit: kTierDevice, kTierHost, kTierConverted, kTierRemote
  friend bool operator==(const LookupReply&, const LookupReply&) = default;
};
struct PublishReply {
  std::vector<PublishResult> results;
  friend bool operator==(const PublishReply&, const PublishReply&) = default;
};
struct StatsReply {
  uint32_t total = 0;
  uint32_t free = 0;
  uint32_t in_use = 0;
  uint32_t cached = 0;
  uint32_t sessions = 0;
  uint32_t session_held_pages = 0;  // distinct pages the asking session holds
  // The pool counter table's values, in its order (common/stats_counters.h): every counter of
  // the pool (more than this side's table when the daemon's is longer).
  std::vector<uint64_t> counters;
  // The daemon counter table's values, in its order: the daemon's sessions, events, reloads.
  std::vector<uint64_t> daemon_counters;
  // The value of the pool counter table's row `name`; 0 when the reply has no such row.
  uint64_t counter(std::string_view name) const;
  friend bool operator==(const StatsReply&, const StatsReply&) = default;
};

struct EvictReply {
  uint32_t evicted = 0;
  friend bool operator==(const EvictReply&, const EvictReply&) = default;
};
struct FlushReply {
  uint32_t flushed = 0;
  friend bool operator==(const FlushReply&, const FlushReply&) = default;
};
struct SessionInfo {
  uint64_t id = 0;
  uint32_t pid = 0;
  uint32_t uid = 0;
  uint32_t held_pages = 0;
  std::string worker;
  std::string tenant;
  std::string pool;
  friend bool operator==(const SessionInfo&, const SessionInfo&) = default;
};
struct SessionsReply {
  std::vector<SessionInfo> sessions;
  friend bool operator==(const SessionsReply&, const SessionsReply&) = default;
};
// The state of every page, in page order. Pools of more pages than fit a frame (about 8M) are
// refused with invalid_argument.
struct PagesReply {
  enum State : uint8_t { kFree = 0, kInUse = 1, kCached = 2 };
  std::vector<uint8_t> states;
  friend bool operator==(const PagesReply&, const PagesReply&) = default;
};

struct CopyReply {
  uint32_t copied = 0;
  friend bool operator==(const CopyReply&, const CopyReply&) = default;
};

// Operations, metrics and events (opcodes 20+) ----------------------------------------------

// One indexed block. depth is its position in the chains that hit it (0 = the first block, so
// the prefix it ends is depth + 1 blocks), kUnknownDepth until a lookup has hit it; idle_s is
// kNever for a block never hit.
struct PrefixEntry {
  static constexpr uint32_t kUnknownDepth = UINT32_MAX;
  static constexpr uint32_t kNever = UINT32_MAX;
  BlockHash hash;
  PageId page = kNoPage;
  uint32_t depth = kUnknownDepth;
  uint32_t hits = 0;
  uint32_t age_s = 0;  // since published
  uint32_t idle_s = kNever;
  uint8_t state = 0;  // PagesReply::State: kInUse or kCached
  std::string tenant;
  friend bool operator==(const PrefixEntry&, const PrefixEntry&) = default;
};
struct PrefixesReply {
  uint32_t indexed = 0;  // blocks indexed that the asker may see
  std::vector<PrefixEntry> entries;
  friend bool operator==(const PrefixesReply&, const PrefixesReply&) = default;
};
struct ReloadReply {
  enum Outcome : uint8_t { kApplied = 0, kRefused = 1, kNoConfigFile = 2 };
  uint8_t outcome = kApplied;
  std::string message;               // the file on success, the FILE:LINE: KEY error on refusal
  std::vector<std::string> restart;  // dotted keys that changed but wait for a restart
  friend bool operator==(const ReloadReply&, const ReloadReply&) = default;
};
struct SubscribeReply {
  uint64_t stream_id = 0;   // random per daemon start: a change means sequences restarted
  uint64_t next_seq = 0;    // the sequence the next new event will carry
  uint64_t oldest_seq = 0;  // the oldest sequence the ring still holds (= next_seq when empty)
  friend bool operator==(const SubscribeReply&, const SubscribeReply&) = default;
};
// The daemon's stats snapshot in the layout of common/stats_layout.h (what the shared-memory
// segment holds), for readers that cannot map the segment.
struct SnapshotReply {
  uint32_t layout_version = 0;
  std::vector<std::byte> bytes;
  friend bool operator==(const SnapshotReply&, const SnapshotReply&) = default;
};
// The pool as it is now; descriptor backends pass one fd per segment with it, as with hello.
struct SegmentsReply {
  PoolInfo pool;
  friend bool operator==(const SegmentsReply&, const SegmentsReply&) = default;
};
struct ResizeReply {
  uint32_t pages = 0;  // the pool's size now
  friend bool operator==(const ResizeReply&, const ResizeReply&) = default;
};
struct ReserveReply {
  uint64_t reservation = 0;   // names it to unreserve; unique within the session
  std::vector<PageId> pages;  // ceil(max_tokens / tokens_per_page) entries
  friend bool operator==(const ReserveReply&, const ReserveReply&) = default;
};
struct UnreserveReply {
  friend bool operator==(const UnreserveReply&, const UnreserveReply&) = default;
};
// One LookupReply per group of the model, in group order, each with the same number of hits;
// group g's pages are held by the model's session attached to group g.
struct GroupLookupReply {
  std::vector<LookupReply> groups;
  uint32_t hits() const {
    return groups.empty() ? 0 : static_cast<uint32_t>(groups[0].pages.size());
  }
  friend bool operator==(const GroupLookupReply&, const GroupLookupReply&) = default;
};

// Alternative i is the reply of the table's row i.
#define KVPOOL_REPLY_TYPE(name, number, Request, Reply, ...) , Reply
using Reply = detail::VariantOfRest<void KVPOOL_WIRE_OPCODES(KVPOOL_REPLY_TYPE)>::type;
#undef KVPOOL_REPLY_TYPE

Opcode opcode_of(const Reply& r);
// The opcode of variant alternative `index`, and the name of an opcode ("" when it names none).
uint16_t opcode_number(size_t index);
std::string_view opcode_name(uint16_t opcode);

// The notice the daemon pushes to every session attached to a pool whose segments changed
// (opcode pool_changed | kReplyBit, request id 0, payload u16 ok, u32 epoch), between replies,
// before any reply that hands out a page of a new segment. The client answers it with a segments
// request and maps (or unmaps) what changed before it returns that reply.
void encode_pool_changed(uint32_t epoch, std::vector<std::byte>& out);
Result<uint32_t> decode_pool_changed(const FrameHeader& header, std::span<const std::byte> payload);

// Events pushed to a subscriber (opcode event_batch). Sequence numbers increase by one per event
// of the daemon's log; a subscriber sees those of its pool (and, unless it is an admin, its
// tenant), so it may see gaps in them that are other pools' events. A kGap event says the
// subscriber fell behind the ring: `count` events were lost and `seq` is where it resumes.
struct Event {
  // kResized: an elastic pool grew or shrank by a segment; `count` is its page count after.
  enum Kind : uint8_t { kStored = 0, kRemoved = 1, kCleared = 2, kGap = 3, kResized = 4 };
  enum Cause : uint8_t { kNone = 0, kEvicted = 1, kFlushed = 2, kGrown = 3, kShrunk = 4 };
  uint64_t seq = 0;
  uint8_t kind = kStored;
  uint8_t cause = kNone;  // removed: why
  PageId page = kNoPage;  // stored, removed
  uint64_t count = 0;     // cleared: blocks removed; gap: events lost; resized: pages now
  BlockHash hash;         // stored, removed
  std::string tenant;     // stored, removed
  friend bool operator==(const Event&, const Event&) = default;
};
struct EventBatch {
  std::vector<Event> events;
  friend bool operator==(const EventBatch&, const EventBatch&) = default;
};
// "stored", "removed", "cleared", "gap", "resized" ("unknown" for another value), as tools
// print them.
const char* event_kind_name(uint8_t kind);
// "evicted", "flushed", "grown", "shrunk" ("" for none).
const char* event_cause_name(uint8_t cause);
void encode_event_batch(uint32_t request_id, const EventBatch& batch, std::vector<std::byte>& out);
// An event_batch frame's payload (header.opcode must be event_batch | kReplyBit).
Result<EventBatch> decode_event_batch(const FrameHeader& header,
                                      std::span<const std::byte> payload);

// Encoding: appends one whole frame (header + payload) to `out`. ----------------------------

void encode_request(uint32_t request_id, const Request& request, std::vector<std::byte>& out);
void encode_reply(uint32_t request_id, const Reply& reply, std::vector<std::byte>& out);
// An error reply to a request of `opcode` (any u16, so unknown opcodes can be answered too).
void encode_error(uint32_t request_id, uint16_t opcode, const Error& error,
                  std::vector<std::byte>& out);

// Decoding ----------------------------------------------------------------------------------

// The header of a frame from its first kHeaderBytes bytes: checks magic (malformed_frame),
// version (unsupported_version) and length (frame_too_large). `bytes` must hold at least
// kHeaderBytes bytes (invalid_argument otherwise).
Result<FrameHeader> decode_header(std::span<const std::byte> bytes);
// The header's fields as they are, unchecked (what an error reply to a bad header echoes).
// Precondition: bytes.size() >= kHeaderBytes.
FrameHeader read_header_fields(std::span<const std::byte> bytes);

// A request from its header and exactly header.length payload bytes: unknown_opcode for an
// opcode that is not a request, malformed_frame for a payload that does not decode, is cut
// short, has bytes left over, or carries a count above kMaxBatch or a name above kMaxNameBytes.
Result<Request> decode_request(const FrameHeader& header, std::span<const std::byte> payload);

// A reply, for the client: the decoded body, or the Error it carries (status and message as the
// daemon sent them), or malformed_frame / unknown_opcode when the bytes are wrong.
Result<Reply> decode_reply(const FrameHeader& header, std::span<const std::byte> payload);

}  // namespace kvpool::wire

// Tests of the wire codec (common/wire/protocol.h): round trips of every message, the exact bytes
// of a few frames, every decode error, and a deterministic random-bytes robustness loop. The binary
// also runs under ASan+UBSan; every decode here is handed an exactly sized heap buffer, so a read
// past the span is a reported heap-buffer-overflow, not a silent read of spare capacity.
#include "common/wire/protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KVPOOL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVPOOL_TEST_ASAN 1
#endif
#endif

#ifdef KVPOOL_TEST_ASAN
// From <sanitizer/allocator_interface.h>, which not every toolchain ships.
// NOLINTNEXTLINE(bugprone-reserved-identifier)
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             size_t),
                                                         void (*free_hook)(const volatile void*));
#endif

namespace kvpool::wire {
namespace {

using Bytes = std::vector<std::byte>;

// Little-endian payload builder, independent of the codec.
class Builder {
 public:
  Builder& u8(uint8_t v) { return put(&v, 1); }
  Builder& u16(uint16_t v) { return put(&v, 2); }
  Builder& u32(uint32_t v) { return put(&v, 4); }
  Builder& u64(uint64_t v) { return put(&v, 8); }
  Builder& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    return put(s.data(), s.size());
  }
  Bytes bytes() const { return b_; }
  size_t size() const { return b_.size(); }

 private:
  Builder& put(const void* p, size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b_.insert(b_.end(), c, c + n);
    return *this;
  }
  Bytes b_;
};

Bytes hex_bytes(std::initializer_list<int> v) {
  Bytes out;
  for (int x : v)
    out.push_back(static_cast<std::byte>(x));
  return out;
}

// A fresh heap buffer of exactly these bytes (so ASan sees any read past its end).
Bytes exact(std::span<const std::byte> s) {
  return Bytes(s.begin(), s.end());
}

FrameHeader header_for(uint16_t opcode, size_t length) {
  FrameHeader h;
  h.opcode = opcode;
  h.length = static_cast<uint32_t>(length);
  h.request_id = 42;
  return h;
}

Result<Request> decode_request_bytes(uint16_t opcode, const Bytes& payload) {
  return decode_request(header_for(opcode, payload.size()), payload);
}
Result<Reply> decode_reply_bytes(uint16_t opcode, const Bytes& payload) {
  return decode_reply(header_for(opcode, payload.size()), payload);
}

uint16_t req_op(Opcode op) {
  return static_cast<uint16_t>(op);
}
uint16_t rep_op(Opcode op) {
  return static_cast<uint16_t>(static_cast<uint16_t>(op) | kReplyBit);
}

Bytes encode(uint32_t id, const Request& r) {
  Bytes out;
  encode_request(id, r, out);
  return out;
}
Bytes encode(uint32_t id, const Reply& r) {
  Bytes out;
  encode_reply(id, r, out);
  return out;
}

std::span<const std::byte> payload_of(const Bytes& frame) {
  return std::span<const std::byte>(frame).subspan(kHeaderBytes);
}

::testing::AssertionResult is_error(Errc code, const Error& e) {
  if (e.status.code() != code) {
    return ::testing::AssertionFailure() << "expected " << errc_name(code) << ", got "
                                         << errc_name(e.status.code()) << ": " << e.message;
  }
  if (e.message.empty()) return ::testing::AssertionFailure() << "empty error message";
  return ::testing::AssertionSuccess();
}
template <typename T>
::testing::AssertionResult fails_with(Errc code, const Result<T>& r) {
  if (r.ok()) return ::testing::AssertionFailure() << "decoded, expected " << errc_name(code);
  return is_error(code, r.error());
}

std::string name_of(char c, size_t n) {
  return std::string(n, c);
}

std::vector<Request> sample_requests() {
  std::vector<Request> v;
  v.emplace_back(HelloRequest{});
  v.emplace_back(HelloRequest{"worker-0", "default"});
  v.emplace_back(HelloRequest{name_of('w', kMaxNameBytes), name_of('p', kMaxNameBytes)});
  v.emplace_back(HelloRequest{std::string("a\0b", 3), ""});
  v.emplace_back(AllocRequest{0});
  v.emplace_back(AllocRequest{1});
  v.emplace_back(AllocRequest{kMaxBatch});
  v.emplace_back(RetainRequest{});
  v.emplace_back(RetainRequest{{7}});
  v.emplace_back(RetainRequest{{0, 1, 0x01020304, kNoPage, 5, 5}});
  v.emplace_back(ReleaseRequest{});
  v.emplace_back(ReleaseRequest{{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}});
  v.emplace_back(LookupRequest{});
  v.emplace_back(LookupRequest{{BlockHash{1, 2}}});
  v.emplace_back(LookupRequest{{BlockHash{0, 0}, BlockHash{UINT64_MAX, UINT64_MAX},
                                BlockHash{0x0123456789abcdefull, 0xfedcba9876543210ull}}});
  v.emplace_back(PublishRequest{});
  v.emplace_back(PublishRequest{{PublishItem{3, BlockHash{4, 5}}}});
  v.emplace_back(PublishRequest{{PublishItem{0, BlockHash{1, 1}}, PublishItem{kNoPage, {}},
                                 PublishItem{77, BlockHash{UINT64_MAX, 0}}}});
  // With hints: the count carries kHintsFlag and the hints follow the items.
  v.emplace_back(AllocRequest{3, PageHints{Priority::system, 0}});
  v.emplace_back(AllocRequest{0, PageHints{Priority::none, 60000}});
  v.emplace_back(RetainRequest{{4, 5}, PageHints{Priority::conversation, UINT32_MAX}});
  v.emplace_back(LookupRequest{{BlockHash{1, 2}}, PageHints{Priority::one_off, 1}});
  v.emplace_back(PublishRequest{{PublishItem{3, BlockHash{4, 5}}}, PageHints{Priority::system, 7}});
  v.emplace_back(StatsRequest{});
  v.emplace_back(EvictRequest{0});
  v.emplace_back(EvictRequest{UINT32_MAX});
  v.emplace_back(FlushRequest{});
  v.emplace_back(SessionsRequest{});
  v.emplace_back(PagesRequest{});
  v.emplace_back(CopyRequest{});
  v.emplace_back(CopyRequest{{PageCopy{1, 2}, PageCopy{UINT32_MAX, 0}, PageCopy{7, 7}}});
  v.emplace_back(PrefixesRequest{1});
  v.emplace_back(PrefixesRequest{kMaxPrefixes});
  v.emplace_back(ReloadRequest{});
  v.emplace_back(SubscribeRequest{0});
  v.emplace_back(SubscribeRequest{UINT64_MAX});
  v.emplace_back(SnapshotRequest{});
  v.emplace_back(SegmentsRequest{});
  v.emplace_back(ResizeRequest{0});
  v.emplace_back(ResizeRequest{UINT32_MAX});
  v.emplace_back(GroupLookupRequest{});
  v.emplace_back(GroupLookupRequest{{BlockHash{1, 2}, BlockHash{3, 4}}});
  v.emplace_back(GroupLookupRequest{{BlockHash{1, 2}}, PageHints{Priority::conversation, 5}});
  v.emplace_back(ReserveRequest{1, {}});
  v.emplace_back(ReserveRequest{UINT32_MAX, {kNoPage, 3, 4}, PageHints{Priority::system, 0}});
  v.emplace_back(UnreserveRequest{0});
  v.emplace_back(UnreserveRequest{UINT64_MAX});
  return v;
}

PoolInfo sample_pool(KvDtype dtype) {
  PoolInfo p;
  p.geometry = Geometry{32, 8, 128, 16, dtype};
  p.num_pages = 4096;
  p.page_stride = 2ull << 20;
  p.segment_bytes = 8ull << 30;
  p.pool_name = "default";
  p.backend = "host";
  p.tenant = "tenant-a";
  p.segments = {SegmentInfo{8ull << 30, {}, 0}};
  p.reserved_bytes = 8ull << 30;
  p.scales_offset = 0x0102030405060708ull;  // distinct values: a swapped field shows
  p.max_pages = 8192;
  p.epoch = 3;
  return p;
}

// An elastic pool: two segments of the pages region and the scales region, inside a larger
// reservation, listed out of offset order.
PoolInfo sample_elastic_pool() {
  PoolInfo p = sample_pool(KvDtype::int8);
  p.backend = "fake-device";
  p.num_pages = 64;
  p.max_pages = 1024;
  p.epoch = UINT32_MAX;
  p.reserved_bytes = 4ull << 30;
  p.scales_offset = 2ull << 30;
  p.segments = {SegmentInfo{64ull << 20, {}, 0}, SegmentInfo{2ull << 20, {}, 2ull << 30},
                SegmentInfo{64ull << 20, {}, 64ull << 20}};
  p.segment_bytes = (128ull + 2) << 20;
  return p;
}

// A group of a hybrid model.
PoolInfo sample_group_pool() {
  PoolInfo p = sample_elastic_pool();
  p.pool_name = "gemma-3/global";
  p.model = "gemma-3";
  p.group = 1;
  p.groups = {"local", "global"};
  return p;
}

// A cuda-ipc pool: a device, its UUID, and a segment that carries a 64-byte handle.
PoolInfo sample_ipc_pool() {
  PoolInfo p = sample_pool(KvDtype::bf16);
  p.backend = "cuda-ipc";
  p.device = 3;
  for (size_t i = 0; i < p.device_uuid.size(); ++i)
    p.device_uuid[i] = static_cast<uint8_t>(0xa0 + i);
  p.segments[0].handle.assign(kMaxHandleBytes, 0x5a);
  return p;
}

std::vector<Reply> sample_replies() {
  std::vector<Reply> v;
  for (KvDtype d : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    v.emplace_back(HelloReply{0x1122334455667788ull, sample_pool(d)});
  }
  v.emplace_back(HelloReply{});
  PoolInfo layer_major = sample_pool(KvDtype::fp8_e4m3);
  layer_major.layout = KvLayout::layer_major;
  v.emplace_back(HelloReply{7, layer_major});
  layer_major.segment_pages = 341;  // an elastic one: segmented
  layer_major.segment_stride = 6ull << 20;
  v.emplace_back(HelloReply{7, layer_major});
  PoolInfo sliding = sample_pool(KvDtype::bf16);
  sliding.geometry.kind = AttentionKind::sliding;
  sliding.geometry.window = 4096;
  v.emplace_back(HelloReply{8, sliding});
  PoolInfo chunked = sample_pool(KvDtype::fp16);
  chunked.geometry.kind = AttentionKind::chunked;
  chunked.geometry.window = UINT32_MAX;
  v.emplace_back(HelloReply{9, chunked});
  v.emplace_back(HelloReply{5, sample_ipc_pool()});
  PoolInfo vmm = sample_pool(KvDtype::fp16);
  vmm.backend = "cuda-vmm";
  vmm.segments.assign(kMaxSegments, SegmentInfo{2u << 20, {}});
  v.emplace_back(HelloReply{6, vmm});
  v.emplace_back(CopyReply{0});
  v.emplace_back(CopyReply{UINT32_MAX});
  PoolInfo big = sample_pool(KvDtype::bf16);
  big.pool_name = name_of('p', kMaxNameBytes);
  big.backend = name_of('b', kMaxNameBytes);
  big.tenant = name_of('t', kMaxNameBytes);
  big.num_pages = UINT32_MAX;
  big.page_stride = UINT64_MAX;
  v.emplace_back(HelloReply{UINT64_MAX, big});
  v.emplace_back(AllocReply{});
  v.emplace_back(AllocReply{{1, 2, 3, kNoPage}});
  v.emplace_back(RetainReply{});
  v.emplace_back(ReleaseReply{});
  v.emplace_back(LookupReply{});
  v.emplace_back(LookupReply{{10, 11, 12}, {0, 0, 1}});
  v.emplace_back(PublishReply{});
  v.emplace_back(PublishReply{{PublishResult{PublishResult::Kind::stored, 4},
                               PublishResult{PublishResult::Kind::duplicate, 9},
                               PublishResult{PublishResult::Kind::stored, kNoPage}}});
  StatsReply s;
  s.total = 1;
  s.free = 2;
  s.in_use = 3;
  s.cached = 4;
  s.sessions = 5;
  s.session_held_pages = 15;
  s.counters = {16, 17, 18};
  s.daemon_counters = {19, UINT64_MAX};
  v.emplace_back(s);
  StatsReply m;
  m.total = m.free = m.in_use = m.cached = m.sessions = m.session_held_pages = UINT32_MAX;
  m.counters.assign(25, UINT64_MAX);
  v.emplace_back(m);
  v.emplace_back(EvictReply{0});
  v.emplace_back(EvictReply{123456});
  v.emplace_back(FlushReply{7});
  v.emplace_back(PagesReply{});
  v.emplace_back(PagesReply{{0, 1, 2, 2, 1, 0, 0}});
  v.emplace_back(SessionsReply{});
  v.emplace_back(SessionsReply{
      {SessionInfo{1, 4242, 1000, 17, "worker-a", "default", "pool"},
       SessionInfo{UINT64_MAX, 0, 0, 0, "", "", ""},
       SessionInfo{9, 1, 2, 3, name_of('w', kMaxNameBytes), "t", name_of('p', kMaxNameBytes)}}});
  v.emplace_back(PrefixesReply{});
  v.emplace_back(PrefixesReply{
      7,
      {PrefixEntry{BlockHash{1, 2}, 3, 0, 9, 12, 1, PagesReply::kCached, "default"},
       PrefixEntry{BlockHash{UINT64_MAX, 0}, kNoPage, PrefixEntry::kUnknownDepth, 0, UINT32_MAX,
                   PrefixEntry::kNever, PagesReply::kInUse, name_of('t', kMaxNameBytes)}}});
  v.emplace_back(ReloadReply{});
  v.emplace_back(ReloadReply{ReloadReply::kRefused, "f.yaml:3: limits.x: unknown key", {}});
  v.emplace_back(ReloadReply{ReloadReply::kApplied, "f.yaml", {"pools", "socket.path"}});
  v.emplace_back(ReloadReply{ReloadReply::kNoConfigFile, "", {}});
  v.emplace_back(SubscribeReply{0x1234, 1, 1});
  v.emplace_back(SubscribeReply{UINT64_MAX, UINT64_MAX, 0});
  v.emplace_back(SnapshotReply{});
  v.emplace_back(SnapshotReply{1, hex_bytes({1, 2, 3, 0, 0xff})});
  v.emplace_back(SegmentsReply{});
  v.emplace_back(SegmentsReply{sample_pool(KvDtype::fp16)});
  v.emplace_back(SegmentsReply{sample_elastic_pool()});
  v.emplace_back(SegmentsReply{sample_ipc_pool()});
  v.emplace_back(SegmentsReply{sample_group_pool()});
  v.emplace_back(HelloReply{7, sample_group_pool()});
  v.emplace_back(GroupLookupReply{{LookupReply{}}});
  v.emplace_back(ReserveReply{7, {kNoPage, 1, 2}});
  v.emplace_back(UnreserveReply{});
  v.emplace_back(GroupLookupReply{{LookupReply{{kNoPage, 4}, {kTierNone, kTierDevice}},
                                   LookupReply{{8, 9}, {kTierDevice, kTierDevice}}}});
  v.emplace_back(ResizeReply{0});
  v.emplace_back(ResizeReply{UINT32_MAX});
  return v;
}

EventBatch sample_events() {
  EventBatch b;
  b.events.push_back(Event{1, Event::kStored, Event::kNone, 4, 0, BlockHash{5, 6}, "default"});
  b.events.push_back(Event{2, Event::kRemoved, Event::kEvicted, 4, 0, BlockHash{5, 6}, "t"});
  b.events.push_back(Event{3, Event::kRemoved, Event::kFlushed, 9, 0, BlockHash{}, ""});
  b.events.push_back(Event{9, Event::kCleared, Event::kNone, kNoPage, 12, BlockHash{}, ""});
  b.events.push_back(Event{UINT64_MAX, Event::kGap, Event::kNone, kNoPage, UINT64_MAX, {}, ""});
  return b;
}

// Round trips ----------------------------------------------------------------------------------

TEST(ProtocolRoundTrip, OpcodeIsAlternativePlusOne) {
  EXPECT_EQ(opcode_of(Request{HelloRequest{}}), Opcode::hello);
  EXPECT_EQ(opcode_of(Request{AllocRequest{}}), Opcode::alloc);
  EXPECT_EQ(opcode_of(Request{RetainRequest{}}), Opcode::retain);
  EXPECT_EQ(opcode_of(Request{ReleaseRequest{}}), Opcode::release);
  EXPECT_EQ(opcode_of(Request{LookupRequest{}}), Opcode::lookup);
  EXPECT_EQ(opcode_of(Request{PublishRequest{}}), Opcode::publish);
  EXPECT_EQ(opcode_of(Request{StatsRequest{}}), Opcode::stats);
  EXPECT_EQ(opcode_of(Reply{HelloReply{}}), Opcode::hello);
  EXPECT_EQ(opcode_of(Reply{AllocReply{}}), Opcode::alloc);
  EXPECT_EQ(opcode_of(Reply{RetainReply{}}), Opcode::retain);
  EXPECT_EQ(opcode_of(Reply{ReleaseReply{}}), Opcode::release);
  EXPECT_EQ(opcode_of(Reply{LookupReply{}}), Opcode::lookup);
  EXPECT_EQ(opcode_of(Reply{PublishReply{}}), Opcode::publish);
  EXPECT_EQ(opcode_of(Reply{StatsReply{}}), Opcode::stats);
}

TEST(ProtocolRoundTrip, OpcodesOfTheOperationsBlockStartAt20) {
  EXPECT_EQ(opcode_of(Request{PrefixesRequest{}}), Opcode::prefixes);
  EXPECT_EQ(opcode_of(Request{ReloadRequest{}}), Opcode::reload);
  EXPECT_EQ(opcode_of(Request{SubscribeRequest{}}), Opcode::subscribe);
  EXPECT_EQ(opcode_of(Request{SnapshotRequest{}}), Opcode::snapshot);
  EXPECT_EQ(opcode_of(Reply{SnapshotReply{}}), Opcode::snapshot);
  EXPECT_EQ(static_cast<uint16_t>(Opcode::prefixes), 20);
  EXPECT_EQ(opcode_number(0), 1);
  EXPECT_EQ(opcode_number(11), 12);  // copy, the last of the pool operations
  EXPECT_EQ(opcode_number(12), 20);
  EXPECT_EQ(opcode_number(99), 0);
  EXPECT_EQ(opcode_name(20), "prefixes");
  EXPECT_EQ(opcode_name(24), "event_batch");
  EXPECT_EQ(opcode_name(12), "copy");
  EXPECT_EQ(opcode_name(13), "");
}

TEST(ProtocolRoundTrip, EventBatch) {
  Bytes frame;
  encode_event_batch(77, sample_events(), frame);
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h.value().opcode, static_cast<uint16_t>(Opcode::event_batch) | kReplyBit);
  EXPECT_EQ(h.value().request_id, 77u);
  const Bytes payload = exact(payload_of(frame));
  auto b = decode_event_batch(h.value(), payload);
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_EQ(b.value(), sample_events());
  // Not a request, and not a reply either: a client must read it with decode_event_batch.
  EXPECT_TRUE(fails_with(Errc::unknown_opcode, decode_request(h.value(), payload)));
  EXPECT_FALSE(decode_reply(h.value(), payload).ok());
  // Every cut fails cleanly.
  for (size_t cut = 0; cut < payload.size(); ++cut) {
    FrameHeader hh = h.value();
    hh.length = static_cast<uint32_t>(cut);
    const Bytes part = exact(std::span<const std::byte>(payload).first(cut));
    EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_event_batch(hh, part))) << cut;
  }
  // A bad kind is named.
  Bytes bad = payload;
  bad[2 + 4 + 8] = std::byte{9};
  auto r = decode_event_batch(h.value(), exact(bad));
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("kind 9"), std::string::npos) << r.error().message;
}

// The opcode table's columns: only the operator's calls are admin-only, only hello may come
// before hello, and the pushed frames are no requests at all.
TEST(ProtocolOpcodeTable, ColumnsSayWhoMayCallAndWhen) {
  std::vector<std::string_view> admin;
  std::vector<std::string_view> before_hello;
  for (size_t i = 0; opcode_number(i) != 0; ++i) {
    const auto op = static_cast<Opcode>(opcode_number(i));
    if (opcode_admin_only(op)) admin.push_back(opcode_name(opcode_number(i)));
    if (!opcode_needs_attach(op)) before_hello.push_back(opcode_name(opcode_number(i)));
  }
  EXPECT_EQ(admin, (std::vector<std::string_view>{"evict", "flush", "reload", "resize"}));
  EXPECT_EQ(before_hello, (std::vector<std::string_view>{"hello"}));
  for (const Opcode pushed : {Opcode::event_batch, Opcode::pool_changed}) {
    EXPECT_FALSE(opcode_admin_only(pushed));
    EXPECT_FALSE(opcode_needs_attach(pushed));
  }
}

// Elastic pools -------------------------------------------------------------------------------

TEST(ProtocolRoundTrip, OpcodesOfElasticPools) {
  EXPECT_EQ(opcode_of(Request{SegmentsRequest{}}), Opcode::segments);
  EXPECT_EQ(opcode_of(Request{ResizeRequest{}}), Opcode::resize);
  EXPECT_EQ(opcode_of(Reply{SegmentsReply{}}), Opcode::segments);
  EXPECT_EQ(opcode_of(Reply{ResizeReply{}}), Opcode::resize);
  EXPECT_EQ(static_cast<uint16_t>(Opcode::segments), 25);
  EXPECT_EQ(static_cast<uint16_t>(Opcode::resize), 26);
  EXPECT_EQ(opcode_name(25), "segments");
  EXPECT_EQ(opcode_name(26), "resize");
  EXPECT_EQ(opcode_name(27), "pool_changed");
  EXPECT_EQ(opcode_name(28), "lookup_groups");
  EXPECT_EQ(opcode_of(Request{GroupLookupRequest{}}), Opcode::lookup_groups);
  EXPECT_EQ(opcode_name(29), "reserve");
  EXPECT_EQ(opcode_name(30), "unreserve");
  EXPECT_EQ(opcode_name(31), "");
}

TEST(ProtocolRoundTrip, ExactBytesOfResizeAndSegments) {
  EXPECT_EQ(exact(payload_of(encode(1, Request{ResizeRequest{0x01020304}}))),
            Builder().u32(0x01020304).bytes());
  EXPECT_TRUE(payload_of(encode(1, Request{SegmentsRequest{}})).empty());
  EXPECT_EQ(exact(payload_of(encode(1, Reply{ResizeReply{7}}))), Builder().u16(0).u32(7).bytes());
  // A segments reply is the hello reply's PoolInfo without the session id.
  const PoolInfo pool = sample_elastic_pool();
  const Bytes hello = encode(1, Reply{HelloReply{9, pool}});
  const Bytes segments = encode(1, Reply{SegmentsReply{pool}});
  Bytes want = Builder().u16(0).bytes();
  want.insert(want.end(), payload_of(hello).begin() + 2 + 8, payload_of(hello).end());
  EXPECT_EQ(exact(payload_of(segments)), want);
}

TEST(ProtocolPoolChanged, RoundTrip) {
  for (uint32_t epoch : {0u, 1u, 0x01020304u, UINT32_MAX}) {
    Bytes frame;
    encode_pool_changed(epoch, frame);
    auto h = decode_header(frame);
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_EQ(h.value().opcode, rep_op(Opcode::pool_changed));
    EXPECT_EQ(h.value().request_id, 0u);
    EXPECT_EQ(exact(payload_of(frame)), Builder().u16(0).u32(epoch).bytes());
    auto e = decode_pool_changed(h.value(), exact(payload_of(frame)));
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(e.value(), epoch);
    // Neither a request nor a reply: a client reads it with decode_pool_changed.
    EXPECT_FALSE(decode_reply(h.value(), exact(payload_of(frame))).ok());
    EXPECT_TRUE(fails_with(Errc::unknown_opcode,
                           decode_request_bytes(req_op(Opcode::pool_changed), Bytes{})));
  }
}

TEST(ProtocolPoolChanged, WrongOpcodeIsRefused) {
  const Bytes payload = Builder().u16(0).u32(5).bytes();
  for (uint16_t op : {req_op(Opcode::pool_changed), rep_op(Opcode::segments),
                      rep_op(Opcode::event_batch), uint16_t{0}}) {
    const auto r = decode_pool_changed(header_for(op, payload.size()), payload);
    EXPECT_TRUE(fails_with(Errc::unknown_opcode, r)) << op;
  }
}

TEST(ProtocolPoolChanged, BadStatusIsRefused) {
  const uint16_t op = rep_op(Opcode::pool_changed);
  const Bytes payload = Builder().u16(static_cast<uint16_t>(Errc::internal)).u32(5).bytes();
  const auto r = decode_pool_changed(header_for(op, payload.size()), payload);
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("not ok"), std::string::npos) << r.error().message;
}

TEST(ProtocolPoolChanged, TruncatedOrLongPayloadsAreRefused) {
  const uint16_t op = rep_op(Opcode::pool_changed);
  const Bytes whole = Builder().u16(0).u32(5).bytes();
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    const Bytes part = exact(std::span<const std::byte>(whole).first(cut));
    EXPECT_TRUE(
        fails_with(Errc::malformed_frame, decode_pool_changed(header_for(op, part.size()), part)))
        << cut;
  }
  Bytes longer = whole;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(fails_with(Errc::malformed_frame,
                         decode_pool_changed(header_for(op, longer.size()), longer)));
  // A header whose length disagrees with the bytes given.
  EXPECT_TRUE(fails_with(Errc::malformed_frame,
                         decode_pool_changed(header_for(op, whole.size() + 1), whole)));
}

TEST(ProtocolDecodeRequest, PrefixesLimitIsBounded) {
  for (uint32_t limit : {0u, kMaxPrefixes + 1}) {
    const Bytes payload = Builder().u32(limit).bytes();
    auto r = decode_request(header_for(static_cast<uint16_t>(Opcode::prefixes), payload.size()),
                            payload);
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r)) << limit;
    EXPECT_NE(r.error().message.find("limit"), std::string::npos);
  }
}

TEST(ProtocolDecodeReply, ReloadOutcomeAndSnapshotLengthAreChecked) {
  const uint16_t reload = static_cast<uint16_t>(Opcode::reload) | kReplyBit;
  Bytes p = Builder().u16(0).u8(3).str("x").u32(0).bytes();
  EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_reply(header_for(reload, p.size()), p)));
  const uint16_t snap = static_cast<uint16_t>(Opcode::snapshot) | kReplyBit;
  p = Builder().u16(0).u32(1).u32(100).u8(1).bytes();  // 100 bytes announced, 1 present
  EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_reply(header_for(snap, p.size()), p)));
}

TEST(ProtocolRoundTrip, EveryRequest) {
  uint32_t id = 1000;
  for (const Request& req : sample_requests()) {
    SCOPED_TRACE("request alternative " + std::to_string(req.index()));
    const Bytes frame = encode(++id, req);
    auto h = decode_header(frame);
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_EQ(h.value().magic, kFrameMagic);
    EXPECT_EQ(h.value().version, kProtocolVersion);
    EXPECT_EQ(h.value().opcode, static_cast<uint16_t>(opcode_of(req)));
    EXPECT_EQ(h.value().request_id, id);
    EXPECT_EQ(h.value().length, frame.size() - kHeaderBytes);
    const Bytes payload = exact(payload_of(frame));
    auto r = decode_request(h.value(), payload);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value(), req);
  }
}

TEST(ProtocolRoundTrip, EveryReply) {
  uint32_t id = 0;
  for (const Reply& rep : sample_replies()) {
    SCOPED_TRACE("reply alternative " + std::to_string(rep.index()));
    const Bytes frame = encode(++id, rep);
    auto h = decode_header(frame);
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_EQ(h.value().opcode, static_cast<uint16_t>(opcode_of(rep)) | kReplyBit);
    EXPECT_EQ(h.value().request_id, id);
    EXPECT_EQ(h.value().length, frame.size() - kHeaderBytes);
    const Bytes payload = exact(payload_of(frame));
    auto r = decode_reply(h.value(), payload);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r.value(), rep);
  }
}

// A lookup reply's tier bytes are checked like every enumeration.
TEST(ProtocolRoundTrip, LookupReplyRefusesAnUnknownTier) {
  Bytes frame = encode(7, Reply{LookupReply{{4, 5}, {kTierConverted, kTierRemote}}});
  const auto known = decode_reply(decode_header(frame).value(), exact(payload_of(frame)));
  ASSERT_TRUE(known.ok()) << known.error().message;
  EXPECT_EQ(std::get<LookupReply>(known.value()).tiers,
            (std::vector<uint8_t>{kTierConverted, kTierRemote}));
  frame.back() = std::byte{4};
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok());
  const auto r = decode_reply(h.value(), exact(payload_of(frame)));
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("tier 4"), std::string::npos) << r.error().message;
  // A reply built without tiers says every hit came from the device tier.
  const Bytes plain = encode(7, Reply{LookupReply{{4, 5}, {}}});
  const auto d = decode_reply(decode_header(plain).value(), exact(payload_of(plain)));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(std::get<LookupReply>(d.value()).tiers, (std::vector<uint8_t>{0, 0}));
  // A hole (a block before a sliding window's hit) is kNoPage with tier none, both or neither.
  const Bytes hole = encode(7, Reply{LookupReply{{kNoPage, 5}, {kTierNone, kTierDevice}}});
  const auto ok = decode_reply(decode_header(hole).value(), exact(payload_of(hole)));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(std::get<LookupReply>(ok.value()).pages, (std::vector<PageId>{kNoPage, 5}));
  for (const LookupReply& bad : {LookupReply{{kNoPage, 5}, {kTierDevice, kTierDevice}},
                                 LookupReply{{4, 5}, {kTierNone, kTierDevice}}}) {
    const Bytes f = encode(7, Reply{bad});
    const auto e = decode_reply(decode_header(f).value(), exact(payload_of(f)));
    ASSERT_TRUE(fails_with(Errc::malformed_frame, e));
    EXPECT_NE(e.error().message.find("goes with tier none"), std::string::npos)
        << e.error().message;
  }
}

TEST(ProtocolRoundTrip, EncodeAppendsWholeFrames) {
  Bytes out = hex_bytes({0xaa, 0xbb, 0xcc});
  const Request a = ReleaseRequest{{1, 2, 3}};
  const Reply b = LookupReply{{4, 5}, {0, 0}};
  const Error c{Status(Errc::out_of_pages, kNoItem, 12), "out of pages"};
  encode_request(1, a, out);
  encode_reply(2, b, out);
  encode_error(3, req_op(Opcode::alloc), c, out);
  ASSERT_GE(out.size(), 3u);
  EXPECT_EQ(out[0], std::byte{0xaa});
  EXPECT_EQ(out[2], std::byte{0xcc});
  std::span<const std::byte> rest = std::span<const std::byte>(out).subspan(3);
  for (int i = 0; i < 3; ++i) {
    auto h = decode_header(rest);
    ASSERT_TRUE(h.ok()) << h.error().message;
    EXPECT_EQ(h.value().request_id, static_cast<uint32_t>(i + 1));
    const auto payload = rest.subspan(kHeaderBytes, h.value().length);
    if (i == 0) {
      auto r = decode_request(h.value(), payload);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r.value(), a);
    } else if (i == 1) {
      auto r = decode_reply(h.value(), payload);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r.value(), b);
    } else {
      auto r = decode_reply(h.value(), payload);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error(), c);
    }
    rest = rest.subspan(kHeaderBytes + h.value().length);
  }
  EXPECT_TRUE(rest.empty());
}

// The exact bytes, written out by hand from the layout in protocol.h.
TEST(ProtocolRoundTrip, ExactBytesOfReleaseRequest) {
  const Bytes frame = encode(0x0a0b0c0d, Request{ReleaseRequest{{1, 0x01020304}}});
  const Bytes want = hex_bytes({'K',  'V',  'P',  'L',                 // magic
                                12,   0,    0,    0,                   // length
                                13,   0,                               // version
                                4,    0,                               // opcode release
                                0x0d, 0x0c, 0x0b, 0x0a,                // request id
                                2,    0,    0,    0,                   // n
                                1,    0,    0,    0,    4, 3, 2, 1});  // pages
  EXPECT_EQ(frame, want);
}

TEST(ProtocolRoundTrip, ExactBytesOfHelloAndPublish) {
  const Bytes hello = encode(1, Request{HelloRequest{"ab", "c"}});
  const Bytes hello_payload = Builder().str("ab").str("c").bytes();
  EXPECT_EQ(exact(payload_of(hello)), hello_payload);

  const Bytes publish =
      encode(1, Request{PublishRequest{{PublishItem{5, BlockHash{0x1111, 0x2222}}}}});
  EXPECT_EQ(exact(payload_of(publish)), Builder().u32(1).u32(5).u64(0x1111).u64(0x2222).bytes());

  const Bytes lookup = encode(1, Request{LookupRequest{{BlockHash{7, 8}, BlockHash{9, 10}}}});
  EXPECT_EQ(exact(payload_of(lookup)), Builder().u32(2).u64(7).u64(8).u64(9).u64(10).bytes());

  const Bytes pub_reply = encode(1, Reply{PublishReply{{{PublishResult::Kind::duplicate, 6}}}});
  EXPECT_EQ(exact(payload_of(pub_reply)), Builder().u16(0).u32(1).u8(1).u32(6).bytes());

  const Bytes hello_reply = encode(1, Reply{HelloReply{9, sample_pool(KvDtype::fp8_e4m3)}});
  const Bytes want = Builder()
                         .u16(0)
                         .u64(9)
                         .u32(32)
                         .u32(8)
                         .u32(128)
                         .u32(16)
                         .u8(2)   // fp8_e4m3
                         .u8(0)   // page_major
                         .u8(0)   // attention kind full
                         .u32(0)  // no window
                         .u32(4096)
                         .u64(2ull << 20)
                         .u64(8ull << 30)
                         .str("default")
                         .str("host")
                         .str("tenant-a")
                         .u32(UINT32_MAX)  // device −1: host memory
                         .u64(0)
                         .u64(0)                      // device uuid
                         .u64(8ull << 30)             // reserved_bytes
                         .u64(0x0102030405060708ull)  // scales_offset
                         .u32(8192)                   // max_pages
                         .u32(3)                      // epoch
                         .u32(1)                      // one segment
                         .u64(0)                      // at offset 0
                         .u64(8ull << 30)
                         .u32(0)   // of 8 GiB, no handle
                         .str("")  // no model
                         .u32(0)   // group 0
                         .u32(0)   // of no groups
                         .u32(0)   // not segmented
                         .u64(0)
                         .bytes();
  EXPECT_EQ(exact(payload_of(hello_reply)), want);

  const Bytes copy = encode(1, Request{CopyRequest{{PageCopy{3, 4}}}});
  EXPECT_EQ(exact(payload_of(copy)), Builder().u32(1).u32(3).u32(4).bytes());

  const Bytes stats = encode(1, Reply{StatsReply{}});
  EXPECT_EQ(stats.size(), kHeaderBytes + 2 + size_t{6} * 4 + 4 + 4);  // n = m = 0
}

TEST(ProtocolRoundTrip, StatsReplyNamesItsCountersByThePoolTable) {
  StatsReply s;
  s.counters = {7, 8, 9, 10};  // lookups, lookup_blocks, hit_blocks, allocated
  EXPECT_EQ(s.counter("lookups"), 7u);
  EXPECT_EQ(s.counter("allocated"), 10u);
  EXPECT_EQ(s.counter("released"), 0u);  // a shorter reply lacks the row
  EXPECT_EQ(s.counter("no_such_counter"), 0u);
}

// Error replies --------------------------------------------------------------------------------

TEST(ProtocolErrorReply, RoundTripKeepsCodeItemValueAndMessage) {
  for (uint16_t code = 1; code < 64; ++code) {
    const auto errc = static_cast<Errc>(code);
    if (errc_name(errc) == "unknown_error") continue;
    for (uint16_t op = 1; op <= 7; ++op) {
      const Error sent{Status(errc, code * 3u, 0x0102030405060708ull + code),
                       "cause " + std::string(errc_name(errc))};
      Bytes frame;
      encode_error(77, op, sent, frame);
      auto h = decode_header(frame);
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(h.value().opcode, op | kReplyBit);
      EXPECT_EQ(h.value().request_id, 77u);
      EXPECT_EQ(h.value().length, frame.size() - kHeaderBytes);
      const Bytes payload = exact(payload_of(frame));
      auto r = decode_reply(h.value(), payload);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error(), sent);
    }
  }
}

TEST(ProtocolErrorReply, ExactBytes) {
  Bytes frame;
  encode_error(5, req_op(Opcode::release), Error{Status(Errc::not_held, 3, 17), "nope"}, frame);
  const Bytes want = Builder().u16(4).u32(3).u64(17).str("nope").bytes();
  EXPECT_EQ(exact(payload_of(frame)), want);
}

TEST(ProtocolErrorReply, NoItemAndEmptyMessage) {
  const Error sent{Status(Errc::internal), ""};
  Bytes frame;
  encode_error(1, rep_op(Opcode::stats), sent, frame);  // a reply bit already set stays set
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h.value().opcode, rep_op(Opcode::stats));
  auto r = decode_reply(h.value(), exact(payload_of(frame)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), sent);
  EXPECT_EQ(r.error().status.item(), kNoItem);
}

TEST(ProtocolErrorReply, AnswersUnknownOpcodes) {
  // The daemon answers an opcode it does not know; the client still reads the error.
  for (uint16_t op : {uint16_t{0}, uint16_t{8}, uint16_t{0x42}, uint16_t{0x7fff}}) {
    Bytes frame;
    encode_error(9, op, Error{Status(Errc::unknown_opcode, kNoItem, op), "unknown"}, frame);
    auto h = decode_header(frame);
    ASSERT_TRUE(h.ok());
    auto r = decode_reply(h.value(), exact(payload_of(frame)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().status, Status(Errc::unknown_opcode, kNoItem, op));
    EXPECT_EQ(r.error().message, "unknown");
  }
}

TEST(ProtocolErrorReply, OkStatusIsNeverSentAsSuccess) {
  Bytes frame;
  encode_error(1, req_op(Opcode::alloc), Error{Status(), "bug"}, frame);
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok());
  auto r = decode_reply(h.value(), exact(payload_of(frame)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status.code(), Errc::internal);
}

TEST(ProtocolErrorReply, LongMessageSurvives) {
  const Error sent{Status(Errc::invalid_argument, 1, 2), std::string(100000, 'm')};
  Bytes frame;
  encode_error(1, req_op(Opcode::hello), sent, frame);
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok()) << h.error().message;
  auto r = decode_reply(h.value(), exact(payload_of(frame)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), sent);
}

TEST(ProtocolErrorReply, OversizedMessageIsCutToFitTheFrame) {
  const Error sent{Status(Errc::internal), std::string(kMaxPayloadBytes + 100, 'm')};
  Bytes frame;
  encode_error(1, req_op(Opcode::hello), sent, frame);
  auto h = decode_header(frame);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h.value().length, kMaxPayloadBytes);
  auto r = decode_reply(h.value(), payload_of(frame));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, sent.status);
  EXPECT_EQ(r.error().message, sent.message.substr(0, r.error().message.size()));
}

// decode_header --------------------------------------------------------------------------------

Bytes raw_header(uint32_t magic, uint32_t length, uint16_t version, uint16_t opcode, uint32_t id) {
  return Builder().u32(magic).u32(length).u16(version).u16(opcode).u32(id).bytes();
}

TEST(ProtocolHeader, DecodesFields) {
  const Bytes b = raw_header(kFrameMagic, 123, kProtocolVersion, 0x8005, 0xdeadbeef);
  ASSERT_EQ(b.size(), kHeaderBytes);
  auto h = decode_header(b);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h.value(), (FrameHeader{kFrameMagic, 123, kProtocolVersion, 0x8005, 0xdeadbeef}));
  // Longer spans are fine: only the first kHeaderBytes are read.
  Bytes longer = b;
  longer.resize(100, std::byte{0xff});
  EXPECT_TRUE(decode_header(longer).ok());
  // Any opcode decodes here; the payload decoders judge it.
  EXPECT_TRUE(decode_header(raw_header(kFrameMagic, 0, kProtocolVersion, 0xffff, 0)).ok());
  // The limit itself is allowed.
  EXPECT_TRUE(
      decode_header(raw_header(kFrameMagic, kMaxPayloadBytes, kProtocolVersion, 1, 0)).ok());
}

TEST(ProtocolHeader, MagicIsTheBytesKVPL) {
  const Bytes b = hex_bytes({'K', 'V', 'P', 'L', 0, 0, 0, 0, 13, 0, 7, 0, 0, 0, 0, 0});
  auto h = decode_header(b);
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h.value().opcode, 7);
}

TEST(ProtocolHeader, BadMagic) {
  for (uint32_t magic : {0u, 0x4B56504Cu, kFrameMagic ^ 1u, 0xffffffffu}) {
    auto h = decode_header(exact(raw_header(magic, 0, kProtocolVersion, 1, 0)));
    ASSERT_TRUE(fails_with(Errc::malformed_frame, h));
    EXPECT_EQ(h.error().status.value(), magic);
    EXPECT_NE(h.error().message.find("magic"), std::string::npos) << h.error().message;
    EXPECT_NE(h.error().message.find("KVPL"), std::string::npos) << h.error().message;
  }
  auto h = decode_header(exact(raw_header(0x12345678, 0, kProtocolVersion, 1, 0)));
  EXPECT_NE(h.error().message.find("0x12345678"), std::string::npos) << h.error().message;
}

TEST(ProtocolHeader, WrongVersion) {
  // 1: before segments and copy; 2: before the layout byte of the hello reply; 3: before the
  // tiers of the lookup reply; 4: before the stats reply's counter list; 5: before its daemon
  // counter list; 6: before the attention kind in PoolInfo; 7: before lookups with holes; 8:
  // before hybrid models; 9: before publish's chain; 10: before hello's hash scheme; 11: before
  // segmented layer_major pools; 12: before the converted and remote lookup tiers.
  const uint16_t versions[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 0x100, 0xffff};
  for (uint16_t version : versions) {
    auto h = decode_header(exact(raw_header(kFrameMagic, 0, version, 1, 0)));
    ASSERT_TRUE(fails_with(Errc::unsupported_version, h));
    EXPECT_EQ(h.error().status.value(), version);
  }
}

TEST(ProtocolHeader, TooLarge) {
  for (uint32_t length : {kMaxPayloadBytes + 1, 0xffffffffu}) {
    auto h = decode_header(exact(raw_header(kFrameMagic, length, kProtocolVersion, 1, 0)));
    ASSERT_TRUE(fails_with(Errc::frame_too_large, h));
    EXPECT_EQ(h.error().status.value(), length);
  }
}

TEST(ProtocolHeader, ShortSpan) {
  const Bytes full = raw_header(kFrameMagic, 0, kProtocolVersion, 1, 0);
  for (size_t n = 0; n < kHeaderBytes; ++n) {
    auto h = decode_header(exact(std::span<const std::byte>(full).first(n)));
    ASSERT_TRUE(fails_with(Errc::invalid_argument, h)) << n;
    EXPECT_EQ(h.error().status.value(), n);
  }
}

// decode_request errors ------------------------------------------------------------------------

TEST(ProtocolDecodeRequest, UnknownOpcode) {
  // 24 and 27 are pushed by the daemon, never requests.
  const uint16_t ops[] = {0,      13,     19,     24,     27,     31,     63,
                          64,     0x7fff, 0x8000, 0x8001, 0x8002, 0x8003, 0x8004,
                          0x8005, 0x8006, 0x8007, 0x800c, 0x8014, 0xffff};
  for (uint16_t op : ops) {
    auto r = decode_request_bytes(op, Bytes{});
    ASSERT_TRUE(fails_with(Errc::unknown_opcode, r)) << op;
    EXPECT_EQ(r.error().status.value(), op);
  }
}

TEST(ProtocolDecodeRequest, TruncatedAtEveryCut) {
  size_t cuts = 0;
  for (const Request& req : sample_requests()) {
    const Bytes frame = encode(1, req);
    const auto payload = payload_of(frame);
    const auto op = static_cast<uint16_t>(opcode_of(req));
    for (size_t cut = 0; cut < payload.size(); ++cut) {
      const Bytes part = exact(payload.first(cut));
      auto r = decode_request_bytes(op, part);
      ASSERT_TRUE(fails_with(Errc::malformed_frame, r))
          << "alternative " << req.index() << " cut at " << cut;
      ++cuts;
    }
  }
  EXPECT_GT(cuts, 800u);
}

TEST(ProtocolDecodeRequest, TrailingBytes) {
  for (const Request& req : sample_requests()) {
    // A hello's optional link_session and a publish's optional chain read what follows
    // (HelloLinkSession, PublishChain).
    if (std::holds_alternative<HelloRequest>(req) || std::holds_alternative<PublishRequest>(req)) {
      continue;
    }
    const Bytes frame = encode(1, req);
    for (size_t extra : {1u, 3u, 64u}) {
      Bytes payload = exact(payload_of(frame));
      payload.resize(payload.size() + extra, std::byte{0});
      auto r = decode_request_bytes(static_cast<uint16_t>(opcode_of(req)), payload);
      ASSERT_TRUE(fails_with(Errc::malformed_frame, r)) << req.index();
      EXPECT_EQ(r.error().status.value(), extra);
      EXPECT_NE(r.error().message.find("trailing"), std::string::npos) << r.error().message;
    }
  }
}

// hello's link_session: 8 bytes after the names when given, never 0; anything else after the
// names is malformed.
TEST(ProtocolDecodeRequest, HelloLinkSession) {
  const Bytes linked = encode(1, Request{HelloRequest{"w", "m/global", 0x0102030405060708ull}});
  EXPECT_EQ(exact(payload_of(linked)),
            Builder().str("w").str("m/global").u64(0x0102030405060708ull).bytes());
  auto r = decode_request_bytes(req_op(Opcode::hello), exact(payload_of(linked)));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<HelloRequest>(r.value()).link_session, 0x0102030405060708ull);
  const Bytes names = Builder().str("w").str("p").bytes();
  for (size_t extra : {1u, 7u}) {
    Bytes payload = names;
    payload.resize(payload.size() + extra, std::byte{1});
    EXPECT_TRUE(
        fails_with(Errc::malformed_frame, decode_request_bytes(req_op(Opcode::hello), payload)))
        << extra;
  }
  Bytes zero = Builder().str("w").str("p").u64(0).bytes();
  auto z = decode_request_bytes(req_op(Opcode::hello), zero);
  ASSERT_TRUE(fails_with(Errc::malformed_frame, z));
  EXPECT_NE(z.error().message.find("send none"), std::string::npos);
  Bytes trailing = Builder().str("w").str("p").u64(5).u8(0).bytes();
  EXPECT_TRUE(
      fails_with(Errc::malformed_frame, decode_request_bytes(req_op(Opcode::hello), trailing)));
}

// hello's hash scheme: link_session (0 allowed here), the scheme's name, its check hash; a
// hello without one is what it was.
TEST(ProtocolDecodeRequest, HelloHashScheme) {
  const HelloRequest with{"w", "p", 0, HashScheme{"kvpool-sha256/1", BlockHash{7, 9}}};
  const Bytes frame = encode(1, Request{with});
  EXPECT_EQ(exact(payload_of(frame)),
            Builder().str("w").str("p").u64(0).str("kvpool-sha256/1").u64(7).u64(9).bytes());
  for (const HelloRequest& h : {with, HelloRequest{"w", "p", 42, HashScheme{"x", {}}}}) {
    auto r = decode_request_bytes(req_op(Opcode::hello), exact(payload_of(encode(1, Request{h}))));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(std::get<HelloRequest>(r.value()), h);
  }
  const Bytes empty = Builder().str("w").str("p").u64(0).str("").u64(7).u64(9).bytes();
  auto e = decode_request_bytes(req_op(Opcode::hello), empty);
  ASSERT_TRUE(fails_with(Errc::malformed_frame, e));
  EXPECT_NE(e.error().message.find("send none"), std::string::npos);
  const Bytes long_name =
      Builder().str("w").str("p").u64(0).str(std::string(kMaxSchemeBytes + 1, 's')).bytes();
  auto l = decode_request_bytes(req_op(Opcode::hello), long_name);
  ASSERT_TRUE(fails_with(Errc::malformed_frame, l));
  EXPECT_NE(l.error().message.find("kMaxSchemeBytes"), std::string::npos);
  const Bytes short_check = Builder().str("w").str("p").u64(0).str("s").u64(7).bytes();
  EXPECT_TRUE(
      fails_with(Errc::malformed_frame, decode_request_bytes(req_op(Opcode::hello), short_check)));
}

// publish's chain: after the items (and hints), u8 flags, [parent], u32 m token ids, the
// adapter's name; present only when it says something, every cut inside it malformed.
TEST(ProtocolDecodeRequest, PublishChain) {
  PublishRequest full{{PublishItem{5, BlockHash{1, 2}}, PublishItem{6, BlockHash{3, 4}}},
                      PageHints{Priority::system, 7}};
  full.parent = BlockHash{0x11, 0x22};
  full.token_ids = {10, 11, 12, 13, UINT32_MAX, 0, 1, 2};
  full.lora_name = "sql";
  const Bytes frame = encode(1, Request{full});
  const Bytes want = Builder()
                         .u32(2 | kHintsFlag)
                         .u32(5)
                         .u64(1)
                         .u64(2)
                         .u32(6)
                         .u64(3)
                         .u64(4)
                         .u8(3)
                         .u32(7)  // hints
                         .u8(1)
                         .u64(0x11)
                         .u64(0x22)
                         .u32(8)
                         .u32(10)
                         .u32(11)
                         .u32(12)
                         .u32(13)
                         .u32(UINT32_MAX)
                         .u32(0)
                         .u32(1)
                         .u32(2)
                         .str("sql")
                         .bytes();
  EXPECT_EQ(exact(payload_of(frame)), want);
  for (PublishRequest req : {full, PublishRequest{{PublishItem{1, BlockHash{9, 9}}}}}) {
    if (req.items.size() == 1) req.lora_name = "only-an-adapter";
    const Bytes f = encode(1, Request{req});
    auto r = decode_request_bytes(req_op(Opcode::publish), exact(payload_of(f)));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(std::get<PublishRequest>(r.value()), req);
  }
  // Every cut inside the chain is malformed (a cut before it is a publish without one).
  const size_t plain = want.size() - (1 + 16 + 4 + 8 * 4 + 4 + 3);
  for (size_t cut = plain + 1; cut < want.size(); ++cut) {
    const Bytes part(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(cut));
    EXPECT_TRUE(
        fails_with(Errc::malformed_frame, decode_request_bytes(req_op(Opcode::publish), part)))
        << cut;
  }
  const Bytes items = Builder().u32(1).u32(5).u64(1).u64(2).bytes();
  auto with = [&](const Bytes& chain) {
    Bytes b = items;
    b.insert(b.end(), chain.begin(), chain.end());
    return decode_request_bytes(req_op(Opcode::publish), b);
  };
  auto unknown = with(Builder().u8(2).u32(0).str("").bytes());
  ASSERT_TRUE(fails_with(Errc::malformed_frame, unknown));
  EXPECT_NE(unknown.error().message.find("chain.flags 2"), std::string::npos);
  auto empty = with(Builder().u8(0).u32(0).str("").bytes());
  ASSERT_TRUE(fails_with(Errc::malformed_frame, empty));
  EXPECT_NE(empty.error().message.find("send none"), std::string::npos);
  auto short_ids = with(Builder().u8(0).u32(3).u32(1).bytes());
  ASSERT_TRUE(fails_with(Errc::malformed_frame, short_ids));
  EXPECT_NE(short_ids.error().message.find("chain.token_ids"), std::string::npos);
  EXPECT_TRUE(
      fails_with(Errc::malformed_frame, with(Builder().u8(0).u32(0).str("a").u8(0).bytes())));
}

// A group lookup's reply: as many pages and tiers per group as hits, 1..kMaxGroups groups, and
// kNoPage with tier none only.
TEST(ProtocolDecodeReply, GroupLookupReplyIsChecked) {
  const auto op = static_cast<uint16_t>(static_cast<uint16_t>(Opcode::lookup_groups) | kReplyBit);
  auto decode = [&](const Bytes& payload) { return decode_reply_bytes(op, payload); };
  EXPECT_TRUE(decode(Builder().u16(0).u32(1).u32(1).u32(4).u8(kTierDevice).bytes()).ok());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, decode(Builder().u16(0).u32(0).u32(0).bytes())));
  EXPECT_TRUE(fails_with(Errc::malformed_frame,
                         decode(Builder().u16(0).u32(0).u32(kMaxGroups + 1).bytes())));
  EXPECT_TRUE(fails_with(Errc::malformed_frame,
                         decode(Builder().u16(0).u32(2).u32(1).u32(4).u8(0).bytes())));
  EXPECT_TRUE(fails_with(Errc::malformed_frame,
                         decode(Builder().u16(0).u32(1).u32(1).u32(kNoPage).u8(0).bytes())));
}

TEST(ProtocolDecodeRequest, LengthMustMatchThePayload) {
  const Bytes frame = encode(1, Request{ReleaseRequest{{1, 2}}});
  const Bytes payload = exact(payload_of(frame));
  FrameHeader h = header_for(req_op(Opcode::release), payload.size() + 1);
  EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_request(h, payload)));
  h.length = static_cast<uint32_t>(payload.size() - 1);
  EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_request(h, payload)));
}

TEST(ProtocolDecodeRequest, HintsAreOptionalAndChecked) {
  // Without the flag a request is what it was before hints: no trailer, default hints.
  auto plain = decode_request_bytes(req_op(Opcode::alloc), Builder().u32(2).bytes());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(std::get<AllocRequest>(plain.value()).hints.empty());
  EXPECT_EQ(encode(1, Request{AllocRequest{2}}).size(), kHeaderBytes + 4);
  // With it, the trailer must be there, whole, and name a known class.
  auto hinted = decode_request_bytes(req_op(Opcode::alloc),
                                     Builder().u32(2 | kHintsFlag).u8(3).u32(500).bytes());
  ASSERT_TRUE(hinted.ok());
  EXPECT_EQ(std::get<AllocRequest>(hinted.value()).hints, (PageHints{Priority::system, 500}));
  auto missing = decode_request_bytes(req_op(Opcode::alloc), Builder().u32(2 | kHintsFlag).bytes());
  ASSERT_TRUE(fails_with(Errc::malformed_frame, missing));
  EXPECT_NE(missing.error().message.find("hints.priority"), std::string::npos)
      << missing.error().message;
  for (const Opcode op : {Opcode::alloc, Opcode::retain, Opcode::lookup, Opcode::publish}) {
    auto bad = decode_request_bytes(req_op(op), Builder().u32(kHintsFlag).u8(4).u32(0).bytes());
    ASSERT_TRUE(fails_with(Errc::malformed_frame, bad)) << static_cast<int>(op);
    EXPECT_EQ(bad.error().status.value(), 4u);
    EXPECT_NE(bad.error().message.find("hints.priority 4 is not a priority class"),
              std::string::npos)
        << bad.error().message;
  }
  // The flag is not part of the count: a count above kMaxBatch is still refused.
  auto big = decode_request_bytes(req_op(Opcode::retain),
                                  Builder().u32((kMaxBatch + 1) | kHintsFlag).bytes());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, big));
}

TEST(ProtocolDecodeRequest, CountNamesTheCause) {
  const Bytes payload = Builder().u32(5).u32(1).u32(2).u32(3).bytes();
  auto r = decode_request_bytes(req_op(Opcode::release), payload);
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("release: count 5 but only 12 bytes follow"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(r.error().status.value(), 5u);
}

#ifdef KVPOOL_TEST_ASAN
// The largest single allocation while `g_track` is set, seen through ASan's allocator hooks.
std::atomic<bool> g_track{false};
std::atomic<size_t> g_max_alloc{0};
void on_malloc(const volatile void*, size_t size) {
  if (!g_track.load(std::memory_order_relaxed)) return;
  size_t cur = g_max_alloc.load(std::memory_order_relaxed);
  while (size > cur && !g_max_alloc.compare_exchange_weak(cur, size)) {
  }
}
void on_free(const volatile void*) {}
#endif

// Runs `f` and returns the largest allocation it made (0 when that cannot be observed).
template <typename F>
size_t largest_allocation(F&& f) {
#ifdef KVPOOL_TEST_ASAN
  static const bool installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;
  EXPECT_TRUE(installed);
  g_max_alloc = 0;
  g_track = true;
  f();
  g_track = false;
  return g_max_alloc;
#else
  f();
  return 0;
#endif
}

TEST(ProtocolDecodeRequest, HugeCountIsRejectedBeforeAnyAllocation) {
  const Opcode batched[] = {Opcode::retain, Opcode::release, Opcode::lookup, Opcode::publish};
  for (Opcode op : batched) {
    for (uint32_t count : {kMaxBatch + 1, 0x7fffffffu, 0xffffffffu}) {
      const Bytes payload = Builder().u32(count).bytes();
      Errc code = Errc::ok;
      std::string message;
      const size_t biggest = largest_allocation([&] {
        auto r = decode_request_bytes(req_op(op), payload);
        code = r.ok() ? Errc::ok : r.error().status.code();
        if (!r.ok()) message = r.error().message;
      });
      EXPECT_EQ(code, Errc::malformed_frame) << static_cast<int>(op) << " " << count;
      EXPECT_NE(message.find("kMaxBatch"), std::string::npos) << message;
      EXPECT_LT(biggest, 1024u) << "decoding allocated for a forged count";
    }
    // Within kMaxBatch but with nothing behind it: still no allocation.
    const Bytes payload = Builder().u32(kMaxBatch).u32(1).bytes();
    const size_t biggest = largest_allocation([&] {
      auto r = decode_request_bytes(req_op(op), payload);
      EXPECT_TRUE(fails_with(Errc::malformed_frame, r));
      if (!r.ok()) {
        EXPECT_NE(r.error().message.find("only 4 bytes follow"), std::string::npos)
            << r.error().message;
      }
    });
    EXPECT_LT(biggest, 1024u);
  }
  auto alloc = decode_request_bytes(req_op(Opcode::alloc), Builder().u32(kMaxBatch + 1).bytes());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, alloc));
  // The same for the batched replies.
  for (Opcode op : {Opcode::alloc, Opcode::lookup, Opcode::publish}) {
    const Bytes payload = Builder().u16(0).u32(0xffffffffu).bytes();
    const size_t biggest = largest_allocation([&] {
      EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_reply_bytes(rep_op(op), payload)));
    });
    EXPECT_LT(biggest, 1024u);
  }
}

TEST(ProtocolDecodeRequest, NameTooLong) {
  const std::string ok(kMaxNameBytes, 'x');
  const std::string too_long(kMaxNameBytes + 1, 'x');
  for (int which = 0; which < 2; ++which) {
    HelloRequest hello{which == 0 ? too_long : ok, which == 1 ? too_long : ok};
    const Bytes frame = encode(1, Request{hello});
    auto r = decode_request_bytes(req_op(Opcode::hello), exact(payload_of(frame)));
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
    EXPECT_EQ(r.error().status.value(), kMaxNameBytes + 1);
    EXPECT_NE(r.error().message.find(which == 0 ? "worker_name" : "pool_name"), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find("kMaxNameBytes"), std::string::npos) << r.error().message;
  }
  // A huge length with nothing behind it.
  auto r = decode_request_bytes(req_op(Opcode::hello), Builder().u32(0xffffffffu).bytes());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, r));
  // A length within the limit but past the end.
  r = decode_request_bytes(req_op(Opcode::hello), Builder().u32(10).u8('a').bytes());
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("only 1 bytes follow"), std::string::npos) << r.error().message;
}

// decode_reply errors --------------------------------------------------------------------------

TEST(ProtocolDecodeReply, PageStatesAreCheckedAndCountsBounded) {
  auto bad = decode_reply_bytes(rep_op(Opcode::pages), Builder().u16(0).u32(2).u8(0).u8(3).bytes());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, bad));
  // A count larger than the bytes present is refused before anything is allocated.
  auto short_ =
      decode_reply_bytes(rep_op(Opcode::pages), Builder().u16(0).u32(0xffffffffu).bytes());
  EXPECT_TRUE(fails_with(Errc::malformed_frame, short_));
}

TEST(ProtocolDecodeReply, NotAReply) {
  const uint16_t plain[] = {0, 1, 5, 7, 8, 0x7fff};
  for (uint16_t op : plain) {
    auto r = decode_reply_bytes(op, Builder().u16(0).bytes());
    ASSERT_TRUE(fails_with(Errc::unknown_opcode, r)) << op;
    EXPECT_EQ(r.error().status.value(), op);
  }
  // The reply bit on an opcode that names no operation, with a success status.
  const uint16_t unnamed[] = {0x8000, 0x800d, 0xffff};
  for (uint16_t op : unnamed) {
    EXPECT_TRUE(fails_with(Errc::unknown_opcode, decode_reply_bytes(op, Builder().u16(0).bytes())))
        << op;
  }
}

TEST(ProtocolDecodeReply, TruncatedAtEveryCut) {
  std::vector<Bytes> frames;
  for (const Reply& rep : sample_replies())
    frames.push_back(encode(1, rep));
  Bytes err;
  encode_error(1, req_op(Opcode::lookup), Error{Status(Errc::invalid_page, 2, 99), "bad"}, err);
  frames.push_back(err);
  for (const Bytes& frame : frames) {
    auto h = decode_header(frame);
    ASSERT_TRUE(h.ok());
    const auto payload = payload_of(frame);
    for (size_t cut = 0; cut < payload.size(); ++cut) {
      const Bytes part = exact(payload.first(cut));
      auto r = decode_reply_bytes(h.value().opcode, part);
      ASSERT_TRUE(fails_with(Errc::malformed_frame, r))
          << "opcode " << h.value().opcode << " cut at " << cut;
    }
    Bytes longer = exact(payload);
    longer.push_back(std::byte{0});
    EXPECT_TRUE(fails_with(Errc::malformed_frame, decode_reply_bytes(h.value().opcode, longer)));
  }
}

TEST(ProtocolDecodeReply, UnknownStatusCode) {
  const uint16_t codes[] = {10, 11, 19, 34, 100, 0xffff};
  for (uint16_t code : codes) {
    auto r = decode_reply_bytes(rep_op(Opcode::retain), Builder().u16(code).bytes());
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r)) << code;
    EXPECT_EQ(r.error().status.value(), code);
    // Even with a well-formed error body behind it.
    auto r2 = decode_reply_bytes(rep_op(Opcode::retain),
                                 Builder().u16(code).u32(0).u64(0).str("x").bytes());
    EXPECT_TRUE(fails_with(Errc::malformed_frame, r2)) << code;
  }
}

TEST(ProtocolDecodeReply, BadDtype) {
  for (KvDtype d : {KvDtype::fp16, KvDtype::bf16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    const Bytes frame = encode(1, Reply{HelloReply{1, sample_pool(d)}});
    auto r = decode_reply_bytes(rep_op(Opcode::hello), exact(payload_of(frame)));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(std::get<HelloReply>(r.value()).pool.geometry.dtype, d);
  }
  const size_t dtype_offset = 2 + 8 + 4 * 4;  // status, session id, four geometry u32s
  const uint8_t bad_dtypes[] = {4, 5, 0x80, 0xff};
  for (uint8_t bad : bad_dtypes) {
    const Bytes frame = encode(1, Reply{HelloReply{1, sample_pool(KvDtype::fp16)}});
    Bytes payload = exact(payload_of(frame));
    payload[dtype_offset] = std::byte{bad};
    auto r = decode_reply_bytes(rep_op(Opcode::hello), payload);
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r)) << int{bad};
    EXPECT_EQ(r.error().status.value(), bad);
    EXPECT_NE(r.error().message.find("dtype"), std::string::npos) << r.error().message;
  }
}

TEST(ProtocolDecodeReply, LayoutTravelsAfterTheDtype) {
  const size_t layout_offset = 2 + 8 + 4 * 4 + 1;  // status, session id, geometry u32s, dtype
  for (KvLayout l : {KvLayout::page_major, KvLayout::layer_major}) {
    PoolInfo p = sample_pool(KvDtype::bf16);
    p.layout = l;
    const Bytes frame = encode(1, Reply{HelloReply{1, p}});
    const Bytes payload = exact(payload_of(frame));
    EXPECT_EQ(payload[layout_offset], std::byte{static_cast<uint8_t>(l)});
    auto r = decode_reply_bytes(rep_op(Opcode::hello), payload);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(std::get<HelloReply>(r.value()).pool.layout, l);
    EXPECT_EQ(std::get<HelloReply>(r.value()).pool, p);
  }
  for (uint8_t bad : {uint8_t{2}, uint8_t{3}, uint8_t{0x80}, uint8_t{0xff}}) {
    const Bytes frame = encode(1, Reply{HelloReply{1, sample_pool(KvDtype::fp16)}});
    Bytes payload = exact(payload_of(frame));
    payload[layout_offset] = std::byte{bad};
    auto r = decode_reply_bytes(rep_op(Opcode::hello), payload);
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r)) << int{bad};
    EXPECT_EQ(r.error().status.value(), bad);
    EXPECT_NE(r.error().message.find("layout"), std::string::npos) << r.error().message;
  }
}

TEST(ProtocolDecodeReply, AttentionKindAndWindowTravelAfterTheLayout) {
  const size_t kind_offset = 2 + 8 + 4 * 4 + 2;  // status, session id, geometry u32s, dtype, layout
  PoolInfo p = sample_pool(KvDtype::bf16);
  p.geometry.kind = AttentionKind::sliding;
  p.geometry.window = 0x01020304;
  const Bytes frame = encode(1, Reply{HelloReply{1, p}});
  const Bytes payload = exact(payload_of(frame));
  EXPECT_EQ(payload[kind_offset], std::byte{1});
  EXPECT_EQ(payload[kind_offset + 1], std::byte{4});  // the window, little-endian
  auto r = decode_reply_bytes(rep_op(Opcode::hello), payload);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<HelloReply>(r.value()).pool, p);
  for (uint8_t bad : {uint8_t{4}, uint8_t{0x80}, uint8_t{0xff}}) {
    Bytes b = payload;
    b[kind_offset] = std::byte{bad};
    auto e = decode_reply_bytes(rep_op(Opcode::hello), b);
    ASSERT_TRUE(fails_with(Errc::malformed_frame, e)) << int{bad};
    EXPECT_EQ(e.error().status.value(), bad);
    EXPECT_NE(e.error().message.find("kind"), std::string::npos) << e.error().message;
  }
}

// The segment fields close PoolInfo: both set on a layer_major pool, or both 0.
TEST(ProtocolDecodeReply, SegmentFieldsFitTheLayout) {
  PoolInfo p = sample_pool(KvDtype::bf16);
  p.layout = KvLayout::layer_major;
  p.segment_pages = 3;
  p.segment_stride = 4096;
  const Bytes good = exact(payload_of(encode(1, Reply{HelloReply{1, p}})));
  auto r = decode_reply_bytes(rep_op(Opcode::hello), good);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::get<HelloReply>(r.value()).pool, p);
  auto bad = [](PoolInfo q) {
    auto e = decode_reply_bytes(rep_op(Opcode::hello),
                                exact(payload_of(encode(1, Reply{HelloReply{1, q}}))));
    EXPECT_TRUE(fails_with(Errc::malformed_frame, e));
    if (!e.ok()) {
      EXPECT_NE(e.error().message.find("segment_pages"), std::string::npos);
    }
  };
  PoolInfo no_stride = p;
  no_stride.segment_stride = 0;
  bad(no_stride);
  PoolInfo no_pages = p;
  no_pages.segment_pages = 0;
  bad(no_pages);
  PoolInfo page_major = p;
  page_major.layout = KvLayout::page_major;
  bad(page_major);
}

TEST(ProtocolDecodeReply, PoolNamesTooLong) {
  for (int which = 0; which < 3; ++which) {
    PoolInfo p = sample_pool(KvDtype::bf16);
    std::string& s = which == 0 ? p.pool_name : which == 1 ? p.backend : p.tenant;
    s.assign(kMaxNameBytes + 1, 'n');
    const Bytes frame = encode(1, Reply{HelloReply{1, p}});
    EXPECT_TRUE(fails_with(Errc::malformed_frame,
                           decode_reply_bytes(rep_op(Opcode::hello), exact(payload_of(frame)))))
        << which;
  }
}

TEST(ProtocolDecodeReply, SegmentCountAndHandleSizeAreBounded) {
  // kMaxSegments + 1 segments: refused at the count, before anything is sized from it.
  PoolInfo many = sample_pool(KvDtype::bf16);
  many.segments.assign(kMaxSegments + 1, SegmentInfo{2u << 20, {}});
  auto r = decode_reply_bytes(rep_op(Opcode::hello),
                              exact(payload_of(encode(1, Reply{HelloReply{1, many}}))));
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("kMaxSegments"), std::string::npos) << r.error().message;

  PoolInfo big_handle = sample_ipc_pool();
  big_handle.segments[0].handle.assign(kMaxHandleBytes + 1, 1);
  r = decode_reply_bytes(rep_op(Opcode::hello),
                         exact(payload_of(encode(1, Reply{HelloReply{1, big_handle}}))));
  ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
  EXPECT_NE(r.error().message.find("kMaxHandleBytes"), std::string::npos) << r.error().message;
}

TEST(ProtocolDecodeReply, BadPublishKind) {
  const Reply rep = PublishReply{{PublishResult{PublishResult::Kind::stored, 1},
                                  PublishResult{PublishResult::Kind::duplicate, 2}}};
  const Bytes frame = encode(1, rep);
  const uint8_t bad_kinds[] = {2, 3, 0xff};
  for (uint8_t bad : bad_kinds) {
    Bytes payload = exact(payload_of(frame));
    payload[2 + 4 + 5] = std::byte{bad};  // kind of item 1
    auto r = decode_reply_bytes(rep_op(Opcode::publish), payload);
    ASSERT_TRUE(fails_with(Errc::malformed_frame, r));
    EXPECT_EQ(r.error().status.value(), bad);
    EXPECT_EQ(r.error().status.item(), 1u);
  }
}

TEST(ProtocolDecodeReply, ErrorPayloadYieldsTheError) {
  // Built by hand, so this does not depend on encode_error.
  const Bytes payload = Builder().u16(5).u32(kNoItem).u64(64).str("out of pages: 64").bytes();
  auto r = decode_reply_bytes(rep_op(Opcode::alloc), payload);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().status, Status(Errc::out_of_pages, kNoItem, 64));
  EXPECT_EQ(r.error().message, "out of pages: 64");
}

// Robustness -----------------------------------------------------------------------------------

// Decodes one payload as a request and as a reply; anything that decodes must re-encode to the
// very same bytes (the encoding is canonical), anything else must be a non-ok error.
void check_payload(uint16_t opcode, const Bytes& payload, size_t& decoded) {
  const FrameHeader h = header_for(opcode, payload.size());
  auto frame = [&] {
    Bytes f = raw_header(kFrameMagic, h.length, kProtocolVersion, opcode, h.request_id);
    f.insert(f.end(), payload.begin(), payload.end());
    return f;
  };
  auto req = decode_request(h, payload);
  if (req.ok()) {
    ++decoded;
    ASSERT_EQ(encode(h.request_id, req.value()), frame());
  } else {
    ASSERT_FALSE(req.error().status.ok());
    ASSERT_FALSE(req.error().message.empty());
  }
  auto rep = decode_reply(h, payload);
  if (rep.ok()) {
    ++decoded;
    ASSERT_EQ(encode(h.request_id, rep.value()), frame());
    return;
  }
  // Either a decode failure, or an error the payload carries (which re-encodes to it).
  const Error& e = rep.error();
  ASSERT_FALSE(e.status.ok());
  const bool decode_failure =
      e.status.code() == Errc::malformed_frame || e.status.code() == Errc::unknown_opcode;
  if (decode_failure && !e.message.empty()) return;
  Bytes again;
  encode_error(h.request_id, opcode, e, again);
  ASSERT_EQ(again, frame()) << e.message;
}

// A fast deterministic generator (splitmix64): the robustness loops draw a lot of bytes.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t operator()() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>((*this)() % n); }

 private:
  uint64_t s_;
};

// A byte from 16 random bits, biased towards zero and small values so that counts and lengths
// are often plausible and the decoders get past the first field.
std::byte biased_byte(uint64_t bits) {
  switch (bits & 3) {
    case 0:
    case 1:
      return std::byte{0};
    case 2:
      return static_cast<std::byte>((bits >> 2) % 6);
    default:
      return static_cast<std::byte>(bits >> 2);
  }
}
std::byte random_byte(Rng& rng) {
  return biased_byte(rng());
}

void fill_random(Rng& rng, Bytes& b) {
  // Eight bytes at a time: per byte, half zero, a quarter 0..7, a quarter anything.
  constexpr uint64_t kLanes = 0x0101010101010101ull;
  for (size_t i = 0; i < b.size(); i += 8) {
    const uint64_t value = rng();
    const uint64_t select = rng();
    const uint64_t keep = (select & kLanes) * 0xff;
    const uint64_t small = ((select >> 1) & kLanes) * 0xff;
    const uint64_t bytes = value & keep & (~small | (kLanes * 7));
    std::memcpy(b.data() + i, &bytes, std::min<size_t>(8, b.size() - i));
  }
  // Half of the time, a count at offset 0 (requests) or 2 (after a reply's status) that matches
  // the length for one of the item sizes, so that batches often decode whole.
  if (b.size() >= 6 && rng() % 2 == 0) {
    const size_t at = rng() % 2 == 0 ? 0 : 2;
    const size_t item_sizes[] = {4, 5, 16, 20};
    const auto n = static_cast<uint32_t>((b.size() - at - 4) / item_sizes[rng.below(4)]);
    std::memcpy(b.data() + at, &n, 4);
  }
}

TEST(WireRobustness, RandomPayloadsForEveryOpcode) {
  Rng rng(20240611);
  size_t decoded = 0;
  size_t payloads = 0;
  const uint16_t ops[] = {1, 2, 3, 4, 5, 6, 7, 20, 21, 22, 23, 25, 26};
  for (uint16_t base : ops) {
    for (uint16_t op : {base, static_cast<uint16_t>(base | kReplyBit)}) {
      for (int i = 0; i < 100000; ++i) {
        Bytes payload(rng.below(257));  // a fresh, exactly sized buffer each time
        fill_random(rng, payload);
        check_payload(op, payload, decoded);
        if (::testing::Test::HasFatalFailure()) return;
        ++payloads;
      }
    }
  }
  // Some random payloads must decode, or the loop tests little beyond the counts.
  EXPECT_GT(decoded, 3000u);
  std::cout << "[          ] " << payloads << " random payloads, " << decoded
            << " decodes succeeded\n";
}

TEST(WireRobustness, MutatedValidFrames) {
  std::vector<Bytes> frames;
  for (const Request& r : sample_requests())
    frames.push_back(encode(1, r));
  for (const Reply& r : sample_replies())
    frames.push_back(encode(1, r));
  for (Errc e : {Errc::not_held, Errc::internal, Errc::malformed_frame}) {
    Bytes f;
    encode_error(1, req_op(Opcode::publish), Error{Status(e, 1, 2), "some message"}, f);
    frames.push_back(f);
  }
  Rng rng(7);
  size_t decoded = 0;
  size_t headers_ok = 0;
  for (int i = 0; i < 200000; ++i) {
    Bytes f = frames[rng.below(frames.size())];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      switch (rng() % 5) {
        case 0:  // flip a bit
          if (!f.empty()) f[rng() % f.size()] ^= static_cast<std::byte>(1u << (rng() % 8));
          break;
        case 1:  // overwrite a byte
          if (!f.empty()) f[rng() % f.size()] = random_byte(rng);
          break;
        case 2:  // cut
          f.resize(rng() % (f.size() + 1));
          break;
        case 3:  // insert
          f.insert(f.begin() + static_cast<std::ptrdiff_t>(rng() % (f.size() + 1)),
                   random_byte(rng));
          break;
        default:  // append
          f.push_back(random_byte(rng));
          break;
      }
    }
    const Bytes frame = exact(f);
    auto h = decode_header(frame);
    if (!h.ok()) {
      ASSERT_FALSE(h.error().status.ok());
      continue;
    }
    ++headers_ok;
    // As a stream reader would: the payload is the next `length` bytes when they are there;
    // when they are not, the decoders get what there is (a length mismatch).
    const size_t avail = frame.size() - kHeaderBytes;
    const Bytes payload = exact(payload_of(frame).first(std::min<size_t>(avail, h.value().length)));
    FrameHeader hh = h.value();
    auto req = decode_request(hh, payload);
    if (req.ok()) {
      ++decoded;
      EXPECT_EQ(payload.size(), hh.length);
    } else {
      ASSERT_FALSE(req.error().status.ok());
    }
    auto rep = decode_reply(hh, payload);
    if (rep.ok()) {
      ++decoded;
      EXPECT_EQ(payload.size(), hh.length);
    } else {
      ASSERT_FALSE(rep.error().status.ok());
    }
    if (payload.size() == hh.length) {
      size_t unused = 0;
      check_payload(hh.opcode, payload, unused);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_GT(headers_ok, 10000u);
  EXPECT_GT(decoded, 1000u);
}

}  // namespace
}  // namespace kvpool::wire

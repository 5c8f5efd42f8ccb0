// Internal to kvpool_common: the payload codecs of the pool operations (opcodes 1..12: hello,
// alloc, retain, release, lookup, publish, stats, evict, flush, sessions, pages, copy), defined in
// common/wire/protocol_pool.cpp, for the opcode dispatch and framing in common/protocol.cpp.
// body_size is the payload size without a reply's status code; put_body writes exactly that many
// bytes; get_body reads one body, leaving the check for trailing bytes to the caller.
#pragma once

#include <cstddef>

#include "common/wire/protocol.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire::codec {

size_t body_size(const HelloRequest& m);
size_t body_size(const AllocRequest& m);
size_t body_size(const RetainRequest& m);
size_t body_size(const ReleaseRequest& m);
size_t body_size(const LookupRequest& m);
size_t body_size(const PublishRequest& m);
size_t body_size(const StatsRequest& m);
size_t body_size(const EvictRequest& m);
size_t body_size(const FlushRequest& m);
size_t body_size(const SessionsRequest& m);
size_t body_size(const PagesRequest& m);
size_t body_size(const CopyRequest& m);
size_t body_size(const HelloReply& m);
size_t body_size(const AllocReply& m);
size_t body_size(const RetainReply& m);
size_t body_size(const ReleaseReply& m);
size_t body_size(const LookupReply& m);
size_t body_size(const PublishReply& m);
size_t body_size(const StatsReply& m);
size_t body_size(const EvictReply& m);
size_t body_size(const FlushReply& m);
size_t body_size(const SessionsReply& m);
size_t body_size(const PagesReply& m);
size_t body_size(const CopyReply& m);

void put_body(Writer& w, const HelloRequest& m);
void put_body(Writer& w, const AllocRequest& m);
void put_body(Writer& w, const RetainRequest& m);
void put_body(Writer& w, const ReleaseRequest& m);
void put_body(Writer& w, const LookupRequest& m);
void put_body(Writer& w, const PublishRequest& m);
void put_body(Writer& w, const StatsRequest& m);
void put_body(Writer& w, const EvictRequest& m);
void put_body(Writer& w, const FlushRequest& m);
void put_body(Writer& w, const SessionsRequest& m);
void put_body(Writer& w, const PagesRequest& m);
void put_body(Writer& w, const CopyRequest& m);
void put_body(Writer& w, const HelloReply& m);
void put_body(Writer& w, const AllocReply& m);
void put_body(Writer& w, const RetainReply& m);
void put_body(Writer& w, const ReleaseReply& m);
void put_body(Writer& w, const LookupReply& m);
void put_body(Writer& w, const PublishReply& m);
void put_body(Writer& w, const StatsReply& m);
void put_body(Writer& w, const EvictReply& m);
void put_body(Writer& w, const FlushReply& m);
void put_body(Writer& w, const SessionsReply& m);
void put_body(Writer& w, const PagesReply& m);
void put_body(Writer& w, const CopyReply& m);

bool get_body(Reader& r, HelloRequest& m);
bool get_body(Reader& r, AllocRequest& m);
bool get_body(Reader& r, RetainRequest& m);
bool get_body(Reader& r, ReleaseRequest& m);
bool get_body(Reader& r, LookupRequest& m);
bool get_body(Reader& r, PublishRequest& m);
bool get_body(Reader& r, StatsRequest& m);
bool get_body(Reader& r, EvictRequest& m);
bool get_body(Reader& r, FlushRequest& m);
bool get_body(Reader& r, SessionsRequest& m);
bool get_body(Reader& r, PagesRequest& m);
bool get_body(Reader& r, CopyRequest& m);
bool get_body(Reader& r, HelloReply& m);
bool get_body(Reader& r, AllocReply& m);
bool get_body(Reader& r, RetainReply& m);
bool get_body(Reader& r, ReleaseReply& m);
bool get_body(Reader& r, LookupReply& m);
bool get_body(Reader& r, PublishReply& m);
bool get_body(Reader& r, StatsReply& m);
bool get_body(Reader& r, EvictReply& m);
bool get_body(Reader& r, FlushReply& m);
bool get_body(Reader& r, SessionsReply& m);
bool get_body(Reader& r, PagesReply& m);
bool get_body(Reader& r, CopyReply& m);

// PoolInfo, as the hello and segments replies carry it.
size_t pool_info_size(const PoolInfo& p);
void put_pool_info(Writer& w, const PoolInfo& p);
bool get_pool_info(Reader& r, PoolInfo& p);
// Elastic pools (opcodes 25, 26).
size_t body_size(const SegmentsRequest& m);
size_t body_size(const ResizeRequest& m);
size_t body_size(const SegmentsReply& m);
size_t body_size(const ResizeReply& m);
void put_body(Writer& w, const SegmentsRequest& m);
void put_body(Writer& w, const ResizeRequest& m);
void put_body(Writer& w, const SegmentsReply& m);
void put_body(Writer& w, const ResizeReply& m);
bool get_body(Reader& r, SegmentsRequest& m);
bool get_body(Reader& r, ResizeRequest& m);
bool get_body(Reader& r, SegmentsReply& m);
bool get_body(Reader& r, ResizeReply& m);

}  // namespace kvpool::wire::codec

// Internal to kvpool_common: the payload codecs of the operations, metrics and events block
// (opcodes 20+: prefixes, reload, subscribe, snapshot, and the event_batch push frame), defined
// in common/wire/protocol_ops.cpp, for the opcode dispatch and framing in common/protocol.cpp.
// body_size is the payload size without a reply's status code; put_body writes exactly that many
// bytes; get_body reads one body, leaving the check for trailing bytes to the caller.
#pragma once

#include <cstddef>

#include "common/wire/protocol.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire::codec {

size_t body_size(const PrefixesRequest& m);
size_t body_size(const ReloadRequest& m);
size_t body_size(const SubscribeRequest& m);
size_t body_size(const SnapshotRequest& m);
size_t body_size(const PrefixesReply& m);
size_t body_size(const ReloadReply& m);
size_t body_size(const SubscribeReply& m);
size_t body_size(const SnapshotReply& m);
size_t body_size(const EventBatch& m);

void put_body(Writer& w, const PrefixesRequest& m);
void put_body(Writer& w, const ReloadRequest& m);
void put_body(Writer& w, const SubscribeRequest& m);
void put_body(Writer& w, const SnapshotRequest& m);
void put_body(Writer& w, const PrefixesReply& m);
void put_body(Writer& w, const ReloadReply& m);
void put_body(Writer& w, const SubscribeReply& m);
void put_body(Writer& w, const SnapshotReply& m);
void put_body(Writer& w, const EventBatch& m);

bool get_body(Reader& r, PrefixesRequest& m);
bool get_body(Reader& r, ReloadRequest& m);
bool get_body(Reader& r, SubscribeRequest& m);
bool get_body(Reader& r, SnapshotRequest& m);
bool get_body(Reader& r, PrefixesReply& m);
bool get_body(Reader& r, ReloadReply& m);
bool get_body(Reader& r, SubscribeReply& m);
bool get_body(Reader& r, SnapshotReply& m);
bool get_body(Reader& r, EventBatch& m);

}  // namespace kvpool::wire::codec

// Internal to kvpool_common: the payload codecs, for the opcode dispatch and framing in
// protocol.cpp. Every request's and reply's are declared from the opcode table (protocol.h), so a
// new opcode declares nothing by hand; the pool operations' are defined in protocol_pool.cpp
// (with the PoolInfo that hello and segments carry), the operations, metrics and events block's
// in protocol_ops.cpp (with the event_batch push frame, which answers no request). body_size is
// the payload size without a reply's status code; put_body writes exactly that many bytes;
// get_body reads one body, leaving the check for trailing bytes to the caller.
#pragma once

#include <cstddef>

#include "common/wire/protocol.h"
#include "common/wire/wire_codec.h"

namespace kvpool::wire::codec {

#define KVPOOL_DECLARE_BODY_CODEC(name, number, Request, Reply, ...) \
  size_t body_size(const Request& m);                                \
  void put_body(Writer& w, const Request& m);                        \
  bool get_body(Reader& r, Request& m);                              \
  size_t body_size(const Reply& m);                                  \
  void put_body(Writer& w, const Reply& m);                          \
  bool get_body(Reader& r, Reply& m);
KVPOOL_WIRE_OPCODES(KVPOOL_DECLARE_BODY_CODEC)
#undef KVPOOL_DECLARE_BODY_CODEC

size_t pool_info_size(const PoolInfo& p);
void put_pool_info(Writer& w, const PoolInfo& p);
bool get_pool_info(Reader& r, PoolInfo& p);

size_t body_size(const EventBatch& m);
void put_body(Writer& w, const EventBatch& m);
bool get_body(Reader& r, EventBatch& m);

}  // namespace kvpool::wire::codec

// Internal to kvpool_common: the declarations of every request's and reply's payload codec,
// generated from the opcode table (protocol.h), so a new opcode declares nothing by hand. Each
// is defined beside its kin (protocol_pool.cpp, protocol_ops.cpp). body_size is the payload size
// without a reply's status code; put_body writes exactly that many bytes; get_body reads one
// body, leaving the check for trailing bytes to the caller.
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

}  // namespace kvpool::wire::codec

// Internal to kvpool_common: the codec of the event_batch push frame, which is no request's
// reply and so not in the opcode table (the table's codecs: body_codec.h), defined in
// common/wire/protocol_ops.cpp beside the operations, metrics and events block's.
#pragma once

#include <cstddef>

#include "common/wire/body_codec.h"
#include "common/wire/protocol.h"

namespace kvpool::wire::codec {

size_t body_size(const EventBatch& m);
void put_body(Writer& w, const EventBatch& m);
bool get_body(Reader& r, EventBatch& m);

}  // namespace kvpool::wire::codec

// Internal to kvpool_common: what the codecs of the pool operations (opcodes 1..12 and the
// elastic pools' 25, 26; declared in body_codec.h, defined in common/wire/protocol_pool.cpp)
// share besides: the PoolInfo that the hello and segments replies carry.
#pragma once

#include <cstddef>

#include "common/wire/body_codec.h"
#include "common/wire/protocol.h"

namespace kvpool::wire::codec {

size_t pool_info_size(const PoolInfo& p);
void put_pool_info(Writer& w, const PoolInfo& p);
bool get_pool_info(Reader& r, PoolInfo& p);
}  // namespace kvpool::wire::codec

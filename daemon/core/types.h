// Names the pool core uses for pages, owners and namespaces.
#pragma once

#include <cstdint>

#include "common/types.h"

namespace kvpool::core {

using kvpool::kNoPage;
using kvpool::Namespace;
using kvpool::PageId;
using kvpool::PublishItem;
using kvpool::PublishResult;

// An owner holds references (a daemon session, or one replayed request stream). The low 32 bits
// name a slot, the high 32 bits the slot's generation, so an id is never valid again once closed.
using OwnerId = uint64_t;
// Pool size limit: page ids stay below kNoPage and a page's reference count fits 31 bits.
inline constexpr uint32_t kMaxPages = (uint32_t{1} << 31) - 1;

enum class PageState : uint8_t {
  free,    // refcount 0, no hash: on the free list
  in_use,  // refcount > 0, hash or not
  cached,  // refcount 0, hash set: in exactly one eviction queue
};

}  // namespace kvpool::core

// Names the pool core uses for pages, owners and namespaces.
#pragma once

#include <cstdint>

namespace kvpool::core {

// A page is named by its index in the pool, never by an address: the address is
// pool_base + page · page_bytes in every process that maps the pool.
using PageId = uint32_t;
// An owner holds references (a daemon session, or one replayed request stream). The low 32 bits
// name a slot, the high 32 bits the slot's generation, so an id is never valid again once closed.
using OwnerId = uint64_t;
// The prefix index is scoped by namespace; the daemon derives it from the session's pool and
// tenant, never from what a client claims.
using Namespace = uint32_t;

inline constexpr PageId kNoPage = UINT32_MAX;
// Pool size limit: page ids stay below kNoPage and a page's reference count fits 31 bits.
inline constexpr uint32_t kMaxPages = (uint32_t{1} << 31) - 1;

enum class PageState : uint8_t {
  free,    // refcount 0, no hash: on the free list
  in_use,  // refcount > 0, hash or not
  cached,  // refcount 0, hash set: in exactly one eviction queue
};

}  // namespace kvpool::core

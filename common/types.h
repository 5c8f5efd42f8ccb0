// Names shared by the daemon, the clients and the wire protocol for pages and publish results.
#pragma once

#include <cstdint>

#include "common/block_hash.h"

namespace kvpool {

// A page is named by its index in the pool, never by an address: the address is
// pool_base + page · page_stride in every process that maps the pool.
using PageId = uint32_t;
// The prefix index is scoped by namespace; the daemon derives it from the session's pool and
// tenant, never from what a client claims.
using Namespace = uint32_t;

inline constexpr PageId kNoPage = UINT32_MAX;

struct PublishItem {
  PageId page = kNoPage;
  BlockHash hash;
  friend constexpr bool operator==(const PublishItem&, const PublishItem&) = default;
};

struct PublishResult {
  enum class Kind : uint8_t { stored = 0, duplicate = 1 };
  Kind kind = Kind::stored;
  // stored: the page that was published. duplicate: the page that already carries this hash,
  // now retained for the caller (who may release its own copy and use this one).
  PageId page = kNoPage;
  friend constexpr bool operator==(const PublishResult&, const PublishResult&) = default;
};

}  // namespace kvpool

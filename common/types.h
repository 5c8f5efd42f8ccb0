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

// What a client may tell the pool about the pages of a call (alloc, retain, publish), so that
// eviction can tell a shared system prompt from a one-off request. A hint never changes what a
// page holds or who holds it; it only orders eviction.
enum class Priority : uint8_t {
  none = 0,          // no opinion: the policy judges by reuse
  one_off = 1,       // unlikely to be asked for again: evicted before other cached pages
  conversation = 2,  // a turn of a conversation that will probably continue
  system = 3,        // a prefix many requests share (system prompt, document): evicted last
};
inline constexpr uint8_t kMaxPriority = 3;

struct PageHints {
  // A page's class is the highest any call gave it since it was allocated.
  Priority priority = Priority::none;
  // > 0: the page stays cached at least this long after the call, whatever the policy says;
  // then it is an ordinary candidate again. Bounded per tenant by the daemon (count and TTL).
  uint32_t pin_ttl_ms = 0;
  bool empty() const { return priority == Priority::none && pin_ttl_ms == 0; }
  friend constexpr bool operator==(const PageHints&, const PageHints&) = default;
};

}  // namespace kvpool

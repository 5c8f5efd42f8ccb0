// The eviction policy interface: the pool core moves pages, a policy only chooses.
//
// The pool tells the policy when a page becomes CACHED (its last reference was released and it
// carries a hash) and when a CACHED page is taken back into use by a hit; it asks the policy for a
// victim when it needs a page and no FREE one is left, and when an operator flushes or evicts.
// A policy keeps the set of CACHED pages in queues of its own making (intrusive arrays sized to
// the pool, so every call is O(1) or O(log n)); the pool checks through for_each_queued() that
// every CACHED page is queued exactly once and no other page is.
//
// Order of calls for one page: on_cached → (on_reuse | chosen by victim()) → ... The pool never
// calls on_reuse for a page it did not pass to on_cached, and never calls on_cached twice without
// one of the two in between.
//
// Thread-safety: none; the policy belongs to one PagePool and is called from its thread only.
#pragma once

#include <functional>
#include <memory>
#include <string_view>

#include "daemon/core/types.h"

namespace kvpool::core {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;

  // Called once, before any other call, with the pool's page count.
  virtual void attach(uint32_t num_pages) = 0;

  // `page` has just become CACHED: queue it.
  virtual void on_cached(PageId page) = 0;

  // `page` was CACHED and a lookup or a duplicate publish takes it back into use: dequeue it.
  virtual void on_reuse(PageId page) = 0;

  // Choose a CACHED page to drop, dequeue it and return it; kNoPage when none is queued.
  virtual PageId victim() = 0;

  // Calls `fn` once per queued page, for the pool's invariant check.
  virtual void for_each_queued(const std::function<void(PageId)>& fn) const = 0;
};

// The policies the core ships. Names: "lru".
std::unique_ptr<EvictionPolicy> make_policy(std::string_view name);

}  // namespace kvpool::core

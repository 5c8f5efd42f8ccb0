// The eviction policy interface: the pool core moves pages, a policy only chooses.
//
// The pool tells the policy when a page becomes CACHED (its last reference was released, it
// carries a hash and no pin holds it) and when a CACHED page is taken back into use by a hit; it
// asks the policy for a victim when it needs a page and no FREE one is left, and when an operator
// flushes or evicts. A policy keeps the CACHED pages it was given in queues of its own making
// (intrusive arrays sized to the pool, so every call is O(1) amortized); the pool checks through
// for_each_queued() that every unpinned CACHED page is queued exactly once and no other page is.
//
// What the pool knows and a generic cache does not comes with each on_cached() as PageFacts:
// how often the page was found by a lookup or a duplicate publish since it was allocated (by any
// session, also while others held it), whether it is the first time the page is cached with its
// contents, the class the clients gave it, and a key naming its
// contents (so a policy can remember pages it evicted: the same key coming back is a re-use that
// the eviction cost).
//
// Order of calls for one page: on_cached → (on_reuse | chosen by victim()) → ... The pool never
// calls on_reuse for a page it did not pass to on_cached, and never calls on_cached twice without
// one of the two in between. A page released sequence-tail first enters the policy tail first:
// a policy that keeps arrival order within a class evicts a chain's tail before its head, so a
// lookup never finds a cached tail behind an evicted head that it can no longer reach.
//
// Thread-safety: none; the policy belongs to one PagePool and is called from its thread only.
// Error policy: misuse by the pool (an order of calls the contract above forbids) is a bug,
// caught by KVPOOL_DCHECK in debug builds.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "common/block_hash.h"
#include "daemon/core/types.h"

namespace kvpool::core {

// The 64-bit digest of a page's (namespace, hash) that PageFacts::key carries.
uint64_t contents_key(Namespace ns, const BlockHash& hash);

struct PageFacts {
  uint64_t key = 0;  // contents_key(namespace, hash)
  uint8_t hits = 0;  // lookup hits and duplicate publishes since alloc, saturating at 255
  Priority priority = Priority::none;
  bool first = false;  // the first time the page is CACHED since it got its hash
  // Pages the same call (a release, a session's close) cached before this one. A worker releases
  // a sequence tail first, so with run > 0 the page before was most likely this one's child.
  uint32_t run = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;

  // Called once, before any other call, with the pool's page count.
  virtual void attach(uint32_t num_pages) = 0;

  // The pool's page count changed (an elastic pool grew or shrank): resize the per-page state,
  // keeping the queued pages in their order. A pool that shrinks has taken every page at or past
  // `num_pages` out of the queues first (on_reuse). O(num_pages) at most; called rarely.
  virtual void resize(uint32_t num_pages) = 0;

  // `page` has just become CACHED: queue it.
  virtual void on_cached(PageId page, const PageFacts& facts) = 0;

  // `page` was CACHED and a lookup or a duplicate publish takes it back into use: dequeue it.
  virtual void on_reuse(PageId page) = 0;

  // Choose a CACHED page to drop, dequeue it and return it; kNoPage when none is queued.
  virtual PageId victim() = 0;

  // Calls `fn` once per queued page, for the pool's invariant check.
  virtual void for_each_queued(const std::function<void(PageId)>& fn) const = 0;
};

// The policies the core ships, by config name; null for an unknown name.
std::unique_ptr<EvictionPolicy> make_policy(std::string_view name);
// Their names, the default first.
std::span<const std::string_view> policy_names();
inline constexpr std::string_view kDefaultPolicy = "prefix";

}  // namespace kvpool::core

// PagePool: the pool core. Pages, reference counts, per-owner ledgers, the prefix index and
// eviction, with no I/O: the daemon's event loop drives it, tests and benches call it directly.
//
// Page states (DESIGN §3), kept in one word per page: bit 31 = "carries a hash", bits 0..30 = the
// reference count. FREE = word 0 (on the free stack); IN_USE = count > 0; CACHED = count 0 with the
// hash bit (queued in the eviction policy, findable in the index). The word sits next to the
// page's (namespace, hash) and the facts its policy is told, 32 bytes per page, so that a state
// change and what it needs share one cache line.
//
// Invariants, verified by check_invariants():
//   I0  the per-page state and the index are sized for num_pages() (elastic pools resize them);
//   I1  free + in_use + cached = total, and the maintained counters agree with the page words;
//   I2  a page's refcount = sum over owners of that owner's ledger count for it;
//   I3  every hashed page is in the index exactly once, under its own (namespace, hash); every
//       index entry points to a hashed page (so never to a FREE one);
//   I4  every unpinned CACHED page is queued in the eviction policy exactly once; no other page
//       is queued;
//   I5  the free stack holds exactly the FREE pages, each once;
//   I6  the pin set holds exactly the pinned pages, none FREE, under their expiry; each account's
//       count is its pins; pinned CACHED pages are counted in pinned_cached_ and not queued.
//
// Operations are batched and all-or-nothing: a call either succeeds for every item or returns an
// error and leaves the pool exactly as it was (counters for lookups included). Every per-page step
// is O(1): a free-stack pop/push, a ledger probe, an index probe, a policy link/unlink.
//
// Order matters in release(): pages become CACHED in the order given, so a worker that releases a
// sequence tail first lets the policy evict tails before heads. close_owner() releases a whole
// ledger in O(distinct pages), whatever the reference counts: each page's count drops at once.
//
// Quotas: lookup() and publish() take references to pages the owner may not hold yet (a hit, a
// duplicate). The caller bounds how many new distinct pages a call may add to the owner with
// `new_pages_allowed`: a lookup hit past it ends the prefix as a miss would; a publish whose
// duplicates would pass it fails with quota_exceeded and changes nothing. alloc() is bounded by
// its size, retain() only adds references to pages already held.
//
// Hints and pins: alloc, retain, lookup and publish may carry PageHints for the pages the caller
// ends up holding. The priority class is kept per page (the highest given since alloc) and passed
// to the policy. A pin is mechanism, not policy: a pinned page that becomes CACHED is held out of
// the policy (never a victim, only flush() drops it) until its pin expires, then it is queued like
// any page. Pins are charged to an account (the daemon's tenant): a call that would leave an
// account with more than its `pin_limit` pinned pages fails with pin_limit_exceeded and changes
// nothing. A page has one pin; a later expiry replaces it and moves the charge. Pins expire
// lazily, before anything counts or chooses victims, against the pool's clock (PoolOptions).
//
// Expensive checks: in builds with KVPOOL_EXPENSIVE_CHECKS (the sanitizer and fuzz trees), every
// mutating call ends with check_invariants() and aborts on a violation, unless the pool was made
// with PoolOptions::expensive_checks = false or the environment sets KVPOOL_EXPENSIVE_CHECKS=0
// (benchmarks run from such a tree).
//
// Elastic pools: grow() adds pages [old, new) as FREE, under the FREE pages already there on the
// free stack, so that alloc keeps handing out low pages first and a later shrink more often finds
// its tail FREE. shrink() removes pages [new, old), all or nothing: refused with pages_in_use when
// any of them is IN_USE. Their CACHED pages move to FREE pages below the new size while there are
// any, taking their metadata, pin and index entry with them. For the policy the old page leaves
// (on_reuse) and the new one arrives as a first caching with the page's facts, as set_policy()
// hands pages over: a moved page goes to the back of its class, the moved pages in the order the
// policy held them. The moves are returned and the CALLER must copy each page's bytes from → to
// before anything reads or writes either page (the core has no memory). When there are fewer
// FREE pages below than CACHED ones in the tail, the rest are evicted (observer removed(...,
// evicted), counted in evicted): unpinned ones in the policy's order first, pinned ones (whose
// pin promised they would stay) last. Cost: O(pages of the change), plus a rehash of the index
// when growth passes its table, plus one pass over the queued pages when the tail holds
// unpinned CACHED pages. Per-page state is resized to the new count.
//
// Index observer: when one is set, it is told of every (namespace, hash) that enters the index
// (publish) and every one that leaves it (eviction by alloc or evict(), flush()), in order, while
// the pool is mid-operation: it must not call back into the pool. The daemon turns these calls
// into stored/removed events; the core itself stays free of I/O.
//
// A relocation by shrink() is not an index change: the observer is not told of it (the key stays
// indexed); the caller learns of it from the moves.
//
// Thread-safety: none. One thread (the daemon's event loop) owns a PagePool.
// Error policy: client mistakes (bad ids, pages not held, counts too large, missing capacity) are
// returned as Status and change nothing; internal inconsistencies are bugs and abort via
// KVPOOL_CHECK.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/block_hash.h"
#include "common/geometry.h"
#include "common/status.h"
#include "daemon/core/eviction_policy.h"
#include "daemon/core/index_observer.h"
#include "daemon/core/ledger.h"
#include "daemon/core/prefix_index.h"
#include "daemon/core/types.h"

namespace kvpool::core {

struct PoolCounters {
  uint64_t lookups = 0;        // lookup calls
  uint64_t lookup_blocks = 0;  // hashes asked for
  uint64_t hit_blocks = 0;     // hashes found as part of the cached prefix
  uint64_t allocated = 0;      // pages handed out by alloc
  uint64_t released = 0;       // references dropped (release and close_owner)
  uint64_t published = 0;      // publish items stored
  uint64_t duplicates = 0;     // publish items answered with an existing page
  uint64_t evicted = 0;        // CACHED pages dropped to serve alloc or evict()
  uint64_t flushed = 0;        // CACHED pages dropped by flush()
  uint64_t pins = 0;           // pins set or extended
  uint64_t pins_expired = 0;   // pins that ran out
};

struct PoolStats {
  uint32_t total = 0;
  uint32_t free = 0;
  uint32_t in_use = 0;
  uint32_t cached = 0;
  uint32_t owners = 0;
  uint32_t pinned = 0;         // pages with a pin, any state
  uint32_t pinned_cached = 0;  // of the CACHED pages, those a pin holds out of the policy
  PoolCounters counters;
};

// A CACHED page that shrink() moved: its bytes must be copied from → to by the caller.
struct PageMove {
  PageId from = kNoPage;
  PageId to = kNoPage;
  friend bool operator==(const PageMove&, const PageMove&) = default;
};

struct PoolOptions {
  uint32_t num_pages = 0;
  std::unique_ptr<EvictionPolicy> policy;  // LRU when null
  uint64_t index_seed = 0;                 // keys the prefix index's slot hash; 0 = random
  // In KVPOOL_EXPENSIVE_CHECKS builds: check every invariant after every mutation (see above).
  // A caller replaying a long trace over a large pool may turn it off; elsewhere it is ignored.
  bool expensive_checks = true;
  // Milliseconds on a monotonic clock, for pins; a steady_clock reading when empty.
  std::function<uint64_t()> clock_ms = {};
};

// The hints of one call and whom its pins are charged to.
struct CallHints {
  PageHints hints;
  uint32_t pin_account = 0;         // e.g. the daemon's tenant index
  uint32_t pin_limit = UINT32_MAX;  // pages the account may have pinned at once
  // Pages pinned in the pool at once, every account together: so that accounts at their own
  // limits cannot pin the whole pool and leave unpinned work nothing to evict.
  uint32_t pool_pin_limit = UINT32_MAX;
};

class PagePool {
 public:
  static constexpr uint32_t kUnlimited = UINT32_MAX;
  // The item of a pin_limit_exceeded that the pool-wide cap (CallHints::pool_pin_limit) refused;
  // its value is the pool's pinned count the call would have left. The account's own limit
  // reports kNoItem and the account's count.
  static constexpr uint32_t kPoolPinItem = kNoItem - 1;

  explicit PagePool(PoolOptions options);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;
  ~PagePool();

  // Owners ------------------------------------------------------------------------------------
  // A fresh owner id; ids of closed owners are never handed out again.
  OwnerId open_owner();
  // Releases every reference the owner holds, newest first, and forgets the owner.
  Status close_owner(OwnerId owner);

  // Pages -------------------------------------------------------------------------------------
  // Hands out out.size() pages, each with one reference for `owner`: FREE pages first, then
  // CACHED ones in the policy's order. exceeds_capacity when more than the pool has,
  // out_of_pages when not enough are free or evictable now.
  Status alloc(OwnerId owner, std::span<PageId> out, const CallHints& hints = {});
  // What alloc() of n pages would refuse, checked without changing anything but expired pins, for
  // a pool that may hold up to `max_pages` and first grow by up to `growable` pages (an elastic
  // pool; a fixed one: num_pages() and 0): exceeds_capacity past max_pages, out_of_pages past
  // the free and unpinned cached pages + growable, pin_limit_exceeded. The daemon asks before it
  // grows or takes memory from another pool, so that a refused alloc changes nothing anywhere.
  Status admit_alloc(size_t n, const CallHints& hints, size_t max_pages, size_t growable);
  // +1 on each page; the owner must already hold it.
  Status retain(OwnerId owner, std::span<const PageId> pages, const CallHints& hints = {});
  // +1 on a page some owner holds now (IN_USE), for `owner`, who need not hold it: the daemon's
  // remote tier keeps a page a session published or hit this way while its bytes are written
  // out. not_held when no one holds the page (CACHED or FREE: its bytes may be reused).
  Status share(OwnerId owner, PageId page);
  // −1 on each page, in the order given; the owner must hold that many references.
  Status release(OwnerId owner, std::span<const PageId> pages);

  // Prefix cache ------------------------------------------------------------------------------
  // Finds the longest prefix of `chain` cached under `ns`, retains each of its pages for `owner`
  // and writes them to out[0..hits). out must have room for the whole chain.
  // A page whose reference count is saturated ends the prefix as a miss would.
  // At most `new_pages_allowed` of the hits may be pages the owner did not hold before.
  // Hints apply to the pages found; a pin is checked against its limits for the pages found that
  // the account does not pin already (renewing its own pins costs nothing), before anything
  // changes.
  Status lookup(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                std::span<PageId> out, uint32_t& hits, uint32_t new_pages_allowed = kUnlimited,
                const CallHints& hints = {});
  // As lookup(), for a pool whose queries see only a window of keys (`geometry` sliding or
  // chunked; any other kind is lookup() itself): a sequence resuming after n cached blocks reads
  // only blocks [first_needed_block(geometry, n), n) (common/geometry.h), so the answer is the
  // longest n for which those are cached, whether or not earlier blocks are. When that n is the
  // contiguous prefix's (for a chain that names no hash twice), it is lookup()'s answer exactly;
  // otherwise out[0, f) = kNoPage (f the first needed block), blocks [f, n) are retained as
  // lookup() retains them (quota, hints and pins included), and hits = n. A window whose pages
  // would pass `new_pages_allowed`, or that names one page twice, is not taken: the contiguous
  // prefix answers. Counted as one lookup of chain.size() blocks with n − f hits. Cost: one index
  // probe per block of the chain.
  Status lookup_window(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                       const Geometry& geometry, std::span<PageId> out, uint32_t& hits,
                       uint32_t new_pages_allowed = kUnlimited, const CallHints& hints = {});
  // Publishes each (page, hash) under `ns`. The owner must hold the page, and a page may appear
  // once per call. Publishing the hash a page already carries is a no-op answered `stored`.
  // quota_exceeded when the duplicates would hand the owner more than `new_pages_allowed`
  // pages it does not hold.
  // Hints apply to the pages the caller ends up with (out[i].page).
  Status publish(OwnerId owner, Namespace ns, std::span<const PublishItem> items,
                 std::span<PublishResult> out, uint32_t new_pages_allowed = kUnlimited,
                 const CallHints& hints = {});

  // Operator actions --------------------------------------------------------------------------
  // Pins whose time has come are dropped and their CACHED pages go to the policy. The pool does
  // this itself before it counts evictable pages or pins; call it before reading stats().
  void expire_pins() {
    if (!pins_.empty()) expire_due_pins();
  }
  // Drops up to n CACHED pages in the policy's order; returns how many.
  uint32_t evict(uint32_t n);
  // As evict(), but the dropped pages go to `owner` (one reference each, appended to `out`)
  // instead of the free stack, so that nothing reuses them until the owner releases them: the
  // daemon holds pages this way while their bytes are copied to the host tier off the event
  // loop. Precondition: `owner` is open.
  uint32_t evict_into(OwnerId owner, uint32_t n, std::vector<PageId>& out);
  // Evicts the page carrying (ns, hash) when it is CACHED and not pinned (another group of a
  // hybrid model lost that block, so no hit can use this one: PoolSet::drop_group_evictions).
  // Whether it did.
  bool drop_cached(Namespace ns, const BlockHash& hash);
  // Whether retain(owner, pages, hints) would pass its pin limits now, changing nothing (a call
  // that sets hints in several pools checks them all before it sets any).
  Status check_hints(std::span<const PageId> pages, const CallHints& hints);
  // The page carrying (ns, hash), in any state, or kNoPage; takes no reference.
  PageId find(Namespace ns, const BlockHash& hash) const { return find_cached(ns, hash); }
  // Drops every CACHED page, pinned ones too; pages in use (hashed or not) are untouched.
  // Returns how many.
  uint32_t flush();

  // Elastic pools (see above) -----------------------------------------------------------------
  // Pages [num_pages(), new_total) become FREE. invalid_argument unless
  // num_pages() < new_total <= kMaxPages.
  Status grow(uint32_t new_total);
  // Removes pages [new_total, num_pages()). invalid_argument unless 1 <= new_total < num_pages();
  // pages_in_use (item = how many, value = the first) when any of them is held. Appends the
  // CACHED pages it moved to `moves`; the caller copies their bytes before anything touches them.
  Status shrink(uint32_t new_total, std::vector<PageMove>& moves);

  // Inspection --------------------------------------------------------------------------------
  PoolStats stats() const;
  uint32_t num_pages() const { return static_cast<uint32_t>(pages_.size()); }
  bool valid_page(PageId page) const { return page < pages_.size(); }
  PageState state(PageId page) const;    // precondition: valid_page(page)
  uint32_t refcount(PageId page) const;  // precondition: valid_page(page)
  bool published(PageId page) const { return (pages_[page].word & kHashed) != 0; }  // ditto
  uint32_t held(OwnerId owner, PageId page) const;  // 0 for an unknown owner or page
  uint32_t owner_pages(OwnerId owner) const;        // distinct pages held; 0 if unknown
  // Pin expiry (the pool's clock, ms) of a page, 0 when unpinned; its priority class.
  uint64_t pinned_until(PageId page) const {  // valid_page
    return pages_[page].pinned ? pin_[page].until : 0;
  }
  Priority priority(PageId page) const { return pages_[page].priority; }  // valid_page
  uint32_t pinned_by(uint32_t account) const;  // pages the account has pinned now
  const EvictionPolicy& policy() const { return *policy_; }
  // Hands every queued page to `next` (attached here) in the order the old policy lists them
  // (eviction order, for the policies the core ships), as first cachings with what the pool
  // knows of them; the old policy's history (its ghost set) is lost. O(cached pages).
  void set_policy(std::unique_ptr<EvictionPolicy> next);
  // The key a page is indexed under; false when it carries no hash. Precondition: valid_page.
  bool indexed_key(PageId page, Namespace& ns, BlockHash& hash) const;
  uint32_t indexed() const { return index_.size(); }

  // Index observer (see above); null = none. Not owned; must outlive the pool or be reset.
  void set_observer(IndexObserver* observer) { observer_ = observer; }
  IndexObserver* observer() const { return observer_; }

  // Verifies invariants I1–I5. Returns an empty string when they hold, else the first violation.
  // O(pages + index slots + ledger slots): for tests and debug builds, not the hot path.
  std::string check_invariants() const;

 private:
  static constexpr uint32_t kHashed = uint32_t{1} << 31;
  static constexpr uint32_t kRefMask = kHashed - 1;

  // What the pool knows of a page, in one half cache line: a state change, the key it needs and
  // the facts the policy is told share it.
  struct alignas(32) PageMeta {
    uint32_t word = 0;  // refcount | kHashed
    Namespace ns = 0;   // valid when kHashed is set
    BlockHash hash;     // valid when kHashed is set
    uint8_t hits = 0;   // lookup hits and duplicates since alloc, saturating (PageFacts)
    Priority priority = Priority::none;  // the highest hint since alloc
    bool first = false;                  // not yet CACHED since it got its hash
    bool pinned = false;                 // pin_[page] holds its pin
    void forget_facts() {
      hits = 0;
      priority = Priority::none;
      first = false;
    }
  };
  static_assert(sizeof(PageMeta) == 32);

  struct OwnerSlot {
    uint32_t generation = 0;
    std::unique_ptr<Ledger> ledger;  // null while the slot is free
  };

  Ledger* ledger(OwnerId owner);
  const Ledger* ledger(OwnerId owner) const;
  // The page carrying (ns, hash), or kNoPage.
  PageId find_cached(Namespace ns, const BlockHash& hash) const;
  // A CACHED page chosen by the policy leaves the cache: out of the index, hash cleared. The
  // caller puts it on the free stack or hands it out.
  void uncache(PageId page, IndexObserver::Removal why);
  // Drops up to n victims onto the free stack.
  uint32_t drop_victims(uint32_t n, IndexObserver::Removal why);
  void expire_due_pins();
  // Hands a page that just became CACHED to the policy, or holds it out while pinned.
  void cache(PageId page);
  uint64_t now_ms() const;
  // The error for a call that would pin `adding` more pages of an account, or ok.
  Status check_pin_limit(const CallHints& hints, uint64_t adding) const;
  // Pages of `pages` (deduplicated) a pin by `hints` at `now` would newly charge to its account:
  // unpinned ones, and ones another account pinned until before the new expiry (a pin that ends
  // no later changes nothing, so its charge stays where it is).
  uint64_t new_pins(const CallHints& hints, std::span<const PageId> pages, uint64_t now);
  // The pages lookup() would hit for `chain` (out[0..k), k returned), found without taking
  // references: the cached prefix, ended by a miss, a saturated count or the owner's quota.
  uint32_t walk_prefix(Namespace ns, std::span<const BlockHash> chain, const Ledger& l,
                       uint32_t new_pages_allowed, std::span<PageId> out);
  // Applies the hints of a call to a page the caller now holds.
  void apply_hints(PageId page, const CallHints& hints, uint64_t now);
  void unpin(PageId page);
  // shrink(): CACHED page `from` and everything the pool keeps of it move to FREE page `to`.
  void relocate(PageId from, PageId to);
  // Per-page state sized for num_pages().
  void resize_page_state(uint32_t n);
  // One reference more / `n` fewer, with the state transitions that follow.
  void ref_page(PageId page);
  void unref_page(PageId page, uint32_t n = 1);
  // KVPOOL_EXPENSIVE_CHECKS builds: check_invariants() after a mutation, abort naming `op`.
  void checked(const char* op) const;

  // A page's pin, read only when PageMeta::pinned says there is one.
  struct Pin {
    uint64_t until = 0;  // the pool's clock, ms
    uint32_t account = 0;
  };

  std::vector<PageMeta> pages_;
  std::vector<PageId> free_;  // stack of FREE pages
  PrefixIndex index_;
  std::vector<Pin> pin_;
  std::set<std::pair<uint64_t, PageId>> pins_;  // (expiry, page) of every pinned page
  std::vector<uint32_t> pinned_per_account_;
  uint32_t pinned_cached_ = 0;
  uint32_t run_ = 0;  // pages cached by the current call so far (PageFacts::run)
  std::function<uint64_t()> clock_ms_;
  std::unique_ptr<EvictionPolicy> policy_;
  IndexObserver* observer_ = nullptr;

  std::vector<OwnerSlot> owners_;  // indexed by the low 32 bits of an OwnerId
  std::vector<uint32_t> free_owner_slots_;
  uint32_t open_owners_ = 0;

  bool expensive_checks_ = true;
  uint32_t in_use_ = 0;
  uint32_t cached_ = 0;
  PoolCounters counters_;

  // Scratch for undoing a failed batch and for duplicate detection; reused, never shrunk.
  std::vector<Ledger::Entry> undo_;
  std::vector<uint64_t> mark_;  // per page: last batch epoch that listed it
  std::vector<PageId> pin_scratch_;
  std::vector<uint32_t> item_scratch_;  // publish: item indices sorted by hash
  uint64_t epoch_ = 0;
};

}  // namespace kvpool::core

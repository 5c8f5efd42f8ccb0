// TierMover: moves blocks between a pool's device tier (PagePool) and its host tier (HostTier):
// demotion of the pages the device tier evicts, promotion of host hits back into device pages.
// The bookkeeping only; whoever owns the memory copies the bytes between the steps.
//
// Demotion. The mover is the pool's IndexObserver (forwarding every call to the next observer),
// so it sees each (namespace, hash, page) the pool evicts, mid-operation. Those evictions wait in
// a pending list until admit_pending() gives each a host slot; the caller then copies page → slot
// for the ones marked `copy`. The evicted page's bytes are intact until then: an eviction hands
// the page to the allocating caller or puts it on the free stack, and nothing writes it before
// the daemon's reply leaves, which comes after the copy.
//
// Promotion, for a lookup that missed in the device tier at chain position h:
//   1. start_promotion(): the run of chain[h..] the host tier holds (up to a bound) is claimed
//      (HostTier::begin_promote, so no demotion can take those slots) and as many device pages
//      are allocated for the owner; that allocation may evict, so
//   2. the caller runs admit_pending() and copies the demotions down, then copies each promoted
//      slot up into its page;
//   3. finish_promotion() publishes the hashes on the pages and frees the slots; or, when a copy
//      failed, cancel_promotion() releases the pages (never published, so FREE again) and puts
//      the slots back.
// Until step 3 the new pages carry no hash: no other owner can find them, and the caller's reply
// is not sent, so no worker ever sees a page half promoted. Each owner may have one promotion
// open, several owners at once (the copies of a promotion may run off the event loop while other
// sessions' calls go on).
//
// Thread-safety: none (the pool's thread). Errors: the pool's Status, the mover unchanged.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/core/host_tier.h"
#include "daemon/core/index_observer.h"
#include "daemon/core/page_pool.h"

namespace kvpool::core {

class TierMover final : public IndexObserver {
 public:
  // Installs itself as `pool`'s observer, forwarding to `next` (may be null), and makes `next`
  // the host tier's observer. All three outlive it.
  TierMover(PagePool& pool, HostTier& host, IndexObserver* next);
  ~TierMover() override;
  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  void stored(Namespace ns, const BlockHash& hash, PageId page) override;
  void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) override;

  struct Move {
    PageId page = kNoPage;
    SlotId slot = kNoSlot;
  };
  // Admits every eviction since the last call into the host tier. Returns the (page → slot)
  // copies the caller must make now; valid until the next call. Blocks the host tier had no room
  // for are lost, as without a tier.
  std::span<const Move> admit_pending();
  // A demotion whose copy failed: the slot must never be promoted.
  void discard(SlotId slot) { host_.discard(slot); }
  // Forgets the evictions not admitted yet: their pages went FREE within the call (a rolled-back
  // reservation), so another session may write them before a deferred copy would read them.
  // Those blocks are lost, as without a tier.
  void drop_pending() { pending_.clear(); }

  // Step 1 (see above): claims up to `max` consecutive host hits at the start of `chain`, fewer
  // when the device tier cannot free that many pages now, and allocates their device pages for
  // `owner` with `hints`. Returns the (slot → page) copies to make, empty when nothing is
  // promoted; valid until step 3. One promotion per owner is open at a time.
  std::span<const Move> start_promotion(OwnerId owner, Namespace ns,
                                        std::span<const BlockHash> chain, uint32_t max,
                                        const CallHints& hints);
  // Step 3: publishes the promoted hashes and frees their slots; writes the pages the owner now
  // holds for them to out[0..n) (a hash the device tier gained meanwhile is answered with that
  // page, the allocated one released). Returns the number promoted.
  uint32_t finish_promotion(OwnerId owner, Namespace ns, std::span<const BlockHash> chain,
                            std::span<PageId> out);
  // Without `keep_slots` the slots are freed, their blocks lost (their bytes may be bad).
  void cancel_promotion(OwnerId owner, bool keep_slots = true);

  const HostTier& host() const { return host_; }

 private:
  struct Eviction {
    Namespace ns = 0;
    BlockHash hash;
    PageId page = kNoPage;
  };
  PagePool& pool_;
  HostTier& host_;
  IndexObserver* next_;
  std::vector<Eviction> pending_;
  std::vector<Move> demotions_;
  std::unordered_map<OwnerId, std::vector<Move>> promotions_;  // the open promotion of each owner
  std::vector<PublishItem> items_;
  std::vector<PublishResult> results_;
  std::vector<PageId> pages_;
};

}  // namespace kvpool::core

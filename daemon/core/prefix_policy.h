// The prefix policy (kvpool's default): segmented LRU over what a prefix pool knows of its pages.
//
// Four FIFO lists of CACHED pages, emptied in this order when a victim is needed:
//   one_off    pages a client marked one-off (Priority::one_off) that nobody has hit since;
//   probation  pages with no evidence of re-use yet: published once, never hit;
//   protected  pages with evidence of re-use: a lookup hit or a duplicate publish since alloc
//              (by any session, also while another held the page), a key that the ghost set
//              remembers (the contents were evicted before and were needed again), or a client's
//              Priority::conversation;
//   system     pages a client marked Priority::system (a prompt many requests share).
// Within a list the page released longest ago goes first. Two caps keep every list reachable:
// protected holds at most 90% of the pool's pages and system at most 50%; past a cap the list's
// oldest page moves down one segment (system → protected → probation), at the tail.
//
// Why this order: on request traces, a block seen once is reused far less often than one seen
// twice (Mooncake's trace: 45% against 80%), and most of what LRU loses is re-used blocks pushed
// out by long one-off requests. Probation absorbs those; protected keeps what proved useful, and
// the ghost set (2× the pool's pages) recognises a block that comes back after its eviction. See
// bench/RESULTS.md "Eviction policies" for the measurements behind the choice.
//
// Tails before heads: a block is only worth keeping while its whole prefix is. A released chain
// enters its list tail first, and within one release (PageFacts::run > 0) a page goes to at least
// the segment of the page released before it, its child: evidence about a tail (a hit on block k
// is a hit on blocks 0..k-1 too) lifts the head with it. So no segment order or lost ghost key
// (the set is approximate) evicts a head while its tail stays, unreachable behind it.
//
// Every call is O(1) amortized (a cap moves at most one page per call on_cached made), no
// allocation after attach(). Memory per page: 12 bytes of links, 8 of state, ~9 of ghost set.
#pragma once

#include <vector>

#include "daemon/core/eviction_policy.h"
#include "daemon/core/ghost_set.h"
#include "daemon/core/page_lists.h"

namespace kvpool::core {

class PrefixPolicy final : public EvictionPolicy {
 public:
  enum Segment : uint8_t { kOneOff = 0, kProbation = 1, kProtected = 2, kSystem = 3 };
  static constexpr uint8_t kSegments = 4;

  std::string_view name() const override { return "prefix"; }
  void attach(uint32_t num_pages) override;
  // Keeps the queues and the ghost set; the caps follow the new size (a list past its new cap
  // moves down one page per on_cached call, as always). The ghost set is rebuilt, forgetting
  // what it held, only when the pool grows past the size it was made for.
  void resize(uint32_t num_pages) override;
  void on_cached(PageId page, const PageFacts& facts) override;
  void on_reuse(PageId page) override { lists_.unlink(page); }
  PageId victim() override;
  void for_each_queued(const std::function<void(PageId)>& fn) const override;

  // For tests: the segment a queued page is in.
  Segment segment_of(PageId page) const { return static_cast<Segment>(lists_.list_of(page)); }
  uint32_t segment_size(Segment s) const { return lists_.size(s); }

 private:
  void set_caps(uint32_t num_pages);

  // Per page: its key, with bit 63 set when the ghost set remembered the key as the page was
  // first cached (the contents came back after an eviction). One word, so that on_cached and
  // victim touch one line of it.
  static constexpr uint64_t kCameBack = uint64_t{1} << 63;
  PageLists<kSegments> lists_;
  std::vector<uint64_t> state_;
  GhostSet ghost_;
  Segment last_segment_ = kProbation;  // of the last on_cached call
  uint32_t protected_cap_ = 0;
  uint32_t system_cap_ = 0;
  uint64_t ghost_capacity_ = 0;
};

}  // namespace kvpool::core

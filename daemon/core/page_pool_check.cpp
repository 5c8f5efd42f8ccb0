// PagePool::check_invariants(): the invariants of DESIGN §3, checked the slow, obvious way.

#include <string>
#include <vector>

#include "daemon/core/page_pool.h"

namespace kvpool::core {

namespace {

std::string page_msg(PageId page, const std::string& what) {
  return "page " + std::to_string(page) + ": " + what;
}

}  // namespace

std::string PagePool::check_invariants() const {
  const uint32_t total = num_pages();

  // I0 (elastic pools): per-page state and the index are sized for the current page count.
  if (pin_.size() != total || mark_.size() != total) {
    return "I0: per-page state sized for " + std::to_string(pin_.size()) + " / " +
           std::to_string(mark_.size()) + " pages, the pool has " + std::to_string(total);
  }
  if (index_.capacity() < total) {
    return "I0: the index has room for " + std::to_string(index_.capacity()) + " keys, the pool " +
           "has " + std::to_string(total) + " pages";
  }

  // I1: the state counts add up and agree with the maintained counters.
  uint64_t n_free = 0;
  uint64_t n_in_use = 0;
  uint64_t n_cached = 0;
  uint64_t n_hashed = 0;
  for (PageId p = 0; p < total; ++p) {
    switch (state(p)) {
      case PageState::free:
        ++n_free;
        break;
      case PageState::in_use:
        ++n_in_use;
        break;
      case PageState::cached:
        ++n_cached;
        break;
    }
    if (pages_[p].word & kHashed) ++n_hashed;
  }
  if (n_free + n_in_use + n_cached != total) return "I1: free + in_use + cached != total";
  if (n_in_use != in_use_) {
    return "I1: " + std::to_string(n_in_use) + " pages in use, counter says " +
           std::to_string(in_use_);
  }
  if (n_cached != cached_) {
    return "I1: " + std::to_string(n_cached) + " pages cached, counter says " +
           std::to_string(cached_);
  }

  // I5: the free stack holds exactly the FREE pages.
  if (free_.size() != n_free) {
    return "I5: free stack holds " + std::to_string(free_.size()) + " pages, " +
           std::to_string(n_free) + " are free";
  }
  std::vector<uint8_t> seen(total, 0);
  for (const PageId p : free_) {
    if (p >= total) return "I5: free stack holds invalid id " + std::to_string(p);
    if (state(p) != PageState::free) return page_msg(p, "I5: on the free stack but not free");
    if (seen[p]++ != 0) return page_msg(p, "I5: on the free stack twice");
  }

  // I2: refcount = sum of ledger counts.
  std::vector<uint64_t> sums(total, 0);
  uint32_t open = 0;
  for (size_t o = 0; o < owners_.size(); ++o) {
    const Ledger* l = owners_[o].ledger.get();
    if (l == nullptr) continue;
    ++open;
    std::string err;
    uint64_t refs = 0;
    uint32_t entries = 0;
    l->for_each([&](const Ledger::Entry& e) {
      if (!err.empty()) return;
      if (e.page >= total)
        err = "I2: owner " + std::to_string(o) + " holds an invalid page";
      else if (e.count == 0)
        err = page_msg(e.page, "I2: ledger entry with count 0");
      else
        sums[e.page] += e.count;
      refs += e.count;
      ++entries;
    });
    if (!err.empty()) return err;
    if (refs != l->references() || entries != l->size()) {
      return "I2: owner " + std::to_string(o) + " ledger totals disagree with its entries";
    }
  }
  if (open != open_owners_) return "I2: open owner count disagrees with the owner slots";
  for (PageId p = 0; p < total; ++p) {
    if (sums[p] != refcount(p)) {
      return page_msg(p, "I2: refcount " + std::to_string(refcount(p)) + " but ledgers hold " +
                             std::to_string(sums[p]));
    }
  }

  // I3: index ↔ hashed pages, one to one, keys agreeing.
  std::fill(seen.begin(), seen.end(), 0);
  std::string err;
  index_.for_each([&](uint32_t tag, PageId p) {
    if (!err.empty()) return;
    if (p >= total) {
      err = "I3: index entry points to invalid id " + std::to_string(p);
    } else if ((pages_[p].word & kHashed) == 0) {
      err = page_msg(p, "I3: indexed but carries no hash");
    } else if (index_.tag(pages_[p].ns, pages_[p].hash) != tag) {
      err = page_msg(p, "I3: indexed under a key it does not carry");
    } else if (seen[p]++ != 0) {
      err = page_msg(p, "I3: indexed twice");
    }
  });
  if (!err.empty()) return err;
  if (index_.size() != n_hashed) {
    return "I3: index holds " + std::to_string(index_.size()) + " entries, " +
           std::to_string(n_hashed) + " pages carry a hash";
  }
  for (PageId p = 0; p < total; ++p) {
    if ((pages_[p].word & kHashed) != 0 && seen[p] == 0)
      return page_msg(p, "I3: hashed, not indexed");
    if ((pages_[p].word & kHashed) != 0 && find_cached(pages_[p].ns, pages_[p].hash) != p) {
      return page_msg(p, "I3: its key does not find it in the index");
    }
  }

  // I6: the pin set, the accounts and the pinned CACHED pages agree with the pages' pins.
  uint64_t n_pinned = 0;
  uint64_t n_pinned_cached = 0;
  std::vector<uint64_t> per_account(pinned_per_account_.size(), 0);
  for (PageId p = 0; p < total; ++p) {
    if (!pages_[p].pinned) {
      if (pin_[p].until != 0) return page_msg(p, "I6: unpinned with a pin expiry");
      continue;
    }
    const Pin& x = pin_[p];
    ++n_pinned;
    if (state(p) == PageState::free) return page_msg(p, "I6: free but pinned");
    if (state(p) == PageState::cached) ++n_pinned_cached;
    if (pins_.count({x.until, p}) != 1) return page_msg(p, "I6: pinned, not in the pin set");
    if (x.account >= per_account.size()) return page_msg(p, "I6: pinned to an unknown account");
    ++per_account[x.account];
  }
  if (pins_.size() != n_pinned) {
    return "I6: pin set holds " + std::to_string(pins_.size()) + " pages, " +
           std::to_string(n_pinned) + " are pinned";
  }
  for (size_t a = 0; a < per_account.size(); ++a) {
    if (per_account[a] != pinned_per_account_[a]) {
      return "I6: account " + std::to_string(a) + " counts " +
             std::to_string(pinned_per_account_[a]) + " pins, holds " +
             std::to_string(per_account[a]);
    }
  }
  if (n_pinned_cached != pinned_cached_) return "I6: pinned cached pages disagree with the counter";

  // I4: exactly the unpinned CACHED pages are queued, once each.
  std::fill(seen.begin(), seen.end(), 0);
  uint64_t queued = 0;
  policy_->for_each_queued([&](PageId p) {
    if (!err.empty()) return;
    ++queued;
    if (p >= total)
      err = "I4: policy queues invalid id " + std::to_string(p);
    else if (state(p) != PageState::cached)
      err = page_msg(p, "I4: queued but not cached");
    else if (pages_[p].pinned)
      err = page_msg(p, "I4: queued while pinned");
    else if (seen[p]++ != 0)
      err = page_msg(p, "I4: queued twice");
  });
  if (!err.empty()) return err;
  if (queued + n_pinned_cached != n_cached) {
    return "I4: policy queues " + std::to_string(queued) + " pages and " +
           std::to_string(n_pinned_cached) + " are pinned, " + std::to_string(n_cached) +
           " are cached";
  }
  return {};
}

}  // namespace kvpool::core

// Randomized test of PagePool against a plain reference model.
//
// Long random sequences of every operation, valid and invalid, on a small pool with a small hash
// universe, so that hits, duplicates, evictions and out_of_pages are frequent. Before each call
// the model predicts the Status (and, where the pool's documented behaviour fixes them, the pages
// returned); after it, the pool's whole visible state (stats, counters, every page's state and
// refcount, every owner's holdings, the eviction queue in order) must equal the model's, and
// check_invariants() must pass. A call the model expects to fail must leave the pool exactly as
// it was.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/page_pool.h"

namespace kvpool::core {
namespace {

constexpr uint32_t kPages = 64;
constexpr uint32_t kOwners = 4;
constexpr uint32_t kSeqs = 4;    // hash chains per namespace
constexpr uint32_t kSeqLen = 6;  // blocks per chain
constexpr Namespace kNamespaces[] = {1, 2};
constexpr uint32_t kOpsPerSeed = 16000;

// Hash ids: chain s, block i -> s * 16 + i. Distinct ids give distinct hashes.
uint32_t hash_id(uint32_t seq, uint32_t block) {
  return seq * 16 + block;
}
BlockHash hash_of(uint32_t id) {
  return BlockHash{uint64_t{id} * 0x9E3779B97F4A7C15ull + 0x51ED, uint64_t{id} << 7};
}

std::string describe(const Status& s) {
  return s.message() + " [item " + std::to_string(s.item()) + ", value " +
         std::to_string(s.value()) + "]";
}

std::vector<uint64_t> flat(const PoolCounters& c) {
  return {c.lookups,   c.lookup_blocks, c.hit_blocks, c.allocated, c.released,
          c.published, c.duplicates,    c.evicted,    c.flushed};
}

// The reference model: the pool's documented behaviour, written the obvious way.
struct Model {
  struct Page {
    uint32_t ref = 0;
    bool hashed = false;
    Namespace ns = 0;
    uint32_t hash = 0;  // hash id
  };
  struct Owner {
    std::vector<uint32_t> count = std::vector<uint32_t>(kPages, 0);
    // When the owner took the page while holding none of it: close_owner releases newest first.
    std::vector<uint64_t> stamp = std::vector<uint64_t>(kPages, 0);
  };

  std::vector<Page> pages = std::vector<Page>(kPages);
  std::map<std::pair<Namespace, uint32_t>, PageId> index;
  std::vector<PageId> lru;  // front = least recently released = next victim
  std::vector<bool> is_free = std::vector<bool>(kPages, true);
  uint32_t n_free = kPages;
  std::map<OwnerId, Owner> owners;  // open owners only
  PoolCounters counters;
  uint64_t next_stamp = 0;

  uint32_t held(OwnerId o, PageId p) const {
    const auto it = owners.find(o);
    return it == owners.end() || p >= kPages ? 0 : it->second.count[p];
  }
  uint32_t cached() const { return static_cast<uint32_t>(lru.size()); }
  PageId find(Namespace ns, uint32_t hash) const {
    const auto it = index.find({ns, hash});
    return it == index.end() ? kNoPage : it->second;
  }
  PageState state(PageId p) const {
    if (pages[p].ref > 0) return PageState::in_use;
    return pages[p].hashed ? PageState::cached : PageState::free;
  }

  // One more reference for `o`: a CACHED page leaves the queue, a FREE one the free set.
  void ref(OwnerId o, PageId p) {
    Page& pg = pages[p];
    if (pg.ref == 0) {
      if (is_free[p]) {
        is_free[p] = false;
        --n_free;
      } else {
        const auto it = std::find(lru.begin(), lru.end(), p);
        ASSERT_NE(it, lru.end()) << "page " << p;
        lru.erase(it);
      }
    }
    ++pg.ref;
    Owner& ow = owners.at(o);
    if (ow.count[p]++ == 0) ow.stamp[p] = next_stamp++;
  }
  void unref(PageId p) {
    Page& pg = pages[p];
    if (--pg.ref != 0) return;
    if (pg.hashed) {
      lru.push_back(p);
    } else {
      is_free[p] = true;
      ++n_free;
    }
  }
  // The next victim leaves the cache: out of the index, hash cleared, FREE.
  PageId drop_victim() {
    const PageId p = lru.front();
    lru.erase(lru.begin());
    Page& pg = pages[p];
    index.erase({pg.ns, pg.hash});
    pg.hashed = false;
    is_free[p] = true;
    ++n_free;
    return p;
  }
};

enum class Op { alloc, retain, release, lookup, publish, evict, flush, reopen, bad_owner };

const char* op_name(Op op) {
  switch (op) {
    case Op::alloc:
      return "alloc";
    case Op::retain:
      return "retain";
    case Op::release:
      return "release";
    case Op::lookup:
      return "lookup";
    case Op::publish:
      return "publish";
    case Op::evict:
      return "evict";
    case Op::flush:
      return "flush";
    case Op::reopen:
      return "close_owner+open_owner";
    case Op::bad_owner:
      return "op with a bad owner";
  }
  return "?";
}

class Harness {
 public:
  explicit Harness(uint64_t seed) : rng_(seed), pool_(options(seed)) {
    for (uint32_t i = 0; i < kOwners; ++i) {
      const OwnerId o = pool_.open_owner();
      EXPECT_EQ(m_.owners.count(o), 0u) << "open_owner returned an open id " << o;
      m_.owners[o];
      slots_.push_back(o);
    }
  }

  // Runs `ops` random operations; stops at the first failure.
  void run(uint32_t ops) {
    for (uint32_t i = 0; i < ops; ++i) {
      const Op op = pick_op();
      const OwnerId actor = slots_[below(kOwners)];
      step(op, actor);
      if (!::testing::Test::HasFailure()) check(actor, i % 4 == 0, i % 4 == 0);
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "at op #" << i << ": " << op_name(op);
        return;
      }
    }
    check(kNoPage, true, true);
  }

  PoolStats stats() const { return pool_.stats(); }
  uint64_t outcome(Errc code) const {
    const auto it = outcomes_.find(code);
    return it == outcomes_.end() ? 0 : it->second;
  }

 private:
  static PoolOptions options(uint64_t seed) {
    PoolOptions o;
    o.num_pages = kPages;
    o.index_seed = seed;
    return o;
  }

  uint32_t below(size_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool chance(uint32_t percent) { return below(100) < percent; }

  Op pick_op() {
    const uint32_t r = below(1000);
    if (r < 190) return Op::alloc;
    if (r < 270) return Op::retain;
    if (r < 500) return Op::release;
    if (r < 720) return Op::lookup;
    if (r < 940) return Op::publish;
    if (r < 960) return Op::evict;
    if (r < 963) return Op::flush;
    if (r < 985) return Op::reopen;
    return Op::bad_owner;
  }

  void step(Op op, OwnerId o) {
    switch (op) {
      case Op::alloc:
        do_alloc(o);
        break;
      case Op::retain:
        do_retain(o);
        break;
      case Op::release:
        do_release(o);
        break;
      case Op::lookup:
        do_lookup(o);
        break;
      case Op::publish:
        do_publish(o);
        break;
      case Op::evict:
        do_evict();
        break;
      case Op::flush:
        do_flush();
        break;
      case Op::reopen:
        do_reopen(o);
        break;
      case Op::bad_owner:
        do_bad_owner(chance(50) ? 1000 + below(10) : kNoPage);
        break;
    }
  }

  // Compares the pool's whole visible state with the model. The model is not touched by a call
  // it expects to fail, so this also proves that a failed call changed nothing. Every op: stats,
  // counters, every page's refcount and state, the eviction queue, and the holdings of `actor`;
  // `all_owners` adds every owner's holdings, `invariants` check_invariants().
  void check(OwnerId actor, bool all_owners, bool invariants) {
    const PoolStats s = pool_.stats();
    ASSERT_EQ(s.total, kPages);
    ASSERT_EQ(s.free, m_.n_free);
    ASSERT_EQ(s.cached, m_.cached());
    ASSERT_EQ(s.in_use, kPages - m_.n_free - m_.cached());
    ASSERT_EQ(s.owners, m_.owners.size());
    ASSERT_EQ(flat(s.counters), flat(m_.counters));

    std::vector<uint32_t> got(kPages);
    std::vector<uint32_t> want(kPages);
    for (PageId p = 0; p < kPages; ++p) {
      got[p] = pool_.refcount(p);
      want[p] = m_.pages[p].ref;
    }
    ASSERT_EQ(got, want) << "refcounts";
    for (PageId p = 0; p < kPages; ++p) {
      got[p] = static_cast<uint32_t>(pool_.state(p));
      want[p] = static_cast<uint32_t>(m_.state(p));
    }
    ASSERT_EQ(got, want) << "page states (0 free, 1 in use, 2 cached)";
    std::vector<PageId> queue;
    queue.reserve(kPages);
    pool_.policy().for_each_queued([&](PageId p) { queue.push_back(p); });
    ASSERT_EQ(queue, m_.lru) << "eviction queue";

    for (const OwnerId o : slots_) {
      if (!all_owners && o != actor) continue;
      const auto it = m_.owners.find(o);  // absent for an owner just closed: holds nothing
      for (PageId p = 0; p < kPages; ++p)
        got[p] = pool_.held(o, p);
      ASSERT_EQ(got, it == m_.owners.end() ? std::vector<uint32_t>(kPages) : it->second.count)
          << "holdings of owner " << o;
    }
    if (invariants) {
      for (PageId p = 0; p < kPages; ++p) {
        ASSERT_EQ(m_.is_free[p], m_.state(p) == PageState::free) << "model, page " << p;
      }
      ASSERT_EQ(pool_.check_invariants(), "");
    }
  }

  // Checks a call's Status against the model's prediction. Returns whether the call succeeded
  // (and was expected to); the caller then applies it to the model.
  template <typename Call>
  bool expect_call(const Status& want, Call&& call) {
    const Status got = call();
    EXPECT_TRUE(got == want) << "got " << describe(got) << ", want " << describe(want);
    ++outcomes_[want.code()];
    return got.ok() && want.ok();
  }

  // Pages `o` holds, each listed as often as it is held.
  std::vector<PageId> held_multiset(OwnerId o) const {
    std::vector<PageId> out;
    const Model::Owner& ow = m_.owners.at(o);
    for (PageId p = 0; p < kPages; ++p)
      out.insert(out.end(), ow.count[p], p);
    return out;
  }

  // A page id that is invalid, or valid but not held by `o`.
  PageId bad_page(OwnerId o) {
    switch (below(4)) {
      case 0:
        return kPages;
      case 1:
        return kNoPage;
      case 2:
        return kPages + below(100000);
      default: {
        const PageId p = below(kPages);
        return m_.held(o, p) == 0 ? p : kPages + 1;
      }
    }
  }

  void do_alloc(OwnerId o) {
    const uint32_t avail = m_.n_free + m_.cached();
    size_t n = below(5);
    if (chance(3)) {
      n = kPages + 1 + below(8);
    } else if (chance(5)) {
      n = avail + 1 + below(3);
    }
    Status want;
    if (n > kPages) {
      want = Status(Errc::exceeds_capacity, kNoItem, n);
    } else if (n > avail) {
      want = Status(Errc::out_of_pages, kNoItem, n);
    }
    std::vector<PageId> out(n, kNoPage);
    if (!expect_call(want, [&] { return pool_.alloc(o, out); })) return;

    // FREE pages first (in no documented order), then victims in LRU order.
    const size_t from_free = std::min<size_t>(n, m_.n_free);
    for (size_t i = 0; i < n; ++i) {
      const PageId p = out[i];
      if (i < from_free) {
        ASSERT_TRUE(p < kPages && m_.is_free[p]) << "item " << i << ": page " << p << " not free";
      } else {
        ASSERT_EQ(p, m_.lru.front()) << "item " << i << ": not the LRU victim";
        m_.drop_victim();
        ++m_.counters.evicted;
      }
      ASSERT_NO_FATAL_FAILURE(m_.ref(o, p));
    }
    m_.counters.allocated += n;
  }

  void do_retain(OwnerId o) {
    const std::vector<PageId> held = held_multiset(o);
    std::vector<PageId> pages;
    const uint32_t k = 1 + below(3);
    for (uint32_t i = 0; i < k; ++i) {
      pages.push_back(held.empty() || chance(4) ? bad_page(o) : held[below(held.size())]);
    }
    Status want;
    for (size_t i = 0; i < pages.size(); ++i) {
      const auto item = static_cast<uint32_t>(i);
      if (pages[i] >= kPages) {
        want = Status(Errc::invalid_page, item, pages[i]);
        break;
      }
      if (m_.held(o, pages[i]) == 0) {
        want = Status(Errc::not_held, item, pages[i]);
        break;
      }
    }
    if (!expect_call(want, [&] { return pool_.retain(o, pages); })) return;
    for (const PageId p : pages) {
      ++m_.owners.at(o).count[p];
      ++m_.pages[p].ref;
    }
  }

  void do_release(OwnerId o) {
    std::vector<PageId> pages;
    if (chance(15)) {
      // Everything, newest first: an orderly tail-first release.
      const Model::Owner& ow = m_.owners.at(o);
      std::vector<std::pair<uint64_t, PageId>> by_stamp;
      for (PageId p = 0; p < kPages; ++p) {
        if (ow.count[p] > 0) by_stamp.emplace_back(ow.stamp[p], p);
      }
      std::sort(by_stamp.rbegin(), by_stamp.rend());
      for (const auto& [stamp, p] : by_stamp)
        pages.insert(pages.end(), ow.count[p], p);
    } else {
      std::vector<PageId> held = held_multiset(o);
      std::shuffle(held.begin(), held.end(), rng_);
      const size_t k = held.empty() ? 0 : 1 + below(std::min<size_t>(held.size(), 5));
      pages.assign(held.begin(), held.begin() + static_cast<ptrdiff_t>(k));
    }
    if (pages.empty() || chance(10)) {
      // A bad item: an invalid id, a page not held, or a held page listed too often.
      const PageId extra = !pages.empty() && chance(40) ? pages[below(pages.size())] : bad_page(o);
      pages.insert(pages.begin() + below(pages.size() + 1), extra);
      if (m_.held(o, extra) > 0 && chance(50)) {
        pages.insert(pages.end(), m_.held(o, extra), extra);
      }
    }
    Status want;
    std::map<PageId, uint32_t> left;
    for (size_t i = 0; i < pages.size(); ++i) {
      const PageId p = pages[i];
      const auto item = static_cast<uint32_t>(i);
      if (p >= kPages) {
        want = Status(Errc::invalid_page, item, p);
        break;
      }
      const auto it = left.try_emplace(p, m_.held(o, p)).first;
      if (it->second == 0) {
        want = Status(Errc::not_held, item, p);
        break;
      }
      --it->second;
    }
    if (!expect_call(want, [&] { return pool_.release(o, pages); })) return;
    // Pages change state in the order given.
    for (const PageId p : pages) {
      --m_.owners.at(o).count[p];
      m_.unref(p);
    }
    m_.counters.released += pages.size();
  }

  void do_lookup(OwnerId o) {
    const Namespace ns = kNamespaces[below(2)];
    std::vector<uint32_t> ids;
    if (chance(85)) {
      // A prefix of one chain, sometimes starting inside it, sometimes running past its end.
      const uint32_t seq = below(kSeqs);
      const uint32_t start = chance(85) ? 0 : below(kSeqLen);
      const uint32_t len = 1 + below(kSeqLen + 1 - start);
      for (uint32_t i = start; i < start + len; ++i)
        ids.push_back(hash_id(seq, i));
    } else {
      const uint32_t len = below(5);
      for (uint32_t i = 0; i < len; ++i)
        ids.push_back(hash_id(below(kSeqs), below(kSeqLen)));
    }
    std::vector<BlockHash> chain;
    for (const uint32_t id : ids)
      chain.push_back(hash_of(id));
    size_t out_size = chain.size() + below(2);
    Status want;
    if (!chain.empty() && chance(4)) {
      out_size = chain.size() - 1;
      want = Status(Errc::invalid_argument, kNoItem, out_size);
    }
    std::vector<PageId> want_pages;
    for (const uint32_t id : ids) {
      const PageId p = m_.find(ns, id);
      if (p == kNoPage) break;
      want_pages.push_back(p);
    }
    std::vector<PageId> out(out_size, kNoPage);
    uint32_t hits = 999;
    const bool done = expect_call(want, [&] { return pool_.lookup(o, ns, chain, out, hits); });
    if (!done) {
      EXPECT_EQ(hits, 0u);
      return;
    }
    ASSERT_EQ(hits, want_pages.size());
    out.resize(hits);
    ASSERT_EQ(out, want_pages);
    for (const PageId p : want_pages) {
      ASSERT_NO_FATAL_FAILURE(m_.ref(o, p));
    }
    ++m_.counters.lookups;
    m_.counters.lookup_blocks += chain.size();
    m_.counters.hit_blocks += hits;
  }

  void do_publish(OwnerId o) {
    const Namespace ns = kNamespaces[below(2)];
    // Mostly pages that carry no hash yet; some that do (a no-op or already_published).
    std::vector<PageId> fresh;
    std::vector<PageId> hashed;
    const Model::Owner& ow = m_.owners.at(o);
    for (PageId p = 0; p < kPages; ++p) {
      if (ow.count[p] > 0) (m_.pages[p].hashed ? hashed : fresh).push_back(p);
    }
    std::shuffle(fresh.begin(), fresh.end(), rng_);
    std::shuffle(hashed.begin(), hashed.end(), rng_);
    const uint32_t k = 1 + below(3);
    const uint32_t seq = below(kSeqs);
    const uint32_t start = below(kSeqLen - k + 1);
    std::vector<std::pair<PageId, uint32_t>> model_items;  // (page, hash id)
    for (uint32_t i = 0; i < k; ++i) {
      PageId p = bad_page(o);
      if (!chance(3)) {
        if (!fresh.empty() && (hashed.empty() || chance(85))) {
          p = fresh.back();
          fresh.pop_back();
        } else if (!hashed.empty()) {
          p = hashed.back();
          hashed.pop_back();
        }
      }
      uint32_t id = hash_id(seq, start + i);
      if (p < kPages && m_.pages[p].hashed && m_.pages[p].ns == ns && chance(50)) {
        id = m_.pages[p].hash;  // republish what it carries: a no-op
      }
      model_items.emplace_back(p, id);
    }
    if (chance(3)) {
      // The same page twice (the hash may differ or not).
      const auto dup = model_items[below(model_items.size())];
      model_items.insert(model_items.begin() + below(model_items.size() + 1), dup);
    }
    std::vector<PublishItem> items;
    for (const auto& [p, id] : model_items)
      items.push_back(PublishItem{p, hash_of(id)});
    size_t out_size = items.size();
    Status want;
    if (chance(3)) {
      out_size = items.size() - 1;
      want = Status(Errc::invalid_argument, kNoItem, out_size);
    }
    std::set<PageId> seen;
    for (size_t i = 0; i < model_items.size() && want.ok(); ++i) {
      const auto& [p, id] = model_items[i];
      const auto item = static_cast<uint32_t>(i);
      if (p >= kPages) {
        want = Status(Errc::invalid_page, item, p);
      } else if (m_.held(o, p) == 0) {
        want = Status(Errc::not_held, item, p);
      } else if (!seen.insert(p).second) {
        want = Status(Errc::duplicate_item, item, p);
      } else if (m_.pages[p].hashed && (m_.pages[p].ns != ns || m_.pages[p].hash != id)) {
        want = Status(Errc::already_published, item, p);
      }
    }
    std::vector<PublishResult> out(out_size);
    if (!expect_call(want, [&] { return pool_.publish(o, ns, items, out); })) return;

    for (size_t i = 0; i < model_items.size(); ++i) {
      const auto& [p, id] = model_items[i];
      Model::Page& pg = m_.pages[p];
      PublishResult expect{PublishResult::Kind::stored, p};
      if (!pg.hashed) {
        const PageId existing = m_.find(ns, id);
        if (existing != kNoPage) {
          ASSERT_NO_FATAL_FAILURE(m_.ref(o, existing));
          expect = {PublishResult::Kind::duplicate, existing};
          ++m_.counters.duplicates;
        } else {
          m_.index[{ns, id}] = p;
          pg.hashed = true;
          pg.ns = ns;
          pg.hash = id;
          ++m_.counters.published;
        }
      }
      ASSERT_EQ(out[i].kind, expect.kind) << "item " << i;
      ASSERT_EQ(out[i].page, expect.page) << "item " << i;
    }
  }

  void do_evict() {
    const uint32_t n = below(4);
    const uint32_t want = std::min(n, m_.cached());
    ASSERT_EQ(pool_.evict(n), want);
    for (uint32_t i = 0; i < want; ++i)
      m_.drop_victim();
    m_.counters.evicted += want;
  }

  void do_flush() {
    const uint32_t want = m_.cached();
    ASSERT_EQ(pool_.flush(), want);
    while (!m_.lru.empty())
      m_.drop_victim();
    m_.counters.flushed += want;
  }

  void do_reopen(OwnerId o) {
    ASSERT_TRUE(expect_call(Status{}, [&] { return pool_.close_owner(o); }));
    // Every reference goes back, the most recently taken page first.
    const Model::Owner& ow = m_.owners.at(o);
    std::vector<std::pair<uint64_t, PageId>> by_stamp;
    for (PageId p = 0; p < kPages; ++p) {
      if (ow.count[p] > 0) by_stamp.emplace_back(ow.stamp[p], p);
    }
    std::sort(by_stamp.rbegin(), by_stamp.rend());
    for (const auto& [stamp, p] : by_stamp) {
      for (uint32_t i = 0; i < ow.count[p]; ++i)
        m_.unref(p);
      m_.counters.released += ow.count[p];
    }
    m_.owners.erase(o);

    // Closed, the id is refused (until open_owner hands it out again), and holds nothing.
    ASSERT_NO_FATAL_FAILURE(do_bad_owner(o));
    ASSERT_NO_FATAL_FAILURE(check(o, true, true));

    const OwnerId fresh = pool_.open_owner();
    ASSERT_EQ(m_.owners.count(fresh), 0u) << "open_owner returned an open id " << fresh;
    m_.owners[fresh];
    *std::find(slots_.begin(), slots_.end(), o) = fresh;
  }

  // Any operation with an owner that is not open fails with invalid_owner and changes nothing.
  void do_bad_owner(OwnerId bad) {
    const Status want(Errc::invalid_owner, kNoItem, bad);
    const PageId p = below(kPages);
    const std::vector<PageId> pages = {p};
    switch (below(6)) {
      case 0: {
        std::vector<PageId> out(below(3), kNoPage);
        expect_call(want, [&] { return pool_.alloc(bad, out); });
        break;
      }
      case 1:
        expect_call(want, [&] { return pool_.retain(bad, pages); });
        break;
      case 2:
        expect_call(want, [&] { return pool_.release(bad, pages); });
        break;
      case 3: {
        const std::vector<BlockHash> chain = {hash_of(hash_id(0, 0))};
        std::vector<PageId> out(1, kNoPage);
        uint32_t hits = 7;
        expect_call(want, [&] { return pool_.lookup(bad, 1, chain, out, hits); });
        EXPECT_EQ(hits, 0u);
        break;
      }
      case 4: {
        const std::vector<PublishItem> items = {{p, hash_of(0)}};
        std::vector<PublishResult> out(1);
        expect_call(want, [&] { return pool_.publish(bad, 1, items, out); });
        break;
      }
      default:
        expect_call(want, [&] { return pool_.close_owner(bad); });
        break;
    }
  }

  std::mt19937_64 rng_;
  PagePool pool_;
  Model m_;
  std::vector<OwnerId> slots_;  // the open owners the test drives
  std::map<Errc, uint64_t> outcomes_;
};

class PagePoolRandom : public ::testing::TestWithParam<uint64_t> {};

TEST_P(PagePoolRandom, AgreesWithReferenceModel) {
  Harness h(GetParam());
  if (HasFailure()) return;
  h.run(kOpsPerSeed);
  if (HasFailure()) return;

  // The sequence exercised what it is meant to: each of these paths ran many times.
  const PoolCounters c = h.stats().counters;
  EXPECT_GT(c.hit_blocks, 2000u);
  EXPECT_GT(c.duplicates, 300u);
  EXPECT_GT(c.evicted, 200u);
  EXPECT_GT(c.flushed, 50u);
  EXPECT_GT(c.published, 500u);
  for (const Errc code : {Errc::ok, Errc::invalid_argument, Errc::invalid_page, Errc::invalid_owner,
                          Errc::not_held, Errc::out_of_pages, Errc::exceeds_capacity,
                          Errc::already_published, Errc::duplicate_item}) {
    EXPECT_GT(h.outcome(code), 20u) << errc_name(code);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, PagePoolRandom, ::testing::Values(1, 2, 3, 0xC0FFEE));

}  // namespace
}  // namespace kvpool::core

// Randomized test of PagePool against a plain reference model, for every eviction policy.
//
// Long random sequences of every operation, valid and invalid, on a small pool with a small hash
// universe, so that hits, duplicates, evictions and out_of_pages are frequent. Calls carry random
// hints (priority classes, pins with small TTLs charged to a few accounts with small pin limits)
// and a fake clock moves forward at random, so pins are set, extended, moved between accounts,
// refused at their limit and expire.
//
// The model is the pool's documented behaviour written the obvious way: maps and vectors, a pin
// set expired exactly where the pool expires pins, and a reference implementation of the pool's
// eviction policy (std::vector queues, erase by find) fed with PageFacts the model computes
// itself (hits since alloc, first caching, release run, priority). The pool's policy is wrapped in
// a RecordingPolicy, so every call the pool makes to it (on_cached with its facts, on_reuse,
// victim) must equal the model's, in order.
//
// Before each call the model predicts the Status (and, where the pool's documented behaviour fixes
// them, the pages returned); after it, the pool's whole visible state (stats, counters, every
// page's state, refcount, pin and class, pins per account, every owner's holdings, the eviction
// queue in order, the prefix policy's segments) must equal the model's, and check_invariants()
// must pass. A call the model expects to fail must leave the pool exactly as it was, except for
// pins that expired before it was refused (the pool expires pins before counting).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/core/ghost_set.h"
#include "daemon/core/page_pool.h"
#include "daemon/core/prefix_policy.h"
#include "tests/unit/recording_policy.h"
#include "tests/unit/status_assertions.h"

namespace kvpool::core {
namespace {

using kvpool::testing::describe;
using kvpool::testing::is;
using kvpool::testing::ok;

using test::cached_call;
using test::PolicyCall;
using test::RecordingPolicy;
using test::reuse_call;
using test::victim_call;

constexpr uint32_t kPages = 64;
constexpr uint32_t kOwners = 4;
constexpr uint32_t kSeqs = 4;    // hash chains per namespace
constexpr uint32_t kSeqLen = 6;  // blocks per chain
constexpr Namespace kNamespaces[] = {1, 2};
constexpr uint32_t kOpsPerSeed = 10000;
constexpr uint32_t kAccounts = 3;
constexpr uint32_t kPinLimit[kAccounts] = {3, 6, 12};

// Hash ids: chain s, block i -> s * 16 + i. Distinct ids give distinct hashes.
uint32_t hash_id(uint32_t seq, uint32_t block) {
  return seq * 16 + block;
}
BlockHash hash_of(uint32_t id) {
  return BlockHash{uint64_t{id} * 0x9E3779B97F4A7C15ull + 0x51ED, uint64_t{id} << 7};
}

std::vector<uint64_t> flat(const PoolCounters& c) {
  return {c.lookups,    c.lookup_blocks, c.hit_blocks, c.allocated, c.released,    c.published,
          c.duplicates, c.evicted,       c.flushed,    c.pins,      c.pins_expired};
}

// Reference policies -------------------------------------------------------------------------
// Each written from its header's description, with plain vectors. `events` counts the decisions
// each took, so that the test can tell that the random sequence exercised them.

void erase_page(std::vector<PageId>& q, PageId p) {
  const auto it = std::find(q.begin(), q.end(), p);
  ASSERT_NE(it, q.end()) << "page " << p << " not queued";
  q.erase(it);
}

PageId pop_front(std::vector<PageId>& q) {
  const PageId p = q.front();
  q.erase(q.begin());
  return p;
}

class RefPolicy {
 public:
  virtual ~RefPolicy() = default;
  virtual void on_cached(PageId p, const PageFacts& f) = 0;
  virtual void on_reuse(PageId p) = 0;
  virtual PageId victim() = 0;  // kNoPage when nothing is queued
  virtual std::vector<PageId> order() const = 0;
  std::map<std::string, uint64_t> events;
};

class RefLru final : public RefPolicy {
 public:
  void on_cached(PageId p, const PageFacts&) override { q_.push_back(p); }
  void on_reuse(PageId p) override { erase_page(q_, p); }
  PageId victim() override { return q_.empty() ? kNoPage : pop_front(q_); }
  std::vector<PageId> order() const override { return q_; }

 private:
  std::vector<PageId> q_;
};

class RefS3Fifo final : public RefPolicy {
 public:
  explicit RefS3Fifo(uint32_t pages)
      : small_target_(std::max<uint32_t>(1, pages / 10)),
        ghost_(pages - pages / 10),
        state_(pages) {}

  void on_cached(PageId p, const PageFacts& f) override {
    State& s = state_[p];
    if (f.first) {
      const bool back = ghost_.take(f.key);
      s = State{f.key, 0, 0, back};
      ++events[back ? "ghost comeback to main" : "new to small"];
    }
    s.freq = std::min(3, s.freq + (f.hits - s.hits));
    s.hits = f.hits;
    (s.main ? main_ : small_).push_back(p);
  }
  void on_reuse(PageId p) override { erase_page(state_[p].main ? main_ : small_, p); }
  PageId victim() override {
    // Small when it holds at least its target or main is empty: its oldest unhit page goes, hit
    // ones move to main on the way. Else (or when all of small moved) main, hit pages going
    // round again with one less.
    if (!small_.empty() && (small_.size() >= small_target_ || main_.empty())) {
      while (!small_.empty()) {
        const PageId p = pop_front(small_);
        State& s = state_[p];
        if (s.freq == 0) {
          ghost_.insert(s.key);
          ++events["evicted from small"];
          return p;
        }
        s.freq = 0;
        s.main = true;
        main_.push_back(p);
        ++events["small to main"];
      }
    }
    while (!main_.empty()) {
      const PageId p = pop_front(main_);
      State& s = state_[p];
      if (s.freq == 0) {
        ++events["evicted from main"];
        return p;
      }
      --s.freq;
      main_.push_back(p);
      ++events["main reinsert"];
    }
    return kNoPage;
  }
  std::vector<PageId> order() const override {
    std::vector<PageId> out = small_;
    out.insert(out.end(), main_.begin(), main_.end());
    return out;
  }

 private:
  struct State {
    uint64_t key = 0;
    int hits = 0;
    int freq = 0;
    bool main = false;
  };
  size_t small_target_;
  GhostSet ghost_;
  std::vector<State> state_;
  std::vector<PageId> small_;
  std::vector<PageId> main_;
};

class RefPrefix final : public RefPolicy {
 public:
  enum Seg { kOneOff = 0, kProbation = 1, kProtected = 2, kSystem = 3 };
  static constexpr const char* kNames[] = {"one-off", "probation", "protected", "system"};

  explicit RefPrefix(uint32_t pages)
      : ghost_(uint64_t{pages} * 2),
        protected_cap_(std::max<uint32_t>(1, pages - pages / 10)),
        system_cap_(std::max<uint32_t>(1, pages / 2)),
        key_(pages),
        came_back_(pages) {}

  void on_cached(PageId p, const PageFacts& f) override {
    if (f.first) {
      key_[p] = f.key;
      came_back_[p] = ghost_.take(f.key);
      if (came_back_[p]) ++events["ghost comeback"];
    }
    Seg s = kProbation;
    if (f.priority == Priority::system) {
      s = kSystem;
    } else if (f.hits > 0 || came_back_[p] || f.priority == Priority::conversation) {
      s = kProtected;
    } else if (f.priority == Priority::one_off) {
      s = kOneOff;
    }
    if (f.run > 0) {
      const Seg lifted = std::min(last_, kProtected);
      if (lifted > s) {
        s = lifted;
        ++events["lifted by run"];
      }
    }
    last_ = s;
    seg_[s].push_back(p);
    ++events[std::string("placed in ") + kNames[s]];
    if (seg_[kSystem].size() > system_cap_) {
      seg_[kProtected].push_back(pop_front(seg_[kSystem]));
      ++events["system cap"];
    }
    if (seg_[kProtected].size() > protected_cap_) {
      seg_[kProbation].push_back(pop_front(seg_[kProtected]));
      ++events["protected cap"];
    }
  }
  void on_reuse(PageId p) override { erase_page(seg_[segment_of(p)], p); }
  PageId victim() override {
    for (auto& q : seg_) {
      if (!q.empty()) {
        const PageId p = pop_front(q);
        ghost_.insert(key_[p]);
        return p;
      }
    }
    return kNoPage;
  }
  std::vector<PageId> order() const override {
    std::vector<PageId> out;
    for (const auto& q : seg_)
      out.insert(out.end(), q.begin(), q.end());
    return out;
  }
  int segment_of(PageId p) const {
    for (int s = 0; s < 4; ++s) {
      if (std::find(seg_[s].begin(), seg_[s].end(), p) != seg_[s].end()) return s;
    }
    return -1;
  }

 private:
  GhostSet ghost_;
  size_t protected_cap_;
  size_t system_cap_;
  std::vector<uint64_t> key_;
  std::vector<bool> came_back_;
  Seg last_ = kProbation;
  std::vector<PageId> seg_[4];
};

std::unique_ptr<RefPolicy> make_ref_policy(std::string_view name, uint32_t pages) {
  if (name == "lru") return std::make_unique<RefLru>();
  if (name == "s3fifo") return std::make_unique<RefS3Fifo>(pages);
  if (name == "prefix") return std::make_unique<RefPrefix>(pages);
  return nullptr;
}

// The model ----------------------------------------------------------------------------------

struct Model {
  struct Page {
    uint32_t ref = 0;
    bool hashed = false;
    Namespace ns = 0;
    uint32_t hash = 0;  // hash id
    // Since alloc (reset when the page becomes FREE):
    uint8_t hits = 0;
    Priority priority = Priority::none;
    bool first = false;  // published, not yet passed to the policy
    uint64_t pin_until = 0;
    uint32_t pin_account = 0;
  };
  struct Owner {
    std::vector<uint32_t> count = std::vector<uint32_t>(kPages, 0);
    // When the owner took the page while holding none of it: close_owner releases newest first.
    std::vector<uint64_t> stamp = std::vector<uint64_t>(kPages, 0);
  };

  std::vector<Page> pages = std::vector<Page>(kPages);
  std::map<std::pair<Namespace, uint32_t>, PageId> index;
  std::vector<bool> is_free = std::vector<bool>(kPages, true);
  uint32_t n_free = kPages;
  std::map<OwnerId, Owner> owners;  // open owners only
  PoolCounters counters;
  uint64_t next_stamp = 0;
  std::unique_ptr<RefPolicy> policy;
  std::vector<PolicyCall> calls;  // the policy calls the pool should have made since the check
  std::set<std::pair<uint64_t, PageId>> pins;  // (expiry, page)
  std::vector<uint32_t> pinned_by = std::vector<uint32_t>(kAccounts, 0);
  uint32_t run = 0;
  std::map<std::string, uint64_t> events;  // pin paths taken, for the coverage check

  uint32_t held(OwnerId o, PageId p) const {
    const auto it = owners.find(o);
    return it == owners.end() || p >= kPages ? 0 : it->second.count[p];
  }
  PageId find(Namespace ns, uint32_t hash) const {
    const auto it = index.find({ns, hash});
    return it == index.end() ? kNoPage : it->second;
  }
  PageState state(PageId p) const {
    if (pages[p].ref > 0) return PageState::in_use;
    return pages[p].hashed ? PageState::cached : PageState::free;
  }
  uint32_t cached() const {
    uint32_t n = 0;
    for (PageId p = 0; p < kPages; ++p)
      n += state(p) == PageState::cached ? 1u : 0u;
    return n;
  }
  uint32_t pinned_cached() const {
    uint32_t n = 0;
    for (PageId p = 0; p < kPages; ++p)
      n += state(p) == PageState::cached && pages[p].pin_until != 0 ? 1u : 0u;
    return n;
  }
  uint32_t queued() const { return cached() - pinned_cached(); }

  // A page just became CACHED: to the policy, unless a pin holds it out.
  void cache(PageId p) {
    Page& pg = pages[p];
    if (pg.pin_until != 0) return;
    const PageFacts f{contents_key(pg.ns, hash_of(pg.hash)), pg.hits, pg.priority, pg.first, run++};
    pg.first = false;
    calls.push_back(cached_call(p, f));
    policy->on_cached(p, f);
  }
  // One more reference for `o`; `hit` for a lookup hit or a duplicate publish.
  void ref(OwnerId o, PageId p, bool hit) {
    Page& pg = pages[p];
    if (pg.ref == 0) {
      if (is_free[p]) {
        ASSERT_FALSE(hit);
        is_free[p] = false;
        --n_free;
      } else if (pg.pin_until == 0) {
        calls.push_back(reuse_call(p));
        ASSERT_NO_FATAL_FAILURE(policy->on_reuse(p));
      } else {
        ++events["pinned cached page taken"];
      }
    }
    if (hit && pg.hits != UINT8_MAX) ++pg.hits;
    ++pg.ref;
    Owner& ow = owners.at(o);
    if (ow.count[p]++ == 0) ow.stamp[p] = next_stamp++;
  }
  void unref(PageId p, uint32_t n = 1) {
    Page& pg = pages[p];
    pg.ref -= n;
    if (pg.ref != 0) return;
    if (pg.hashed) {
      cache(p);
    } else {
      if (pg.pin_until != 0) unpin(p);
      pg = Page{};
      is_free[p] = true;
      ++n_free;
    }
  }
  void unpin(PageId p) {
    Page& pg = pages[p];
    ASSERT_EQ(pins.erase({pg.pin_until, p}), 1u);
    --pinned_by[pg.pin_account];
    pg.pin_until = 0;
    pg.pin_account = 0;
  }
  // The pool's expire_pins(): every pin due by `now`, earliest first, its CACHED page queued.
  void expire(uint64_t now) {
    if (pins.empty()) return;
    run = 0;
    while (!pins.empty() && pins.begin()->first <= now) {
      const PageId p = pins.begin()->second;
      unpin(p);
      ++counters.pins_expired;
      if (state(p) == PageState::cached) {
        ++events["pin of a cached page expired"];
        cache(p);
      }
    }
  }
  // Pages of `ps` whose charge a pin by `h` at `now` would add to its account: unpinned ones,
  // and those another account pinned for less long (a pin ending no later changes nothing).
  uint64_t new_charges(const CallHints& h, const std::vector<PageId>& ps, uint64_t now) const {
    if (h.hints.pin_ttl_ms == 0) return 0;
    const std::set<PageId> distinct(ps.begin(), ps.end());
    uint64_t n = 0;
    for (const PageId p : distinct) {
      const Page& pg = pages[p];
      if (pg.pin_until == 0 ||
          (pg.pin_account != h.pin_account && now + h.hints.pin_ttl_ms > pg.pin_until)) {
        ++n;
      }
    }
    return n;
  }
  Status pin_check(const CallHints& h, uint64_t adding) const {
    if (h.hints.pin_ttl_ms == 0 || adding == 0) return {};
    const uint64_t after = pinned_by[h.pin_account] + adding;
    if (after > h.pin_limit) return Status(Errc::pin_limit_exceeded, kNoItem, after);
    return {};
  }
  void apply(PageId p, const CallHints& h, uint64_t now) {
    Page& pg = pages[p];
    pg.priority = std::max(pg.priority, h.hints.priority);
    if (h.hints.pin_ttl_ms == 0) return;
    const uint64_t until = now + h.hints.pin_ttl_ms;
    if (until <= pg.pin_until) {
      ++events["pin kept"];
      return;
    }
    if (pg.pin_until != 0) {
      ++events[pg.pin_account == h.pin_account ? "pin extended" : "pin moved"];
      unpin(p);
    }
    pg.pin_until = until;
    pg.pin_account = h.pin_account;
    ++pinned_by[h.pin_account];
    pins.emplace(until, p);
    ++counters.pins;
  }
  PageId victim() {
    const PageId p = policy->victim();
    if (p != kNoPage) calls.push_back(victim_call(p));
    return p;
  }
  // A CACHED page leaves the cache: out of the index, hash and pin cleared, FREE.
  void drop(PageId p) {
    Page& pg = pages[p];
    index.erase({pg.ns, pg.hash});
    if (pg.pin_until != 0) unpin(p);
    pg = Page{};
    is_free[p] = true;
    ++n_free;
  }
};

enum class Op { alloc, retain, release, lookup, publish, evict, flush, expire, reopen, bad_owner };

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
    case Op::expire:
      return "expire_pins";
    case Op::reopen:
      return "close_owner+open_owner";
    case Op::bad_owner:
      return "op with a bad owner";
  }
  return "?";
}

class Harness {
 public:
  Harness(std::string_view policy, uint64_t seed) : rng_(seed) {
    PoolOptions opts;
    opts.num_pages = kPages;
    opts.index_seed = seed;
    opts.clock_ms = [this] { return now_; };
    auto rec = std::make_unique<RecordingPolicy>(make_policy(policy));
    rec_ = rec.get();
    opts.policy = std::move(rec);
    pool_ = std::make_unique<PagePool>(std::move(opts));
    m_.policy = make_ref_policy(policy, kPages);
    EXPECT_NE(m_.policy, nullptr) << "no reference model for policy " << policy;
    for (uint32_t i = 0; i < kOwners; ++i) {
      const OwnerId o = pool_->open_owner();
      EXPECT_EQ(m_.owners.count(o), 0u) << "open_owner returned an open id " << o;
      m_.owners[o];
      slots_.push_back(o);
    }
  }

  // Runs `ops` random operations; stops at the first failure.
  void run(uint32_t ops) {
    for (uint32_t i = 0; i < ops; ++i) {
      if (chance(50)) now_ += below(4);
      const Op op = pick_op();
      const OwnerId actor = slots_[below(kOwners)];
      step(op, actor);
      if (!::testing::Test::HasFailure()) check(actor, i % 4 == 0, i % 4 == 0);
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "at op #" << i << ": " << op_name(op) << ", clock " << now_;
        return;
      }
    }
    check(kNoPage, true, true);
  }

  PoolStats stats() const { return pool_->stats(); }
  uint64_t outcome(Errc code) const {
    const auto it = outcomes_.find(code);
    return it == outcomes_.end() ? 0 : it->second;
  }
  std::map<std::string, uint64_t> events() const {
    std::map<std::string, uint64_t> all = m_.events;
    all.insert(m_.policy->events.begin(), m_.policy->events.end());
    return all;
  }
  const std::map<Errc, uint64_t>& outcomes() const { return outcomes_; }
  uint64_t event(const std::string& name) const {
    const std::map<std::string, uint64_t> all = events();
    const auto it = all.find(name);
    return it == all.end() ? 0 : it->second;
  }

 private:
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
    if (r < 965) return Op::flush;
    if (r < 970) return Op::expire;
    if (r < 988) return Op::reopen;
    return Op::bad_owner;
  }

  // Random hints: mostly no class (a class sticks to a page until it is freed: the highest
  // wins), sometimes a short pin charged to one of a few accounts, mostly under that account's
  // small limit.
  CallHints random_hints() {
    CallHints h;
    const uint32_t r = below(100);
    h.hints.priority = r < 70   ? Priority::none
                       : r < 85 ? Priority::one_off
                       : r < 95 ? Priority::conversation
                                : Priority::system;
    if (chance(20)) h.hints.pin_ttl_ms = 1 + below(30);
    h.pin_account = below(kAccounts);
    h.pin_limit = chance(10) ? PagePool::kUnlimited : kPinLimit[h.pin_account];
    return h;
  }

  void step(Op op, OwnerId o) {
    m_.run = 0;
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
      case Op::expire:
        pool_->expire_pins();
        m_.expire(now_);
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
  // counters, the policy calls, every page's refcount, state, pin and class, pins per account,
  // the eviction queue, and the holdings of `actor`; `all_owners` adds every owner's holdings,
  // `invariants` check_invariants().
  void check(OwnerId actor, bool all_owners, bool invariants) {
    const std::vector<PolicyCall> calls = rec_->take();
    ASSERT_EQ(calls, m_.calls) << "policy calls";
    m_.calls.clear();

    const PoolStats s = pool_->stats();
    ASSERT_EQ(s.total, kPages);
    ASSERT_EQ(s.free, m_.n_free);
    ASSERT_EQ(s.cached, m_.cached());
    ASSERT_EQ(s.in_use, kPages - m_.n_free - m_.cached());
    ASSERT_EQ(s.owners, m_.owners.size());
    ASSERT_EQ(s.pinned, m_.pins.size());
    ASSERT_EQ(s.pinned_cached, m_.pinned_cached());
    ASSERT_EQ(flat(s.counters), flat(m_.counters));
    for (uint32_t a = 0; a < kAccounts; ++a)
      ASSERT_EQ(pool_->pinned_by(a), m_.pinned_by[a]) << "account " << a;

    std::vector<uint64_t> got(kPages);
    std::vector<uint64_t> want(kPages);
    const auto compare = [&](const char* what, auto&& pool_value, auto&& model_value) {
      for (PageId p = 0; p < kPages; ++p) {
        got[p] = pool_value(p);
        want[p] = model_value(p);
      }
      ASSERT_EQ(got, want) << what;
    };
    ASSERT_NO_FATAL_FAILURE(compare(
        "refcounts", [&](PageId p) { return pool_->refcount(p); },
        [&](PageId p) { return m_.pages[p].ref; }));
    ASSERT_NO_FATAL_FAILURE(compare(
        "page states (0 free, 1 in use, 2 cached)",
        [&](PageId p) { return static_cast<uint64_t>(pool_->state(p)); },
        [&](PageId p) { return static_cast<uint64_t>(m_.state(p)); }));
    ASSERT_NO_FATAL_FAILURE(compare(
        "pin expiries", [&](PageId p) { return pool_->pinned_until(p); },
        [&](PageId p) { return m_.pages[p].pin_until; }));
    ASSERT_NO_FATAL_FAILURE(compare(
        "priority classes", [&](PageId p) { return static_cast<uint64_t>(pool_->priority(p)); },
        [&](PageId p) { return static_cast<uint64_t>(m_.pages[p].priority); }));

    std::vector<PageId> queue;
    queue.reserve(kPages);
    pool_->policy().for_each_queued([&](PageId p) { queue.push_back(p); });
    ASSERT_EQ(queue, m_.policy->order()) << "eviction queue";
    if (const auto* prefix = dynamic_cast<const PrefixPolicy*>(&rec_->inner())) {
      const auto& ref = static_cast<const RefPrefix&>(*m_.policy);
      for (const PageId p : queue)
        ASSERT_EQ(static_cast<int>(prefix->segment_of(p)), ref.segment_of(p)) << "page " << p;
    }

    for (const OwnerId o : slots_) {
      if (!all_owners && o != actor) continue;
      const auto it = m_.owners.find(o);  // absent for an owner just closed: holds nothing
      for (PageId p = 0; p < kPages; ++p) {
        got[p] = pool_->held(o, p);
        want[p] = it == m_.owners.end() ? 0 : it->second.count[p];
      }
      ASSERT_EQ(got, want) << "holdings of owner " << o;
    }
    if (invariants) {
      for (PageId p = 0; p < kPages; ++p) {
        ASSERT_EQ(m_.is_free[p], m_.state(p) == PageState::free) << "model, page " << p;
      }
      ASSERT_EQ(pool_->check_invariants(), "");
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
    const CallHints hints = random_hints();
    const uint32_t avail = m_.n_free + m_.queued();  // before expiry: a guess for sizing
    size_t n = below(5);
    if (chance(3)) {
      n = kPages + 1 + below(8);
    } else if (chance(5)) {
      n = avail + 1 + below(3);
    }
    Status want;
    if (n > kPages) {
      want = Status(Errc::exceeds_capacity, kNoItem, n);
    } else {
      m_.expire(now_);
      if (n > m_.n_free + m_.queued()) {
        want = Status(Errc::out_of_pages, kNoItem, n);
      } else {
        want = m_.pin_check(hints, n);
      }
    }
    std::vector<PageId> out(n, kNoPage);
    if (!expect_call(want, [&] { return pool_->alloc(o, out, hints); })) return;

    // FREE pages first (in no documented order), then victims in the policy's order.
    const size_t from_free = std::min<size_t>(n, m_.n_free);
    for (size_t i = 0; i < n; ++i) {
      const PageId p = out[i];
      if (i < from_free) {
        ASSERT_TRUE(p < kPages && m_.is_free[p]) << "item " << i << ": page " << p << " not free";
      } else {
        ASSERT_EQ(p, m_.victim()) << "item " << i << ": not the policy's victim";
        m_.drop(p);
        ++m_.counters.evicted;
      }
      ASSERT_NO_FATAL_FAILURE(m_.ref(o, p, false));
      if (!hints.hints.empty()) m_.apply(p, hints, now_);
    }
    m_.counters.allocated += n;
  }

  void do_retain(OwnerId o) {
    const CallHints hints = random_hints();
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
    if (want.ok() && !hints.hints.empty()) {
      m_.expire(now_);
      want = m_.pin_check(hints, m_.new_charges(hints, pages, now_));
    }
    if (!expect_call(want, [&] { return pool_->retain(o, pages, hints); })) return;
    for (const PageId p : pages) {
      ++m_.owners.at(o).count[p];
      ++m_.pages[p].ref;
      if (!hints.hints.empty()) m_.apply(p, hints, now_);
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
    if (!expect_call(want, [&] { return pool_->release(o, pages); })) return;
    // Pages change state in the order given, as one run.
    for (const PageId p : pages) {
      --m_.owners.at(o).count[p];
      m_.unref(p);
    }
    m_.counters.released += pages.size();
  }

  void do_lookup(OwnerId o) {
    const CallHints hints = random_hints();
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
    if (want.ok() && hints.hints.pin_ttl_ms != 0) m_.expire(now_);
    std::vector<PageId> want_pages;
    for (const uint32_t id : ids) {
      const PageId p = m_.find(ns, id);
      if (p == kNoPage) break;
      want_pages.push_back(p);
    }
    if (want.ok() && hints.hints.pin_ttl_ms != 0) {
      // Charged for the pages found that the account does not pin already.
      want = m_.pin_check(hints, m_.new_charges(hints, want_pages, now_));
    }
    std::vector<PageId> out(out_size, kNoPage);
    uint32_t hits = 999;
    const bool done = expect_call(
        want, [&] { return pool_->lookup(o, ns, chain, out, hits, PagePool::kUnlimited, hints); });
    if (!done) {
      EXPECT_EQ(hits, 0u);
      return;
    }
    ASSERT_EQ(hits, want_pages.size());
    out.resize(hits);
    ASSERT_EQ(out, want_pages);
    for (const PageId p : want_pages) {
      ASSERT_NO_FATAL_FAILURE(m_.ref(o, p, true));
    }
    if (!hints.hints.empty()) {
      for (const PageId p : want_pages)
        m_.apply(p, hints, now_);
    }
    ++m_.counters.lookups;
    m_.counters.lookup_blocks += chain.size();
    m_.counters.hit_blocks += hits;
  }

  void do_publish(OwnerId o) {
    const CallHints hints = random_hints();
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
    // Sometimes contents nobody asks for again: hashes outside the chains, never looked up.
    const bool unique = chance(12);
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
      uint32_t id = unique ? next_unique_++ : hash_id(seq, start + i);
      if (p < kPages && m_.pages[p].hashed && m_.pages[p].ns == ns && chance(50)) {
        id = m_.pages[p].hash;  // republish what it carries: a no-op
      }
      model_items.emplace_back(p, id);
    }
    if (k >= 2 && chance(5)) {
      model_items[1].second = model_items[0].second;  // the same hash twice in one batch
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
    if (want.ok() && hints.hints.pin_ttl_ms != 0) {
      // The pins go to the pages the caller ends up with: its own page, the page already
      // carrying the hash, or the page an earlier item of this batch stored it on.
      m_.expire(now_);
      std::map<uint32_t, PageId> stored;
      std::vector<PageId> ends_with;
      for (const auto& [p, id] : model_items) {
        PageId q = p;
        if (!m_.pages[p].hashed) {
          if (const PageId existing = m_.find(ns, id); existing != kNoPage) {
            q = existing;
          } else {
            q = stored.try_emplace(id, p).first->second;
          }
        }
        ends_with.push_back(q);
      }
      want = m_.pin_check(hints, m_.new_charges(hints, ends_with, now_));
    }
    std::vector<PublishResult> out(out_size);
    if (!expect_call(
            want, [&] { return pool_->publish(o, ns, items, out, PagePool::kUnlimited, hints); })) {
      return;
    }

    for (size_t i = 0; i < model_items.size(); ++i) {
      const auto& [p, id] = model_items[i];
      Model::Page& pg = m_.pages[p];
      PublishResult expect{PublishResult::Kind::stored, p};
      if (!pg.hashed) {
        const PageId existing = m_.find(ns, id);
        if (existing != kNoPage) {
          ASSERT_NO_FATAL_FAILURE(m_.ref(o, existing, true));
          expect = {PublishResult::Kind::duplicate, existing};
          ++m_.counters.duplicates;
        } else {
          m_.index[{ns, id}] = p;
          pg.hashed = true;
          pg.ns = ns;
          pg.hash = id;
          pg.first = true;
          ++m_.counters.published;
        }
      }
      ASSERT_EQ(out[i].kind, expect.kind) << "item " << i;
      ASSERT_EQ(out[i].page, expect.page) << "item " << i;
    }
    if (!hints.hints.empty()) {
      for (size_t i = 0; i < model_items.size(); ++i)
        m_.apply(out[i].page, hints, now_);
    }
  }

  void do_evict() {
    const uint32_t n = below(4);
    m_.expire(now_);
    const uint32_t want = std::min(n, m_.queued());
    ASSERT_EQ(pool_->evict(n), want);
    for (uint32_t i = 0; i < want; ++i)
      m_.drop(m_.victim());
    m_.counters.evicted += want;
  }

  void do_flush() {
    m_.expire(now_);
    const uint32_t want = m_.cached();
    ASSERT_EQ(pool_->flush(), want);
    // The policy's pages in its order, then the pinned ones, earliest expiry first.
    for (PageId p = m_.victim(); p != kNoPage; p = m_.victim())
      m_.drop(p);
    std::vector<PageId> pinned;
    for (const auto& [until, p] : m_.pins) {
      if (m_.state(p) == PageState::cached) pinned.push_back(p);
    }
    for (const PageId p : pinned)
      m_.drop(p);
    m_.events["pinned page flushed"] += pinned.size();
    ASSERT_EQ(m_.cached(), 0u);
    m_.counters.flushed += want;
  }

  void do_reopen(OwnerId o) {
    ASSERT_TRUE(expect_call(Status{}, [&] { return pool_->close_owner(o); }));
    // Every reference goes back, the most recently taken page first, as one run.
    const Model::Owner& ow = m_.owners.at(o);
    std::vector<std::pair<uint64_t, PageId>> by_stamp;
    for (PageId p = 0; p < kPages; ++p) {
      if (ow.count[p] > 0) by_stamp.emplace_back(ow.stamp[p], p);
    }
    std::sort(by_stamp.rbegin(), by_stamp.rend());
    for (const auto& [stamp, p] : by_stamp) {
      m_.unref(p, ow.count[p]);
      m_.counters.released += ow.count[p];
    }
    m_.owners.erase(o);

    // Closed, the id is refused (until open_owner hands it out again), and holds nothing.
    ASSERT_NO_FATAL_FAILURE(do_bad_owner(o));
    ASSERT_NO_FATAL_FAILURE(check(o, true, true));

    const OwnerId fresh = pool_->open_owner();
    ASSERT_EQ(m_.owners.count(fresh), 0u) << "open_owner returned an open id " << fresh;
    m_.owners[fresh];
    *std::find(slots_.begin(), slots_.end(), o) = fresh;
  }

  // Any operation with an owner that is not open fails with invalid_owner and changes nothing,
  // pins included: nothing expires before the owner is checked.
  void do_bad_owner(OwnerId bad) {
    const Status want(Errc::invalid_owner, kNoItem, bad);
    const PageId p = below(kPages);
    const std::vector<PageId> pages = {p};
    const CallHints hints = random_hints();
    switch (below(6)) {
      case 0: {
        std::vector<PageId> out(below(3), kNoPage);
        expect_call(want, [&] { return pool_->alloc(bad, out, hints); });
        break;
      }
      case 1:
        expect_call(want, [&] { return pool_->retain(bad, pages, hints); });
        break;
      case 2:
        expect_call(want, [&] { return pool_->release(bad, pages); });
        break;
      case 3: {
        const std::vector<BlockHash> chain = {hash_of(hash_id(0, 0))};
        std::vector<PageId> out(1, kNoPage);
        uint32_t hits = 7;
        expect_call(want, [&] {
          return pool_->lookup(bad, 1, chain, out, hits, PagePool::kUnlimited, hints);
        });
        EXPECT_EQ(hits, 0u);
        break;
      }
      case 4: {
        const std::vector<PublishItem> items = {{p, hash_of(0)}};
        std::vector<PublishResult> out(1);
        expect_call(
            want, [&] { return pool_->publish(bad, 1, items, out, PagePool::kUnlimited, hints); });
        break;
      }
      default:
        expect_call(want, [&] { return pool_->close_owner(bad); });
        break;
    }
  }

  std::mt19937_64 rng_;
  uint64_t now_ = 0;  // the pool's clock, ms
  RecordingPolicy* rec_ = nullptr;
  std::unique_ptr<PagePool> pool_;
  Model m_;
  std::vector<OwnerId> slots_;  // the open owners the test drives
  std::map<Errc, uint64_t> outcomes_;
  uint32_t next_unique_ = 1u << 20;  // hash ids past every chain's
};

using Param = std::tuple<std::string, uint64_t>;  // (policy, seed)

class PagePoolRandom : public ::testing::TestWithParam<Param> {};

TEST_P(PagePoolRandom, AgreesWithReferenceModel) {
  const auto& [policy, seed] = GetParam();
  Harness h(policy, seed);
  if (HasFailure()) return;
  h.run(kOpsPerSeed);
  if (HasFailure()) return;

  const PoolCounters c = h.stats().counters;
  // KVPOOL_RANDOM_VERBOSE=1 prints what the sequence exercised, to tune the thresholds below.
  if (std::getenv("KVPOOL_RANDOM_VERBOSE") != nullptr) {
    std::string line = "counters:";
    for (const uint64_t v : flat(c))
      line += " " + std::to_string(v);
    for (const auto& [name, n] : h.events())
      line += ", " + name + " " + std::to_string(n);
    for (const auto& [code, n] : h.outcomes())
      line += ", " + std::string(errc_name(code)) + " " + std::to_string(n);
    std::printf("%s\n", line.c_str());
  }

  // The sequence exercised what it is meant to: each of these paths ran many times.
  EXPECT_GT(c.hit_blocks, 700u);
  EXPECT_GT(c.duplicates, 150u);
  EXPECT_GT(c.evicted, 100u);
  EXPECT_GT(c.flushed, 25u);
  EXPECT_GT(c.published, 250u);
  EXPECT_GT(c.pins, 300u);
  EXPECT_GT(c.pins_expired, 200u);
  for (const Errc code :
       {Errc::ok, Errc::invalid_argument, Errc::invalid_page, Errc::invalid_owner, Errc::not_held,
        Errc::out_of_pages, Errc::exceeds_capacity, Errc::already_published, Errc::duplicate_item,
        Errc::pin_limit_exceeded}) {
    EXPECT_GT(h.outcome(code), 10u) << errc_name(code);
  }
  // And each path of pins, and each decision of the policy under test.
  std::vector<std::string> decisions = {"pinned cached page taken",
                                        "pin of a cached page expired",
                                        "pin kept",
                                        "pin extended",
                                        "pin moved",
                                        "pinned page flushed"};
  if (policy == "s3fifo") {
    decisions.insert(decisions.end(),
                     {"new to small", "ghost comeback to main", "evicted from small",
                      "small to main", "evicted from main", "main reinsert"});
  } else if (policy == "prefix") {
    decisions.insert(decisions.end(),
                     {"placed in one-off", "placed in probation", "placed in protected",
                      "placed in system", "ghost comeback", "lifted by run"});
  }
  for (const std::string& d : decisions)
    EXPECT_GT(h.event(d), 5u) << d;
}

std::vector<std::string> all_policies() {
  std::vector<std::string> out;
  for (const std::string_view name : policy_names())
    out.emplace_back(name);
  return out;
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndSeeds, PagePoolRandom,
                         ::testing::Combine(::testing::ValuesIn(all_policies()),
                                            ::testing::Values(1, 2, 3, 0xC0FFEE)),
                         [](const ::testing::TestParamInfo<Param>& param_info) {
                           return std::get<0>(param_info.param) + "_" +
                                  std::to_string(std::get<1>(param_info.param));
                         });

}  // namespace
}  // namespace kvpool::core

// Micro-benchmarks of the pool core: ns per page for each operation, in-process, no I/O.
// Timed sections use manual timing where set-up and tear-down must stay out of the figure; every
// benchmark reports "per_page" (or "per_hash"): time of the timed section / pages it touched.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/core/page_pool.h"

namespace {

using kvpool::BlockHash;
using kvpool::core::OwnerId;
using kvpool::core::PageId;
using kvpool::core::PagePool;
using kvpool::core::PoolOptions;
using kvpool::core::PublishItem;
using kvpool::core::PublishResult;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kPoolPages = 1u << 16;
constexpr kvpool::core::Namespace kNs = 7;

BlockHash hash_of(uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + 1;
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  return BlockHash{z ^ (z >> 29), i};
}

void per_item(benchmark::State& state, const char* name, double items_per_iteration) {
  state.counters[name] =
      benchmark::Counter(items_per_iteration, benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kInvert);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void check(const kvpool::Status& s, benchmark::State& state) {
  if (!s.ok()) state.SkipWithError(s.message().c_str());
}

// Pairs pages with hashes never used before, for publish.
class FreshHashes {
 public:
  std::span<const PublishItem> items_for(std::span<const PageId> pages) {
    items_.resize(pages.size());
    results_.resize(pages.size());
    for (size_t i = 0; i < pages.size(); ++i)
      items_[i] = {pages[i], hash_of(next_++)};
    return items_;
  }
  std::span<PublishResult> results() { return results_; }

 private:
  std::vector<PublishItem> items_;
  std::vector<PublishResult> results_;
  uint64_t next_ = 0;
};

// Publishes fresh hashes on held pages and releases them: they end CACHED.
void cache(PagePool& pool, OwnerId o, std::span<const PageId> pages, FreshHashes& fresh,
           benchmark::State& state) {
  const auto items = fresh.items_for(pages);  // sizes results() too: call it first
  check(pool.publish(o, kNs, items, fresh.results()), state);
  check(pool.release(o, pages), state);
}

// alloc(n) then release(n) of unpublished pages: FREE → IN_USE → FREE.
void BM_AllocRelease(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  for (auto _ : state) {
    check(pool.alloc(o, pages), state);
    check(pool.release(o, pages), state);
  }
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_AllocRelease)->Arg(1)->Arg(16)->Arg(256);

// alloc and release timed separately (batches only: the clock would dominate single pages).
void BM_Alloc(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    check(pool.alloc(o, pages), state);
    state.SetIterationTime(seconds_since(t0));
    check(pool.release(o, pages), state);
  }
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_Alloc)->Arg(256)->Arg(4096)->UseManualTime();

void BM_Release(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  for (auto _ : state) {
    check(pool.alloc(o, pages), state);
    const auto t0 = Clock::now();
    check(pool.release(o, pages), state);
    state.SetIterationTime(seconds_since(t0));
  }
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_Release)->Arg(256)->Arg(4096)->UseManualTime();

// lookup of fully cached chains of length L (the hit path: index probe, CACHED → IN_USE, ledger
// insert). Each timed section looks up enough chains for ~4096 hashes; releases are not timed.
void BM_Lookup(benchmark::State& state) {
  const auto len = static_cast<size_t>(state.range(0));
  const size_t chains = std::max<size_t>(1, 4096 / len);
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<std::vector<BlockHash>> hashes(chains);
  std::vector<PageId> pages(len);
  FreshHashes fresh;
  for (size_t c = 0; c < chains; ++c) {
    check(pool.alloc(o, pages), state);
    const auto items = fresh.items_for(pages);
    for (const PublishItem& item : items)
      hashes[c].push_back(item.hash);
    check(pool.publish(o, kNs, items, fresh.results()), state);
    check(pool.release(o, pages), state);
  }
  std::vector<std::vector<PageId>> found(chains, std::vector<PageId>(len));
  for (auto _ : state) {
    const auto t0 = Clock::now();
    for (size_t c = 0; c < chains; ++c) {
      uint32_t hits = 0;
      check(pool.lookup(o, kNs, hashes[c], found[c], hits), state);
      if (hits != len) state.SkipWithError("lookup missed a cached page");
    }
    state.SetIterationTime(seconds_since(t0));
    for (size_t c = 0; c < chains; ++c)
      check(pool.release(o, found[c]), state);
  }
  per_item(state, "per_hash", double(chains * len));
}
BENCHMARK(BM_Lookup)->Arg(1)->Arg(16)->Arg(1000)->UseManualTime();

// lookup that misses at the first hash: the cost of asking for an uncached prefix.
void BM_LookupMiss(benchmark::State& state) {
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<BlockHash> chain(16);
  for (size_t i = 0; i < chain.size(); ++i)
    chain[i] = hash_of(1'000'000 + i);
  std::vector<PageId> found(chain.size());
  for (auto _ : state) {
    uint32_t hits = 0;
    check(pool.lookup(o, kNs, chain, found, hits), state);
    benchmark::DoNotOptimize(hits);
  }
  per_item(state, "per_call", 1);
}
BENCHMARK(BM_LookupMiss);

// publish of n fresh hashes on held pages (index insert); un-publishing (flush) is not timed.
void BM_Publish(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  FreshHashes fresh;
  for (auto _ : state) {
    check(pool.alloc(o, pages), state);
    const auto items = fresh.items_for(pages);
    const auto t0 = Clock::now();
    check(pool.publish(o, kNs, items, fresh.results()), state);
    state.SetIterationTime(seconds_since(t0));
    check(pool.release(o, pages), state);
    pool.flush();
  }
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_Publish)->Arg(16)->Arg(256)->UseManualTime();

// alloc(n) when no page is FREE: every page comes from the policy's victim (index erase,
// LRU unlink). The pool is refilled with cached pages between timed sections.
void BM_AllocEvicting(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  PagePool pool(PoolOptions{kPoolPages, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  FreshHashes fresh;
  for (uint32_t k = 0; k < kPoolPages / n; ++k) {  // every page CACHED
    check(pool.alloc(o, pages), state);
    cache(pool, o, pages, fresh, state);
  }
  for (auto _ : state) {
    const auto t0 = Clock::now();
    check(pool.alloc(o, pages), state);
    state.SetIterationTime(seconds_since(t0));
    cache(pool, o, pages, fresh, state);
  }
  state.counters["evicted"] = double(pool.stats().counters.evicted);
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_AllocEvicting)->Arg(16)->Arg(256)->UseManualTime();

// flush of a pool whose pages are all CACHED.
void BM_Flush(benchmark::State& state) {
  const auto n = static_cast<uint32_t>(state.range(0));
  PagePool pool(PoolOptions{n, nullptr, 1});
  const OwnerId o = pool.open_owner();
  std::vector<PageId> pages(n);
  FreshHashes fresh;
  for (auto _ : state) {
    check(pool.alloc(o, pages), state);
    cache(pool, o, pages, fresh, state);
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(pool.flush());
    state.SetIterationTime(seconds_since(t0));
  }
  per_item(state, "per_page", double(n));
}
BENCHMARK(BM_Flush)->Arg(4096)->Arg(65536)->UseManualTime();

// close_owner of an owner holding 256 pages with `refs` references each (retained in batches
// of 2^16): the release is per page, so the time per page should not depend on `refs`
// (refs = 1 is the baseline). It was per reference: 2^31 references took ~1-2 s.
void BM_CloseOwner(benchmark::State& state) {
  constexpr uint32_t kHeld = 256;
  const auto refs = static_cast<uint32_t>(state.range(0));
  PagePool pool(PoolOptions{kHeld, nullptr, 1});
  std::vector<PageId> pages(kHeld);
  for (auto _ : state) {
    const OwnerId o = pool.open_owner();
    check(pool.alloc(o, pages), state);
    for (const PageId p : pages) {
      for (uint32_t done = 1; done < refs;) {
        const uint32_t n = std::min<uint32_t>(refs - done, 1u << 16);
        check(pool.retain(o, std::vector<PageId>(n, p)), state);
        done += n;
      }
    }
    const auto t0 = Clock::now();
    check(pool.close_owner(o), state);
    state.SetIterationTime(seconds_since(t0));
  }
  per_item(state, "per_page", double(kHeld));
  state.counters["refs_per_page"] = double(refs);
}
BENCHMARK(BM_CloseOwner)->Arg(1)->Arg(4096)->Arg(1 << 16)->UseManualTime()->Iterations(20);

// The eviction policies' cost per page operation, on the same operations for every policy (Arg =
// index into policy_names(); LRU's figure is the baseline). A full pool of 2^16 CACHED pages in
// 16-page chains, requests of 16-page chains:
//   PolicyEvict  a new chain: lookup (misses at once), alloc 16 (each evicts a victim: policy
//                victim() + ghost), publish 16, release 16 tail first (policy on_cached);
//   PolicyHit    a cached chain again (round robin, so every one is still cached): lookup 16
//                hits (policy on_reuse), release 16 tail first (on_cached).
// per_page_op = time / pages handled by alloc + publish + release (Evict) or lookup + release
// (Hit): the mechanism's cost plus the policy's.
// A full pool under the policy the benchmark's Arg names (labelled with it).
std::unique_ptr<PagePool> full_pool(OwnerId& o, benchmark::State& state) {
  const std::string_view policy = kvpool::core::policy_names()[static_cast<size_t>(state.range(0))];
  state.SetLabel(std::string(policy));
  auto owned =
      std::make_unique<PagePool>(PoolOptions{kPoolPages, kvpool::core::make_policy(policy), 1,
                                             /*expensive_checks=*/false});
  PagePool& pool = *owned;
  o = pool.open_owner();
  std::vector<PageId> pages(16);
  FreshHashes fresh;
  for (uint32_t k = 0; k < kPoolPages / 16; ++k) {
    check(pool.alloc(o, pages), state);
    const auto items = fresh.items_for(pages);
    check(pool.publish(o, kNs, items, fresh.results()), state);
    std::reverse(pages.begin(), pages.end());
    check(pool.release(o, pages), state);
  }
  return owned;
}

void BM_PolicyEvict(benchmark::State& state) {
  OwnerId o = 0;
  const std::unique_ptr<PagePool> owned = full_pool(o, state);
  PagePool& pool = *owned;
  std::vector<PageId> pages(16);
  std::vector<BlockHash> chain(16);
  std::vector<PublishItem> items(16);
  std::vector<PublishResult> results(16);
  uint64_t next = uint64_t{1} << 40;
  for (auto _ : state) {
    for (size_t i = 0; i < chain.size(); ++i)
      chain[i] = hash_of(next++);
    uint32_t hits = 0;
    check(pool.lookup(o, kNs, chain, pages, hits), state);
    check(pool.alloc(o, pages), state);
    for (size_t i = 0; i < pages.size(); ++i)
      items[i] = {pages[i], chain[i]};
    check(pool.publish(o, kNs, items, results), state);
    std::reverse(pages.begin(), pages.end());
    check(pool.release(o, pages), state);
  }
  per_item(state, "per_page_op", 3.0 * 16);
}
BENCHMARK(BM_PolicyEvict)->DenseRange(0, 2);

void BM_PolicyHit(benchmark::State& state) {
  OwnerId o = 0;
  const std::unique_ptr<PagePool> owned = full_pool(o, state);
  PagePool& pool = *owned;
  std::vector<PageId> pages(16);
  std::vector<BlockHash> chain(16);
  uint64_t next_chain = 0;
  for (auto _ : state) {
    const uint64_t c = next_chain++ % (kPoolPages / 16);
    for (size_t i = 0; i < chain.size(); ++i)
      chain[i] = hash_of(c * 16 + i);
    uint32_t hits = 0;
    check(pool.lookup(o, kNs, chain, pages, hits), state);
    if (hits != 16) state.SkipWithError("a cached chain was not found");
    std::reverse(pages.begin(), pages.end());
    check(pool.release(o, pages), state);
  }
  per_item(state, "per_page_op", 2.0 * 16);
}
BENCHMARK(BM_PolicyHit)->DenseRange(0, 2);

}  // namespace

BENCHMARK_MAIN();

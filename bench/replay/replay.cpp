#include "bench/replay/replay.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <unordered_map>

#include "bench/replay/belady_policy.h"
#include "daemon/core/page_pool.h"
#include "daemon/core/tier_mover.h"

namespace kvpool::bench {

namespace {

using core::PageId;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// next_use[r][i]: index of the next request after r that references block i of request r.
std::vector<std::vector<uint32_t>> next_uses(const Trace& trace) {
  constexpr uint32_t kNever = std::numeric_limits<uint32_t>::max();
  std::vector<std::vector<uint32_t>> out(trace.requests.size());
  std::unordered_map<uint64_t, uint32_t> next_seen;
  for (size_t r = trace.requests.size(); r-- > 0;) {
    const auto& ids = trace.requests[r].hash_ids;
    out[r].resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const auto it = next_seen.find(ids[i]);
      out[r][i] = it == next_seen.end() ? kNever : it->second;
    }
    for (const uint64_t id : ids)
      next_seen[id] = static_cast<uint32_t>(r);
  }
  return out;
}

// A lookup whose pin the account cannot afford is repeated without the pin, as a worker would.
Status lookup_hinted(core::PagePool& pool, core::OwnerId owner, core::Namespace ns,
                     std::span<const BlockHash> chain, std::span<PageId> out, uint32_t& hits,
                     core::CallHints hints) {
  const Status s = pool.lookup(owner, ns, chain, out, hits, core::PagePool::kUnlimited, hints);
  if (s.code() != Errc::pin_limit_exceeded) return s;
  hints.hints.pin_ttl_ms = 0;
  return pool.lookup(owner, ns, chain, out, hits, core::PagePool::kUnlimited, hints);
}

void expect_ok(const Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string("replay: ") + what + ": " + s.message());
}

}  // namespace

BlockHash trace_page_hash(uint64_t block_id, uint32_t j) {
  return BlockHash{mix64(block_id * 0x9E3779B97F4A7C15ull + j), (block_id << 16) | j};
}

ReplayResult replay(const Trace& trace, const ReplayOptions& options) {
  if (options.capacity_blocks == 0) throw std::invalid_argument("capacity must be at least 1");
  if (options.page_tokens == 0 || kTraceBlockTokens % options.page_tokens != 0) {
    throw std::invalid_argument("page tokens must divide 512");
  }
  const uint32_t per_block = kTraceBlockTokens / options.page_tokens;
  const uint64_t capacity_pages = uint64_t{options.capacity_blocks} * per_block;
  if (capacity_pages > core::kMaxPages) throw std::invalid_argument("capacity too large");

  // "NAME+hints" replays with the trace's hints, NAME alone without.
  std::string base = options.policy;
  bool use_hints = false;
  if (const size_t plus = base.find('+'); plus != std::string::npos) {
    if (base.substr(plus) != "+hints") {
      throw std::invalid_argument("unknown policy suffix in \"" + options.policy + "\"");
    }
    base.resize(plus);
    use_hints = true;
  }

  OfflinePolicy* offline = nullptr;
  std::vector<std::vector<uint32_t>> next_use;
  std::unique_ptr<core::EvictionPolicy> policy;
  if (base == "belady" || base == "reuse-oracle") {
    std::unique_ptr<OfflinePolicy> p;
    if (base == "belady") {
      p = std::make_unique<BeladyPolicy>();
    } else {
      p = std::make_unique<ReuseOraclePolicy>();
    }
    offline = p.get();
    policy = std::move(p);
    next_use = next_uses(trace);
  } else {
    policy = core::make_policy(base);
    if (!policy) throw std::invalid_argument("unknown policy \"" + options.policy + "\"");
  }

  ReplayResult res;
  res.capacity_blocks = options.capacity_blocks;
  res.capacity_pages = static_cast<uint32_t>(capacity_pages);
  res.policy = options.policy;
  res.page_tokens = options.page_tokens;

  uint64_t now_ms = 0;  // the pool's clock (for pins) follows the trace's timestamps
  core::PoolOptions pool_options{res.capacity_pages, std::move(policy), 1, options.expensive_checks,
                                 [&now_ms] { return now_ms; }};
  core::PagePool pool(std::move(pool_options));
  const core::OwnerId owner = pool.open_owner();
  constexpr core::Namespace kNs = 1;
  res.host_blocks = options.host_blocks;
  const uint64_t host_pages = uint64_t{options.host_blocks} * per_block;
  if (host_pages > core::kMaxPages) throw std::invalid_argument("host tier too large");
  core::HostTier host(static_cast<uint32_t>(host_pages), 2);
  core::TierMover mover(pool, host, nullptr);
  // Promotes the host tier's run at the start of `rest` into out; returns its length.
  auto promote = [&](std::span<const BlockHash> rest, std::span<PageId> out,
                     const core::CallHints& h) -> uint32_t {
    if (mover.start_promotion(owner, kNs, rest, core::PagePool::kUnlimited, h).empty()) return 0;
    mover.admit_pending();  // the replay moves no bytes
    return mover.finish_promotion(owner, kNs, rest, out);
  };

  const bool windowed = options.window_tokens != 0;
  // What lookup_window and the release order need of a sliding model: pages and the window.
  const Geometry window_geometry{
      1, 1, 1, options.page_tokens, KvDtype::fp16, AttentionKind::sliding, options.window_tokens};
  std::vector<PageId> release_order;
  std::vector<BlockHash> chain;
  std::vector<PageId> pages;
  std::vector<PageId> found;
  std::vector<uint32_t> position;  // position[k]: chain position of pages[k]
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const auto& ids = trace.requests[r].hash_ids;
    chain.clear();
    for (const uint64_t id : ids) {
      for (uint32_t j = 0; j < per_block; ++j)
        chain.push_back(trace_page_hash(id, j));
    }
    const size_t n = chain.size();
    pages.resize(n);
    found.resize(n);
    position.resize(n);

    const TraceRequest& req = trace.requests[r];
    now_ms = req.timestamp_ms;
    const size_t system_pages = std::min<size_t>(size_t{req.system_blocks} * per_block, n);
    // The hints of the page at chain position i (none unless replaying with hints).
    auto hints_at = [&](size_t i) {
      core::CallHints h;
      h.pin_limit = options.pin_limit_pages;
      if (!use_hints) return h;
      h.hints.priority = i < system_pages ? Priority::system : req.priority;
      h.hints.pin_ttl_ms = req.pin_ttl_ms;
      return h;
    };

    // 1. The longest cached prefix: the system prompt's pages, then the rest, each with its own
    // hints (chained hashes make two lookups one). A windowed model: one lookup of the chain.
    uint32_t hits = 0;
    if (windowed) {
      core::CallHints h = hints_at(0);
      auto look = [&] {
        return options.window_lookup
                   ? pool.lookup_window(owner, kNs, chain, window_geometry, found, hits,
                                        core::PagePool::kUnlimited, h)
                   : pool.lookup(owner, kNs, chain, found, hits, core::PagePool::kUnlimited, h);
      };
      Status s = look();
      if (s.code() == Errc::pin_limit_exceeded) {  // as lookup_hinted: again without the pin
        h.hints.pin_ttl_ms = 0;
        s = look();
      }
      expect_ok(s, "lookup");
    } else {
      expect_ok(lookup_hinted(pool, owner, kNs, std::span(chain).first(system_pages), found, hits,
                              hints_at(0)),
                "lookup");
    }
    if (!windowed && hits == system_pages && system_pages < n) {
      uint32_t more = 0;
      expect_ok(lookup_hinted(pool, owner, kNs, std::span(chain).subspan(system_pages),
                              std::span(found).subspan(system_pages), more, hints_at(n - 1)),
                "lookup");
      hits += more;
    }
    if (hits < n) {
      const uint32_t promoted =
          promote(std::span(chain).subspan(hits), std::span(found).subspan(hits), hints_at(hits));
      res.host_hit_pages += promoted;
      hits += promoted;
    }
    size_t held = 0;
    for (uint32_t k = 0; k < hits; ++k) {
      if (found[k] == core::kNoPage) {  // before a window hit's window
        ++res.window_skipped_pages;
        continue;
      }
      position[held] = k;
      pages[held++] = found[k];
    }
    res.hit_pages += hits;
    res.page_ops += n;

    // 2. The rest, page by page.
    for (size_t i = hits; i < n; ++i) {
      uint32_t one = 0;
      expect_ok(pool.lookup(owner, kNs, std::span(chain).subspan(i, 1), found, one), "lookup");
      ++res.page_ops;
      if (one == 0 && promote(std::span(chain).subspan(i, 1), found, hints_at(i)) == 1) {
        one = 1;
        ++res.host_reused_pages;
      }
      if (one == 1) {
        position[held] = static_cast<uint32_t>(i);
        pages[held++] = found[0];
        ++res.reused_pages;
        continue;
      }
      PageId page = core::kNoPage;
      core::CallHints h = hints_at(i);
      Status s = pool.alloc(owner, std::span(&page, 1), h);
      if (s.code() == Errc::pin_limit_exceeded) {
        ++res.pins_refused;
        h.hints.pin_ttl_ms = 0;
        s = pool.alloc(owner, std::span(&page, 1), h);
      }
      if (s.code() == Errc::out_of_pages) {
        ++res.alloc_failures;
        continue;
      }
      expect_ok(s, "alloc");
      mover.admit_pending();
      core::PublishItem item{page, chain[i]};
      core::PublishResult published;
      expect_ok(pool.publish(owner, kNs, std::span(&item, 1), std::span(&published, 1)), "publish");
      position[held] = static_cast<uint32_t>(i);
      pages[held++] = page;
      ++res.allocated_pages;
      res.page_ops += 2;
    }

    // 3. Release, last page first.
    if (offline != nullptr) {
      for (size_t k = 0; k < held; ++k) {
        const uint64_t when = next_use[r][position[k] / per_block];
        offline->set_next_use(pages[k], (when << 24) | position[k]);
      }
    }
    // Last first; a windowed worker has let go of the pages before the window already.
    release_order.clear();
    const uint64_t dropped = windowed ? first_needed_block(window_geometry, n) : 0;
    for (const bool before_window : {true, false}) {
      for (size_t k = held; k-- > 0;) {
        if ((position[k] < dropped) == before_window) release_order.push_back(pages[k]);
      }
    }
    expect_ok(pool.release(owner, release_order), "release");
    res.page_ops += held;
    ++res.requests;
    res.pages += n;
    if (options.progress && (r % 256 == 255)) options.progress(r + 1, trace.requests.size());
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  res.evicted_pages = pool.stats().counters.evicted;
  res.demoted_pages = host.counters().demoted;
  expect_ok(pool.close_owner(owner), "close");
  std::string broken = pool.check_invariants();
  if (broken.empty()) broken = host.check_invariants();
  if (!broken.empty()) throw std::runtime_error("replay: invariant broken: " + broken);
  return res;
}

}  // namespace kvpool::bench

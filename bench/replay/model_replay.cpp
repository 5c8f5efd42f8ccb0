#include "bench/replay/model_replay.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <thread>

#include "client/connection/model_connection.h"
#include "common/byte_units.h"
#include "common/geometry.h"

namespace kvpool::bench {

namespace {

[[noreturn]] void fail(const std::string& what, const wire::Error& e) {
  throw std::runtime_error(what + ": " + e.message);
}

}  // namespace

ModelReplayResult replay_model(const Trace& trace, const std::vector<std::string>& sockets,
                               uint32_t page_tokens, uint32_t pace_us_per_page) {
  if (page_tokens == 0 || kTraceBlockTokens % page_tokens != 0) {
    throw std::invalid_argument("page tokens must divide 512");
  }
  if (sockets.empty()) throw std::invalid_argument("no daemon socket");
  std::vector<std::unique_ptr<client::ModelConnection>> daemons;
  for (const std::string& socket : sockets) {
    auto attached = client::ModelConnection::attach(socket, "model-replay", "",
                                                    client::Connection::Memory::none);
    if (!attached.ok()) fail("attach " + socket, attached.error());
    daemons.push_back(std::move(attached.value()));
  }
  const size_t groups = daemons[0]->num_groups();
  ModelReplayResult res;
  res.model = daemons[0]->model();
  for (size_t g = 0; g < groups; ++g) {
    const wire::PoolInfo& p = daemons[0]->group(g).pool();
    if (p.geometry.tokens_per_page != page_tokens) {
      throw std::invalid_argument(
          "the pool's pages hold " + std::to_string(p.geometry.tokens_per_page) +
          " tokens; run with --page-tokens " + std::to_string(p.geometry.tokens_per_page));
    }
    res.groups.push_back(daemons[0]->group_names()[g] + ": " +
                         std::string(attention_kind_name(p.geometry.kind)) +
                         (p.geometry.window != 0 ? " " + std::to_string(p.geometry.window) : "") +
                         ", " + human_bytes(p.page_stride) + " pages");
  }
  for (const auto& d : daemons) {
    if (d->num_groups() != groups || d->model() != res.model) {
      throw std::invalid_argument("every daemon must serve the same model (" + res.model + ")");
    }
  }
  const uint32_t per_block = kTraceBlockTokens / page_tokens;
  std::vector<BlockHash> chain;
  const auto start = std::chrono::steady_clock::now();
  for (size_t r = 0; r < trace.requests.size(); ++r) {
    const TraceRequest& req = trace.requests[r];
    client::ModelConnection& m = *daemons[r % daemons.size()];  // round-robin over the fleet
    chain.clear();
    for (const uint64_t id : req.hash_ids) {
      for (uint32_t j = 0; j < per_block; ++j)
        chain.push_back(trace_page_hash(id, j));
    }
    const auto n = static_cast<uint32_t>(chain.size());
    auto hit = m.lookup(chain);
    if (!hit.ok()) fail("lookup_groups", hit.error());
    const uint32_t hits = hit.value().hits();
    res.blocks += n;
    res.hit_blocks += hits;
    ++res.requests;
    std::vector<uint8_t> remote(hits, 0);  // per hit block: a group's page came remotely
    for (size_t g = 0; g < groups; ++g) {
      const std::vector<uint8_t>& tiers = hit.value().groups[g].tiers;
      for (size_t i = 0; i < tiers.size() && i < hits; ++i) {
        if (tiers[i] != wire::kTierRemote) continue;
        res.remote_bytes += m.group(g).pool().page_stride;
        remote[i] = 1;
      }
    }
    res.remote_blocks += static_cast<uint64_t>(std::count(remote.begin(), remote.end(), 1));
    for (size_t g = 0; g < groups; ++g) {
      client::Connection& c = m.group(g);
      const Geometry& geom = c.pool().geometry;
      // Each block's page in this group: the hit's, then one published per block past it (a
      // block another request published meanwhile is answered with that page, and the page
      // allocated for it stays held, unpublished, to go back free).
      std::vector<PageId> page = hit.value().groups[g].pages;
      page.resize(n, kNoPage);
      std::vector<PageId> spare;
      if (n > hits) {
        auto pages = c.alloc(n - hits);
        if (!pages.ok() && pages.error().status.code() != Errc::out_of_pages) {
          fail("alloc", pages.error());
        }
        res.alloc_failures += pages.ok() ? 0 : n - hits;
        if (pages.ok()) {
          std::vector<PublishItem> items;
          for (uint32_t i = hits; i < n; ++i)
            items.push_back({pages.value()[i - hits], chain[i]});
          auto pub = c.publish(items);
          if (!pub.ok()) fail("publish", pub.error());
          for (uint32_t i = hits; i < n; ++i) {
            page[i] = pub.value()[i - hits].page;
            if (page[i] != pages.value()[i - hits]) spare.push_back(pages.value()[i - hits]);
          }
        }
      }
      // What the sequence holds while it decodes: a window group its window's blocks only.
      const uint64_t first = first_needed_block(geom, n);
      res.held_bytes += (n - first) * c.pool().page_stride;
      res.all_full_bytes += uint64_t{n} * c.pool().page_stride;
      // The release order of an engine: a window group lets go of each block as it leaves the
      // window (head first), then of the window's blocks tail first at the end; a full group
      // of everything tail first. Eviction follows that order.
      std::vector<PageId> order;
      for (uint64_t i = 0; i < first; ++i) {
        if (page[i] != kNoPage) order.push_back(page[i]);
      }
      for (uint64_t i = n; i > first; --i) {
        if (page[i - 1] != kNoPage) order.push_back(page[i - 1]);
      }
      order.insert(order.end(), spare.begin(), spare.end());
      if (auto rel = c.release(order); !rel.ok()) fail("release", rel.error());
    }
    // The prefill of the pages past the hit, as an engine would spend it before the next
    // request (the daemons' background work, remote writes among it, runs meanwhile).
    if (pace_us_per_page != 0 && n > hits) {
      std::this_thread::sleep_for(std::chrono::microseconds(uint64_t{n - hits} * pace_us_per_page));
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t g = 0; g < groups; ++g) {
    uint64_t bytes = 0;
    for (const auto& d : daemons) {
      if (auto s = d->group(g).sync_segments(); !s.ok()) fail("segments", s.error());
      bytes += d->group(g).pool().segment_bytes;
    }
    res.budget_bytes += bytes;
    res.groups[g] += ", " + human_bytes(bytes) + " at the end";
  }
  return res;
}

}  // namespace kvpool::bench

// The Service: a hybrid model's remote tiers (docs/ARCHITECTURE.md, "Remote tier"). Every group
// pool of the model has its own tier (the group's name is in its keys); a lookup_groups whose
// groups serve locally less than the chain asks the groups' tiers, in one job on the remote
// fetch worker, for the blocks a longer hit would need that they lack. The full groups first:
// each its missing blocks up to batch_pages past the local hit; the first that no tier holds
// bounds the hit. Then each sliding or chunked group the blocks it lacks around the windows a
// hit ending at that bound needs (first_needed_block applied twice: a block lost in the last
// window shortens the hit instead of ending it). Each value is checked on its own. The hit rule
// is lookup_groups' own (service_groups.cpp), with a block fetched counted as present and as a
// copy: the answer is the longest n every group can serve.
//
// On the loop, once fetched: in each group, the fetched blocks that n needs are allocated, copied
// up from the staging slots with the demotions that allocation caused, published and held until
// the answer holds them; then the answer is made as a local lookup_groups makes it, each such
// block's tier being kTierRemote. A group with a tier job in flight copies nothing (its hit is
// then shorter), as for promotions from its host tier.
#include <algorithm>

#include "common/geometry.h"
#include "daemon/core/check.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

// One lookup_groups' fetch: made on the loop, run on the remote fetch worker, finished on the
// loop.
struct GroupFetch {
  struct Part {
    RemoteTier* tier = nullptr;
    Geometry geometry;
    bool full = false;                   // a full-attention group: its run bounds the hit
    std::shared_ptr<RemoteFetch> fetch;  // null: the group asks nothing
    // The chain position of each key fetched, ascending. A full group's keys are chosen on the
    // loop; a window's group's on the worker, from its candidates, once the full groups' reads
    // say where the hit can end.
    std::vector<uint32_t> positions;
    uint32_t unasked = 0;  // a full group: its first missing position past its keys (or upper)
    std::vector<uint32_t> candidate_positions;
    std::vector<BlockHash> candidate_hashes;
    std::vector<std::string> candidate_keys;
  };
  std::vector<BlockHash> chain;
  std::vector<core::CallHints> hints;
  uint32_t local = 0;       // the hit the groups' local tiers serve
  uint32_t upper = 0;       // the longest hit asked for
  std::vector<Part> parts;  // by group
};

namespace {

// The worker's part. The full groups' batches first: the first block one of them has in no tier
// bounds the hit. Then, while a hit longer than the local one is still possible, each window
// group's batch: its candidates in the windows that a hit ending at that bound needs (its last
// two windows: a block lost in the last one shortens the hit to just before it), the nearest
// the end when its slots are fewer. A batch not run keeps no `valid`.
void run_group_fetch(GroupFetch& f) {
  uint32_t bound = f.upper;
  for (GroupFetch::Part& p : f.parts) {
    if (!p.fetch || !p.full) continue;
    p.tier->fetch(*p.fetch);
    const std::vector<uint8_t>& valid = p.fetch->valid;
    const auto k = static_cast<size_t>(std::find(valid.begin(), valid.end(), 0) - valid.begin());
    bound = std::min(bound, k < p.positions.size() ? p.positions[k] : p.unasked);
  }
  if (bound <= f.local) return;
  for (GroupFetch::Part& p : f.parts) {
    if (!p.fetch || p.full) continue;
    const uint64_t first = first_needed_block(p.geometry, first_needed_block(p.geometry, bound));
    size_t end = 0;
    while (end < p.candidate_positions.size() && p.candidate_positions[end] < bound)
      ++end;
    size_t begin = end;
    while (begin > 0 && p.candidate_positions[begin - 1] >= first &&
           end - begin < p.fetch->slots.size()) {
      --begin;
    }
    if (begin == end) continue;
    RemoteFetch& rf = *p.fetch;
    for (size_t i = begin; i < end; ++i) {
      p.positions.push_back(p.candidate_positions[i]);
      rf.hashes.push_back(p.candidate_hashes[i]);
      rf.keys.push_back(std::move(p.candidate_keys[i]));
    }
    p.tier->fetch(rf);
  }
}

}  // namespace

bool Service::plan_group_fetch(SessionState& s, const std::vector<PoolRuntime*>& groups,
                               std::span<const BlockHash> chain,
                               const std::vector<core::CallHints>& hints, uint32_t local) {
  // Every group of a model has the model's remote_tier (config: expand_groups).
  if (groups.empty() || groups[0]->remote() == nullptr || local >= chain.size()) return false;
  const Namespace ns = s.tenant + 1;
  const auto size = static_cast<uint32_t>(chain.size());
  auto f = std::make_shared<GroupFetch>();
  f->local = local;
  // The longest hit asked for: a fetch of batch_pages more blocks than the local hit.
  f->upper = std::min(size, local + groups[0]->remote()->config().batch_pages);
  f->parts.resize(groups.size());
  bool asked = false;
  // The full groups first: one that lacks a block it cannot ask for bounds the hit there, and
  // the window groups then look no further.
  for (const bool full : {true, false}) {
    for (size_t g = 0; g < groups.size(); ++g) {
      PoolRuntime& pool = *groups[g];
      GroupFetch::Part& part = f->parts[g];
      part.geometry = pool.config().geometry;
      part.full = part.geometry.window == 0;
      if (part.full != full) continue;
      if (f->upper <= local) break;
      SessionState& gs = *s.model->by_group[g];
      part.tier = pool.remote();
      part.tier->name_tenant(ns, access_.tenant_name(gs.tenant));
      const uint32_t cap = std::min({part.tier->config().batch_pages, access_.new_pages_allowed(gs),
                                     part.tier->free_fetch_slots()});
      // A full group: every block it lacks before upper, from the first. A window's group:
      // every block it lacks that a hit ending past the local one may need, chosen among on
      // the worker.
      const uint32_t first =
          full ? 0
               : static_cast<uint32_t>(first_needed_block(
                     part.geometry, first_needed_block(part.geometry, local + 1)));
      std::vector<uint32_t> missing;
      for (uint32_t i = first; i < f->upper; ++i) {
        if (pool.pages().find(ns, chain[i]) == kNoPage && !pool.host_can_promote(ns, chain[i])) {
          missing.push_back(i);
        }
      }
      if (missing.empty()) continue;
      std::unique_ptr<RemoteFetch> fetch;
      if (full) {
        std::vector<BlockHash> wanted;
        for (const uint32_t i : missing)
          wanted.push_back(chain[i]);
        // Null: unreachable for now, no slot or quota, or the tenant unnamed.
        if (cap != 0) fetch = part.tier->plan_fetch(ns, wanted, cap);
        const size_t asked_for = fetch ? fetch->keys.size() : 0;
        part.positions.assign(missing.begin(),
                              missing.begin() + static_cast<std::ptrdiff_t>(asked_for));
        part.unasked = asked_for < missing.size() ? missing[asked_for] : f->upper;
        f->upper = std::min(f->upper, part.unasked);
      } else {
        for (const uint32_t i : missing) {
          std::string key = part.tier->block_key(ns, chain[i]);
          if (key.empty()) break;
          part.candidate_positions.push_back(i);
          part.candidate_hashes.push_back(chain[i]);
          part.candidate_keys.push_back(std::move(key));
        }
        if (cap != 0 && !part.candidate_keys.empty()) fetch = part.tier->plan_fetch_slots(ns, cap);
      }
      if (!fetch) continue;
      part.fetch = std::move(fetch);
      asked = true;
    }
  }
  // No hit past the local one is possible: nothing is asked.
  if (asked && f->upper <= local) {
    for (GroupFetch::Part& p : f->parts) {
      if (p.fetch) p.tier->cancel_fetch(*p.fetch);
    }
    return false;
  }
  if (!asked) return false;
  f->chain.assign(chain.begin(), chain.end());
  f->hints = hints;
  KVPOOL_CHECK(!call_job_);
  call_job_ = std::make_unique<CopyJob>();
  call_job_->worker = CopyJob::Worker::remote_fetch;
  call_job_->pool = s.pool;
  // One group's batch after the other: each tier's fetch client belongs to this worker.
  call_job_->work = [f] { run_group_fetch(*f); };
  call_job_->finish = [this, &s, f]() -> wire::Result<wire::Reply> {
    return groups_fetched(s, *f);
  };
  return true;
}

wire::Result<wire::Reply> Service::groups_fetched(SessionState& s, GroupFetch& f) {
  // A batch the worker left unrun gives its slots back uncounted.
  for (GroupFetch::Part& p : f.parts) {
    if (p.fetch && p.fetch->valid.empty()) {
      p.tier->cancel_fetch(*p.fetch);
      p.fetch.reset();
    }
  }
  const auto finish_all = [&f] {
    for (GroupFetch::Part& p : f.parts) {
      if (p.fetch) p.tier->finish_fetch(*p.fetch, 0);
    }
  };
  // The session, or one linked to it, may have closed while the fetch ran.
  if (!s.attached || s.closing) {
    finish_all();
    return wire::Error::of(Errc::not_attached, "lookup_groups: the session closed");
  }
  const std::vector<PoolRuntime*> groups = pools_->group_pools(*s.pool);
  if (auto e = check_linked(s, groups)) {
    finish_all();
    return *e;
  }
  const Namespace ns = s.tenant + 1;
  const auto size = static_cast<uint32_t>(f.chain.size());
  GroupMarks fetched(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const GroupFetch::Part& part = f.parts[g];
    if (!part.fetch) continue;
    fetched[g].assign(size, 0);
    for (size_t k = 0; k < part.fetch->valid.size(); ++k)
      fetched[g][part.positions[k]] = part.fetch->valid[k];
  }
  uint64_t promote_left = kMaxGroupPromoteBytes;
  uint32_t n = group_hit(ns, f.chain, groups, size, promote_left, &fetched);
  GroupMarks came_from(groups.size());
  // The pages published here stay held until the answer holds them: nothing evicts them in
  // between (the answer's promotions, another group's growth).
  std::vector<std::vector<PageId>> held(groups.size());
  // The full groups first: what they copy (fewer blocks than n needs under a quota, none with a
  // job in flight) says how long the hit can be, and the window groups copy for that hit.
  for (const bool full : {true, false}) {
    if (!full) {
      for (size_t g = 0; g < groups.size(); ++g) {
        if (f.parts[g].full) fetched[g].clear();  // what they copied is on the device now
      }
      n = group_hit(ns, f.chain, groups, size, promote_left, &fetched);
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      GroupFetch::Part& part = f.parts[g];
      if (!part.fetch || part.full != full) continue;
      RemoteFetch& fetch = *part.fetch;
      PoolRuntime& pool = *groups[g];
      SessionState& gs = *s.model->by_group[g];
      const Geometry& geom = pool.config().geometry;
      // What the hit needs of this group's fetch: the valid keys in its part [first, n) that
      // the group does not hold now (a block published or demoted meanwhile is served locally).
      const auto first = first_needed_block(geom, n);
      std::vector<uint32_t> keys;
      for (size_t k = 0; k < fetch.valid.size(); ++k) {
        const uint32_t at = part.positions[k];
        if (fetch.valid[k] == 0 || at < first || at >= n) continue;
        if (pool.pages().find(ns, f.chain[at]) != kNoPage) continue;
        if (pool.host_can_promote(ns, f.chain[at])) continue;
        keys.push_back(static_cast<uint32_t>(k));
      }
      // Within the quota and what the loop may copy: a full group's hit shortens to the run
      // copied; a window's group copies all it needs or nothing (its hit needs the window's
      // end).
      const uint64_t page_bytes = page_data_bytes(geom) + page_scale_bytes(geom);
      const uint64_t fits =
          std::min<uint64_t>(access_.new_pages_allowed(gs), promote_left / page_bytes);
      if (keys.size() > fits) keys.resize(full ? fits : 0);
      const auto count = static_cast<uint32_t>(keys.size());
      std::vector<PageId> pages(count);
      uint64_t growable = 0;
      bool admitted = false;
      if (count == 0 || pool.copies_in_flight() != 0 ||
          !pool.alloc(gs.owner, pages, core::CallHints{}, &growable, &admitted).ok()) {
        part.tier->finish_fetch(fetch, 0);
        continue;
      }
      // The copies up, behind the demotions the allocation caused (a page they read may be one
      // a value lands in).
      TierCopy c;
      pool.plan_demotions(c);
      part.tier->plan_promote(pool.paged_kv(), fetch, keys, pages, c.remote_runs);
      pool.run_tier(c);
      pool.finish_demotions(c);
      promote_left -= std::min(promote_left, uint64_t{count} * page_bytes);
      std::vector<PublishItem> items(count);
      std::vector<PublishResult> results(count);
      for (uint32_t i = 0; i < count; ++i)
        items[i] = PublishItem{pages[i], fetch.hashes[keys[i]]};
      Status st;
      if (c.remote_error.empty()) st = pool.pages().publish(gs.owner, ns, items, results);
      if (!c.remote_error.empty() || !st.ok()) {
        log_event(LogLevel::error, "remote_tier_promote_failed",
                  {kv("pool", pool.name()),
                   kv("error", c.remote_error.empty() ? st.message() : c.remote_error)});
        KVPOOL_CHECK(pool.pages().release(gs.owner, pages).ok());
        access_.refresh_held(gs);
        part.tier->finish_fetch(fetch, 0);
        continue;
      }
      // A block published meanwhile (by another session, or twice in this chain): the session
      // now also holds that page, until the answer holds it; ours goes back.
      std::vector<PageId> spare;
      std::vector<uint32_t> served;
      came_from[g].assign(size, 0);
      for (uint32_t i = 0; i < count; ++i) {
        held[g].push_back(results[i].page);
        if (results[i].kind == PublishResult::Kind::duplicate) {
          spare.push_back(pages[i]);
          continue;
        }
        served.push_back(keys[i]);
        came_from[g][part.positions[keys[i]]] = wire::kTierRemote;
      }
      if (!spare.empty()) KVPOOL_CHECK(pool.pages().release(gs.owner, spare).ok());
      access_.refresh_held(gs);
      part.tier->finish_fetch(fetch, served);
    }
  }
  wire::Result<wire::Reply> reply =
      answer_groups(s, f.chain, f.hints, std::move(came_from), promote_left);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (held[g].empty()) continue;
    SessionState& gs = *s.model->by_group[g];
    KVPOOL_CHECK(groups[g]->pages().release(gs.owner, held[g]).ok());
    access_.refresh_held(gs);
  }
  return reply;
}

}  // namespace kvpool::daemon

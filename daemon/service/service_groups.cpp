// The Service's hybrid models (docs/ARCHITECTURE.md, "Hybrid models"): a worker of a model with
// several KV groups attaches one session per group, the later ones naming the first in hello
// (link_session), and asks lookup_groups on any of them for the hit every group can serve.
//
// The hit rule. A sequence resuming after n blocks needs, of a full-attention group, every block
// [0, n); of a sliding or chunked group, the blocks its window covers at that point,
// [first_needed_block(n), n) (common/geometry.h). The hit is the largest n for which every group
// has its blocks in its pool now: in its device tier, or in its host tier. It is found without
// taking a reference (PagePool::find, HostTier::find), then each group's device pages are taken
// into that group's session and the rest of its part promoted from its host tier; when a group
// comes short (a quota, a saturated refcount, no device page for a promotion), what this call
// took is released (promoted blocks stay, as device blocks) and the next smaller hit tried.
//
// Promotions copy on the event loop, each group's in turn (a group with a tier job in flight
// promotes nothing: a queued demotion may still be writing its slots), and one lookup promotes at
// most kMaxGroupPromoteBytes; the hit ends where more would be needed.
//
// With a remote tier (service_groups_remote.cpp), a hit shorter than the chain first asks the
// groups' tiers for what a longer one needs; what came up is then a device block to the steps
// above, its tier kTierRemote in the answer (answer_groups' came_from).
#include <algorithm>

#include "common/geometry.h"
#include "daemon/core/check.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// At most this many attempts before a lookup_groups answers no hit: each one after the first
// follows a group coming short of pages, which its quota or a saturated refcount caused.
constexpr int kMaxGroupAttempts = 8;

// The pages a group's part of the reply holds (its holes before the window hold none).
std::vector<PageId> held_of(const wire::LookupReply& l) {
  std::vector<PageId> out;
  for (const PageId p : l.pages) {
    if (p != kNoPage) out.push_back(p);
  }
  return out;
}

}  // namespace

wire::Result<bool> Service::join_model(SessionState& s, PoolRuntime& pool, uint64_t link) {
  const PoolConfig& pc = pool.config();
  if (pc.model.empty()) {
    return wire::Error::of(Errc::invalid_argument,
                           "link_session: pool " + pool.name() +
                               " is not a group of a hybrid model (pools[].groups); attach "
                               "without link_session");
  }
  if (link == 0) {
    s.model = std::make_shared<ModelSessions>();
    s.model->by_group.assign(pc.model_groups.size(), nullptr);
    s.model->by_group[pc.group] = &s;
    return true;
  }
  const SessionState* other = nullptr;
  for (const SessionState* live : access_.live()) {
    if (live->id == link) other = live;
  }
  const std::string which = "link_session " + std::to_string(link);
  if (other == nullptr || !other->attached) {
    return wire::Error::of(Errc::invalid_argument, which + " is not an attached session", link);
  }
  if (other->peer.pid != s.peer.pid || other->tenant != s.tenant) {
    return wire::Error::of(Errc::permission_denied,
                           which +
                               " belongs to another process or tenant; a worker links only "
                               "its own sessions",
                           link);
  }
  if (!other->model || other->pool->config().model != pc.model) {
    return wire::Error::of(Errc::invalid_argument,
                           which + " is attached to pool " + other->pool->name() +
                               ", not to a group of model " + pc.model,
                           link);
  }
  if (other->model->by_group[pc.group] != nullptr) {
    return wire::Error::of(Errc::invalid_argument,
                           which + " already has a session of group " + pc.model_groups[pc.group] +
                               " (session " + std::to_string(other->model->by_group[pc.group]->id) +
                               ")",
                           link);
  }
  s.model = other->model;
  s.model->by_group[pc.group] = &s;
  return true;
}

uint32_t Service::group_hit(Namespace ns, std::span<const BlockHash> chain,
                            const std::vector<PoolRuntime*>& groups, uint32_t upper,
                            uint64_t promote_left, const GroupMarks* fetched) const {
  // Per group, the run of blocks present that ends at each position, and how many of the
  // blocks before each position need a copy up (only its host tier holds them, or they were
  // fetched from its remote tier); a full group bounds the hit by its first missing block.
  std::vector<std::vector<uint32_t>> runs(groups.size());
  std::vector<std::vector<uint32_t>> host_only(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    const core::PagePool& pages = groups[g]->pages();
    const bool full = groups[g]->config().geometry.window == 0;
    std::vector<uint32_t>& run = runs[g];
    std::vector<uint32_t>& host = host_only[g];
    run.resize(upper);
    host.assign(upper + 1, 0);
    for (uint32_t i = 0; i < upper; ++i) {
      const bool device = pages.find(ns, chain[i]) != kNoPage;
      const bool below = !device && groups[g]->host_can_promote(ns, chain[i]);
      const bool remote = fetched != nullptr && i < (*fetched)[g].size() && (*fetched)[g][i] != 0;
      const bool present = device || below || remote;
      run[i] = present ? (i == 0 ? 1 : run[i - 1] + 1) : 0;
      host[i + 1] = host[i] + (below || remote ? 1 : 0);
      if (full && !present) {
        upper = i;
        break;
      }
    }
  }
  for (uint32_t n = upper; n > 0; --n) {
    bool served = true;
    uint64_t promote_bytes = 0;
    for (size_t g = 0; g < groups.size() && served; ++g) {
      const Geometry& geom = groups[g]->config().geometry;
      const uint64_t first = first_needed_block(geom, n);
      served = runs[g][n - 1] >= n - first;
      promote_bytes += uint64_t{host_only[g][n] - host_only[g][first]} *
                       (page_data_bytes(geom) + page_scale_bytes(geom));
    }
    if (served && promote_bytes <= promote_left) return n;
  }
  return 0;
}

uint32_t Service::promote_group(PoolRuntime& pool, SessionState& gs, Namespace ns,
                                std::span<const BlockHash> rest, std::span<PageId> out,
                                uint64_t& promote_left) {
  if (!pool.has_host_tier() || pool.copies_in_flight() != 0 || rest.empty()) return 0;
  const Geometry& g = pool.config().geometry;
  const uint64_t page_bytes = page_data_bytes(g) + page_scale_bytes(g);
  const auto affordable = static_cast<uint32_t>(
      std::min<uint64_t>(promote_left / page_bytes, access_.new_pages_allowed(gs)));
  if (affordable == 0) return 0;
  TierCopy c;
  // Hints are set on the whole answer afterwards (apply_group_hints), as on its device hits.
  const bool promoting = pool.plan_promotion(gs.owner, ns, rest, affordable, core::CallHints{}, c);
  if (c.empty()) return 0;
  pool.run_tier(c);
  uint32_t promoted = 0;
  if (promoting) {
    promoted = pool.finish_promotion(c, gs.owner, ns, rest, out);
  } else {
    pool.finish_demotions(c);
  }
  access_.refresh_held(gs);
  promote_left -= std::min(promote_left, uint64_t{promoted} * page_bytes);
  return promoted;
}

std::optional<wire::Error> Service::check_linked(const SessionState& s,
                                                 const std::vector<PoolRuntime*>& groups) const {
  const PoolConfig& pc = s.pool->config();
  for (size_t g = 0; g < groups.size(); ++g) {
    if (s.model->by_group[g] == nullptr) {
      return wire::Error::of(Errc::invalid_argument,
                             "lookup_groups: group " + pc.model_groups[g] + " of model " +
                                 pc.model + " has no session linked to session " +
                                 std::to_string(s.id) + " (attach to pool " + groups[g]->name() +
                                 " with hello's link_session)");
    }
  }
  return std::nullopt;
}

wire::Result<wire::Reply> Service::lookup_groups(SessionState& s, const wire::GroupLookupRequest& r,
                                                 Call&) {
  if (!s.model) {
    return wire::Error::of(
        Errc::invalid_argument,
        "lookup_groups: pool " + s.pool->name() + " is not a group of a hybrid model; use lookup");
  }
  const std::vector<PoolRuntime*> groups = pools_->group_pools(*s.pool);
  if (auto e = check_linked(s, groups)) return *e;
  // The reply carries a page and a tier byte per block and group: it must fit one frame.
  const uint64_t reply_bytes = 16 + uint64_t{r.chain.size()} * groups.size() * (sizeof(PageId) + 1);
  if (reply_bytes > wire::kMaxPayloadBytes) {
    return wire::Error::of(Errc::invalid_argument,
                           "lookup_groups: " + std::to_string(r.chain.size()) + " blocks of " +
                               std::to_string(groups.size()) +
                               " groups make a reply larger than one frame; look up at most " +
                               std::to_string(wire::kMaxPayloadBytes / groups.size() / 5 - 4),
                           r.chain.size());
  }
  // Each group's hints are checked against its own pool (pin limits are per pool), and applied
  // only to the pages of the answer (apply_group_hints), never to an attempt given back.
  std::vector<core::CallHints> hints;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto h = access_.call_hints(*s.model->by_group[g], r.hints);
    if (!h.ok()) return h.error();
    hints.push_back(h.value());
  }
  // The hit the groups' device and host tiers serve: the answer's first attempt, and where the
  // groups' remote tiers, when they may serve more, go on from (the answer then waits for their
  // fetch, off the loop, and the copies up: service_groups_remote.cpp).
  const uint32_t local = group_hit(s.tenant + 1, r.chain, groups,
                                   static_cast<uint32_t>(r.chain.size()), kMaxGroupPromoteBytes);
  if (local < r.chain.size() && plan_group_fetch(s, groups, r.chain, hints, local)) {
    return wire::Reply(wire::GroupLookupReply{});  // call_job_'s takes its place
  }
  return answer_groups(s, r.chain, hints, GroupMarks(groups.size()), kMaxGroupPromoteBytes, local);
}

wire::Result<wire::Reply> Service::answer_groups(SessionState& s, std::span<const BlockHash> chain,
                                                 const std::vector<core::CallHints>& hints,
                                                 GroupMarks came_from, uint64_t promote_left,
                                                 uint32_t first_hit) {
  const std::vector<PoolRuntime*> groups = pools_->group_pools(*s.pool);
  const Namespace ns = s.tenant + 1;
  wire::GroupLookupReply reply;
  reply.groups.resize(groups.size());
  auto upper = static_cast<uint32_t>(chain.size());
  // promote_left: what this lookup may still copy up, over all its attempts. came_from[g][i]
  // names the tier a block came up from (kept across attempts: a block promoted by one is a
  // device block to the next, but its answer says where it came from); 0: none, the device's.
  for (int attempt = 0; attempt < kMaxGroupAttempts && upper > 0; ++attempt) {
    const uint32_t n = attempt == 0 && first_hit != kHitUnknown
                           ? first_hit
                           : group_hit(ns, chain, groups, upper, promote_left);
    if (n == 0) break;
    size_t taken = 0;  // groups whose pages this attempt holds
    for (; taken < groups.size(); ++taken) {
      SessionState& gs = *s.model->by_group[taken];
      const auto first =
          static_cast<uint32_t>(first_needed_block(groups[taken]->config().geometry, n));
      wire::LookupReply& l = reply.groups[taken];
      l.pages.assign(n, kNoPage);
      // The group's part, [first, n): a run its device tier holds, then one its host tier
      // holds, and so on (a sliding group lets go of a sequence's head first, so its older
      // blocks are below while the newer ones are still on the device).
      uint32_t got = 0;
      while (got < n - first) {
        uint32_t hits = 0;
        const Status st = groups[taken]->pages().lookup(
            gs.owner, ns, std::span(chain).subspan(first + got, n - first - got),
            std::span(l.pages).subspan(first + got), hits, access_.new_pages_allowed(gs));
        if (!st.ok()) {
          std::fill(l.pages.begin() + first + got, l.pages.end(), kNoPage);
          for (size_t g = 0; g <= taken; ++g) {
            (void)groups[g]->pages().release(s.model->by_group[g]->owner, held_of(reply.groups[g]));
            access_.refresh_held(*s.model->by_group[g]);
          }
          return access_.hint_error(gs, st);
        }
        access_.refresh_held(gs);
        got += hits;
        if (got == n - first) break;
        const uint32_t up = promote_group(*groups[taken], gs, ns,
                                          std::span(chain).subspan(first + got, n - first - got),
                                          std::span(l.pages).subspan(first + got), promote_left);
        if (up == 0) break;
        came_from[taken].resize(chain.size(), 0);
        std::fill_n(came_from[taken].begin() + first + got, up, wire::kTierHost);
        got += up;
      }
      if (got < n - first) {
        // Short (a quota, a saturated refcount, no page to promote into): no hit past
        // first + got in this group.
        l.pages.resize(first + got);
        upper = first + got;
        break;
      }
    }
    if (taken == groups.size()) {
      if (auto e = apply_group_hints(s, groups, hints, reply)) return *e;
      for (size_t g = 0; g < groups.size(); ++g) {
        wire::LookupReply& l = reply.groups[g];
        l.tiers.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
          const uint8_t from = i < came_from[g].size() ? came_from[g][i] : 0;
          l.tiers[i] = l.pages[i] == kNoPage ? wire::kTierNone
                       : from != 0           ? from
                                             : wire::kTierDevice;
        }
        groups[g]->prefix_stats().hit(l.pages, pools_->now_s());
        offer_remote_hits(*s.model->by_group[g], chain, l.pages);
      }
      return wire::Reply(std::move(reply));
    }
    // Give back what this attempt took (the short group's hits too) and try a shorter hit.
    for (size_t g = 0; g <= taken && g < groups.size(); ++g) {
      (void)groups[g]->pages().release(s.model->by_group[g]->owner, held_of(reply.groups[g]));
      access_.refresh_held(*s.model->by_group[g]);
    }
  }
  for (wire::LookupReply& l : reply.groups) {
    l.pages.clear();
    l.tiers.clear();
  }
  return wire::Reply(std::move(reply));
}

std::optional<wire::Error> Service::apply_group_hints(SessionState& s,
                                                      const std::vector<PoolRuntime*>& groups,
                                                      const std::vector<core::CallHints>& hints,
                                                      wire::GroupLookupReply& reply) {
  if (hints.empty() || hints[0].hints.empty()) return std::nullopt;
  // Every group's pin limits first, so that a refusal pins nothing; then a retain with the hints
  // sets them (pins, priority) on pages the session holds, and the release after it drops only
  // that extra reference.
  const auto refuse = [&](SessionState& gs, const Status& st) {
    for (size_t k = 0; k < groups.size(); ++k) {  // nothing of this lookup stays held
      (void)groups[k]->pages().release(s.model->by_group[k]->owner, held_of(reply.groups[k]));
      access_.refresh_held(*s.model->by_group[k]);
    }
    return access_.hint_error(gs, st);
  };
  for (size_t g = 0; g < groups.size(); ++g) {
    const Status st = groups[g]->pages().check_hints(held_of(reply.groups[g]), hints[g]);
    if (!st.ok()) return refuse(*s.model->by_group[g], st);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    SessionState& gs = *s.model->by_group[g];
    const std::vector<PageId> held = held_of(reply.groups[g]);
    const Status st = groups[g]->pages().retain(gs.owner, held, hints[g]);
    if (!st.ok()) return refuse(gs, st);  // a saturated refcount
    KVPOOL_CHECK(groups[g]->pages().release(gs.owner, held).ok());
  }
  return std::nullopt;
}

}  // namespace kvpool::daemon

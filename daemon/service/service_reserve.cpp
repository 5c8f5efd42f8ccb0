// The Service's static reservations (docs/ARCHITECTURE.md, "Static reservations"): reserve holds,
// for one sequence, the pages of up to max_tokens at once and answers its block table, which no
// call changes until unreserve or the session's end (a CUDA graph captured over it stays valid).
//
// A reservation is references of the session's own owner, recorded apart (SessionState::
// reservations and reserved_refs): release refuses to drop them, unreserve drops them tail first,
// closing the session drops them with everything else. Its pages count against the session's and
// the tenant's quota as any held page does. Seeds are pages the session already holds (a lookup's
// or lookup_groups' hit): the reservation takes one more reference on each, so the prefix stays
// shared with every other sequence that hit it.
#include <algorithm>

#include "daemon/core/check.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

// Reservations one session may hold at once: each is daemon memory (its table) whatever its
// pages cost the quota (a reservation of seeds only costs none).
constexpr size_t kMaxReservationsPerSession = 4096;

std::vector<PageId> real_pages(const std::vector<PageId>& table) {
  std::vector<PageId> out;
  for (const PageId p : table) {
    if (p != kNoPage) out.push_back(p);
  }
  return out;
}

}  // namespace

wire::Result<wire::Reply> Service::reserve(SessionState& s, const wire::ReserveRequest& r, Call&) {
  PoolRuntime& pool = *s.pool;
  const uint32_t per_page = pool.config().geometry.tokens_per_page;
  if (r.max_tokens == 0) {
    return wire::Error::of(Errc::invalid_argument, "reserve: max_tokens must be at least 1");
  }
  const uint64_t blocks = (uint64_t{r.max_tokens} + per_page - 1) / per_page;
  if (blocks > wire::kMaxBatch) {
    return wire::Error::of(Errc::invalid_argument,
                           "reserve: max_tokens " + std::to_string(r.max_tokens) + " needs " +
                               std::to_string(blocks) + " pages, more than one reply carries (" +
                               std::to_string(wire::kMaxBatch) + ")",
                           blocks);
  }
  if (s.reservations.size() >= kMaxReservationsPerSession) {
    return wire::Error::of(Errc::quota_exceeded,
                           "reserve: this session holds " + std::to_string(s.reservations.size()) +
                               " reservations, the most one session may (unreserve some)",
                           s.reservations.size());
  }
  if (blocks > pool.info().max_pages) {
    return wire::Error::of(Errc::exceeds_capacity,
                           "reserve: max_tokens " + std::to_string(r.max_tokens) + " needs " +
                               std::to_string(blocks) + " pages of " + std::to_string(per_page) +
                               " tokens, more than pool " + pool.name() + " can hold (" +
                               std::to_string(pool.info().max_pages) + ")",
                           blocks);
  }
  if (r.seeds.size() > blocks) {
    return wire::Error::of(Errc::invalid_argument,
                           "reserve: " + std::to_string(r.seeds.size()) +
                               " seed pages for max_tokens " + std::to_string(r.max_tokens) + " (" +
                               std::to_string(blocks) + " pages)",
                           r.seeds.size());
  }
  // Seeds: kNoPage only before the first page (a window's hit), pages this session holds, none
  // twice; a table of nothing but holes holds no page and is refused.
  bool seen_page = false;
  std::vector<PageId> seeds;
  for (size_t i = 0; i < r.seeds.size(); ++i) {
    const PageId p = r.seeds[i];
    const auto item = static_cast<uint32_t>(i);
    if (p == kNoPage) {
      if (seen_page || pool.config().geometry.window == 0) {
        return wire::Error{Status(Errc::invalid_page, item, p),
                           "reserve: seed " + std::to_string(i) +
                               " is kNoPage; only the blocks before a sliding or chunked "
                               "window's hit may be"};
      }
      continue;
    }
    seen_page = true;
    if (!pool.pages().valid_page(p)) {
      return wire::Error{Status(Errc::invalid_page, item, p), "reserve: seed " + std::to_string(i) +
                                                                  " is page " + std::to_string(p) +
                                                                  ", outside pool " + pool.name()};
    }
    if (pool.pages().held(s.owner, p) == 0) {
      return wire::Error{Status(Errc::not_held, item, p),
                         "reserve: seed page " + std::to_string(p) +
                             " is not held by this session (look it up first)"};
    }
    if (std::find(seeds.begin(), seeds.end(), p) != seeds.end()) {
      return wire::Error{Status(Errc::duplicate_item, item, p),
                         "reserve: seed page " + std::to_string(p) + " is listed twice"};
    }
    seeds.push_back(p);
  }
  const uint64_t fresh = blocks - r.seeds.size();
  if (fresh == 0 && seeds.empty()) {
    return wire::Error::of(Errc::invalid_argument, "reserve: every seed is kNoPage");
  }
  if (fresh > access_.new_pages_allowed(s)) return access_.quota_error(s, fresh);
  auto hints = access_.call_hints(s, r.hints);
  if (!hints.ok()) return hints.error();

  wire::ReserveReply reply;
  reply.pages = r.seeds;
  reply.pages.resize(blocks, kNoPage);
  const std::span<PageId> fresh_pages = std::span(reply.pages).subspan(r.seeds.size());
  if (fresh != 0) {
    uint64_t growable = 0;
    bool admitted = false;
    const Status st = pool.alloc(s.owner, fresh_pages, hints.value(), &growable, &admitted);
    if (!st.ok()) {
      if (!admitted) {
        if (auto e = pool.capacity_error(st, growable)) return *e;
      }
      return access_.hint_error(s, st);
    }
  }
  if (const Status st = pool.pages().retain(s.owner, seeds, hints.value()); !st.ok()) {
    (void)pool.pages().release(s.owner, fresh_pages);  // unpublished: free again
    // What the alloc evicted cannot go down now: its pages are FREE, and another session may
    // write them before a deferred copy would read them.
    pool.drop_pending_demotions();
    access_.refresh_held(s);
    return access_.hint_error(s, st);
  }
  const uint64_t id = s.next_reservation++;
  for (const PageId p : real_pages(reply.pages))
    ++s.reserved_refs[p];
  s.reserved_pages += seeds.size() + fresh;
  s.reservations.emplace(id, reply.pages);
  access_.refresh_held(s);
  reply.reservation = id;
  return wire::Reply(std::move(reply));
}

wire::Result<wire::Reply> Service::unreserve(SessionState& s, const wire::UnreserveRequest& r,
                                             Call&) {
  const auto it = s.reservations.find(r.reservation);
  if (it == s.reservations.end()) {
    return wire::Error::of(
        Errc::invalid_argument,
        "unreserve: this session has no reservation " + std::to_string(r.reservation),
        r.reservation);
  }
  std::vector<PageId> pages = real_pages(it->second);
  std::reverse(pages.begin(), pages.end());  // tail first, as a sequence releases
  const Status st = s.pool->pages().release(s.owner, pages);
  KVPOOL_CHECK(st.ok());  // release() cannot drop these references
  for (const PageId p : pages) {
    if (--s.reserved_refs[p] == 0) s.reserved_refs.erase(p);
  }
  s.reserved_pages -= pages.size();
  s.reservations.erase(it);
  access_.refresh_held(s);
  return wire::Reply(wire::UnreserveReply{});
}

std::optional<wire::Error> Service::reserved_error(const SessionState& s,
                                                   std::span<const PageId> pages) const {
  if (s.reserved_refs.empty()) return std::nullopt;
  std::unordered_map<PageId, uint64_t> asked;  // of the reserved pages only
  for (size_t i = 0; i < pages.size(); ++i) {
    const auto it = s.reserved_refs.find(pages[i]);
    if (it == s.reserved_refs.end()) continue;
    if (s.pool->pages().held(s.owner, pages[i]) >= it->second + ++asked[pages[i]]) continue;
    return wire::Error{Status(Errc::not_held, static_cast<uint32_t>(i), pages[i]),
                       "release item " + std::to_string(i) + ": page " + std::to_string(pages[i]) +
                           " is held by a static reservation of this session (unreserve "
                           "releases it)"};
  }
  return std::nullopt;
}

}  // namespace kvpool::daemon

// Service: the remote tier's part of the calls (daemon/remote/remote_tier.h). A lookup that
// missed locally becomes a job for the remote fetch worker; its finish allocates the run found,
// and its copies go the way of every tier copy (run_tier_copies: on the loop when small, else
// the CopyWorker), behind the demotions that allocation caused; the pages are published before
// the reply. Publishes and first hits offer blocks for writing; the writes are background jobs
// of the remote store worker.
#include <algorithm>

#include "daemon/core/check.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

bool Service::plan_remote_fetch(SessionState& s, Namespace ns, const core::CallHints& hints,
                                wire::LookupReply& l, uint32_t hits,
                                std::span<const BlockHash> rest) {
  RemoteTier* remote = s.pool->remote();
  if (remote == nullptr || rest.empty()) return false;
  const uint32_t allowed = access_.new_pages_allowed(s);
  if (allowed == 0) return false;
  remote->name_tenant(ns, access_.tenant_name(s.tenant));
  std::shared_ptr<RemoteFetch> fetch = remote->plan_fetch(ns, rest, allowed);
  if (!fetch) return false;
  KVPOOL_CHECK(!call_job_);
  call_job_ = std::make_unique<CopyJob>();
  call_job_->worker = CopyJob::Worker::remote_fetch;
  call_job_->pool = s.pool;
  call_job_->work = [remote, fetch] { remote->fetch(*fetch); };
  call_job_->finish = [this, &s, ns, hints, hits, l = std::move(l),
                       fetch]() mutable -> wire::Result<wire::Reply> {
    return remote_fetched(s, ns, hints, std::move(l), hits, fetch);
  };
  return true;
}

wire::Result<wire::Reply> Service::remote_fetched(SessionState& s, Namespace ns,
                                                  const core::CallHints& hints, wire::LookupReply l,
                                                  uint32_t hits,
                                                  const std::shared_ptr<RemoteFetch>& f) {
  RemoteTier& remote = *s.pool->remote();
  RemoteFetch& fetch = *f;
  // The quotas may have moved while the fetch ran; a session whose connection closed meanwhile
  // gets nothing.
  const uint32_t n =
      s.attached && !s.closing ? std::min(fetch.found, access_.new_pages_allowed(s)) : 0;
  std::vector<PageId> pages(n);
  if (n != 0) {
    uint64_t growable = 0;
    bool admitted = false;
    if (!s.pool->alloc(s.owner, pages, hints, &growable, &admitted).ok()) pages.clear();
  }
  if (pages.empty()) {
    remote.finish_fetch(fetch, 0);
    return lookup_reply(s, std::move(l), hits);
  }
  access_.refresh_held(s);
  remote.plan_promote(s.pool->paged_kv(), fetch, pages, call_tier_.remote_runs);
  call_finish_ = [this, &s, ns, hits, l = std::move(l), pages = std::move(pages),
                  f](TierCopy& c) mutable -> wire::Result<wire::Reply> {
    PoolRuntime& pool = *s.pool;
    pool.finish_demotions(c);
    const auto count = static_cast<uint32_t>(pages.size());
    std::vector<PublishItem> items(count);
    std::vector<PublishResult> results(count);
    for (uint32_t i = 0; i < count; ++i)
      items[i] = PublishItem{pages[i], f->hashes[i]};
    Status st;
    if (c.remote_error.empty()) st = pool.pages().publish(s.owner, ns, items, results);
    if (!c.remote_error.empty() || !st.ok()) {
      // A failed copy, or a chain that names a block twice: nothing is published.
      log_event(LogLevel::error, "remote_tier_promote_failed",
                {kv("pool", pool.name()),
                 kv("error", c.remote_error.empty() ? st.message() : c.remote_error)});
      KVPOOL_CHECK(pool.pages().release(s.owner, pages).ok());
      pool.remote()->finish_fetch(*f, 0);
      access_.refresh_held(s);
      return lookup_reply(s, std::move(l), hits);
    }
    std::vector<PageId> spare;
    l.pages.resize(hits + count);
    l.tiers.resize(hits + count, wire::kTierRemote);
    for (uint32_t i = 0; i < count; ++i) {
      l.pages[hits + i] = results[i].page;
      // Another session published the block meanwhile: its page is the answer, ours goes.
      if (results[i].kind == PublishResult::Kind::duplicate) spare.push_back(pages[i]);
    }
    if (!spare.empty()) KVPOOL_CHECK(pool.pages().release(s.owner, spare).ok());
    pool.remote()->finish_fetch(*f, count);
    access_.refresh_held(s);
    return lookup_reply(s, std::move(l), hits + count);
  };
  return wire::Reply(wire::LookupReply{});  // call_finish_'s takes its place
}

void Service::offer_remote(SessionState& s, std::span<const PublishItem> items,
                           std::span<const PublishResult> results) {
  RemoteTier* remote = s.pool->remote();
  if (remote == nullptr) return;
  const Namespace ns = s.tenant + 1;
  remote->name_tenant(ns, access_.tenant_name(s.tenant));  // before any of these is evicted
  for (size_t i = 0; i < items.size() && i < results.size(); ++i) {
    if (results[i].kind == PublishResult::Kind::stored) {
      remote->offer(ns, items[i].hash, results[i].page, /*published=*/true);
    }
  }
}

void Service::offer_remote_hits(SessionState& s, std::span<const BlockHash> chain,
                                std::span<const PageId> pages) {
  RemoteTier* remote = s.pool->remote();
  if (remote == nullptr) return;
  const Namespace ns = s.tenant + 1;
  remote->name_tenant(ns, access_.tenant_name(s.tenant));
  for (size_t i = 0; i < pages.size() && i < chain.size(); ++i) {
    if (pages[i] != kNoPage) remote->offer(ns, chain[i], pages[i], /*published=*/false);
  }
}

std::unique_ptr<CopyJob> Service::take_remote_store() {
  for (const auto& pool : pools()) {
    RemoteTier* remote = pool->remote();
    if (remote == nullptr) continue;
    std::shared_ptr<RemoteStore> batch = remote->plan_store(pool->paged_kv());
    if (!batch) continue;
    auto job = std::make_unique<CopyJob>();
    job->worker = CopyJob::Worker::remote_store;
    job->pool = pool.get();
    job->work = [remote, batch] { remote->store(*batch); };
    job->done = [remote, batch] { remote->finish_store(*batch); };
    return job;
  }
  return nullptr;
}

}  // namespace kvpool::daemon

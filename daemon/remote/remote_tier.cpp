#include "daemon/remote/remote_tier.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/byte_units.h"
#include "daemon/core/check.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

remote::ClusterOptions cluster_options(const RemoteTierConfig& c) {
  remote::ClusterOptions o;
  for (const std::string& node : c.cluster) {
    auto addr = parse_node_address(node);
    KVPOOL_CHECK(addr.has_value());  // the parser refused anything else
    o.seeds.push_back(std::move(*addr));
  }
  o.timeout_ms = c.timeout_ms;
  o.retry_after_ms = kRemoteRetryAfterMs;
  return o;
}

uint64_t key_of(const std::string& key) {
  // The GhostSet's tag takes bits 47..62 and its bucket the low bits; bit 63 is left clear.
  return XXH3_64bits(key.data(), key.size()) & ~(uint64_t{1} << 63);
}

}  // namespace

wire::Result<std::unique_ptr<RemoteTier>> RemoteTier::create(core::PagePool& pool,
                                                             const PoolConfig& pc, int device,
                                                             core::IndexObserver* events) {
  KVPOOL_CHECK(pc.remote_tier.has_value());
  const uint64_t slot_bytes =
      remote::kValueHeaderBytes + page_data_bytes(pc.geometry) + page_scale_bytes(pc.geometry);
  const uint64_t bytes = uint64_t{pc.remote_tier->staging_pages} * slot_bytes;
  auto fetch = make_tier_memory(device, bytes, pc.name + " remote tier (reads)");
  if (!fetch.ok()) return fetch.error();
  auto store = make_tier_memory(device, bytes, pc.name + " remote tier (writes)");
  if (!store.ok()) return store.error();
  return std::unique_ptr<RemoteTier>(
      new RemoteTier(pool, pc, std::move(fetch.value()), std::move(store.value()), events));
}

RemoteTier::RemoteTier(core::PagePool& pool, const PoolConfig& pc,
                       std::unique_ptr<TierMemory> fetch_memory,
                       std::unique_ptr<TierMemory> store_memory, core::IndexObserver* events)
    : pool_(pool),
      owner_(pool.open_owner()),
      config_(*pc.remote_tier),
      label_(pc.name),
      group_(pc.model.empty() ? "" : pc.model_groups[pc.group]),
      geometry_(pc.geometry),
      layout_(pc.layout),
      fingerprint_(remote::remote_fingerprint(pc.geometry, pc.layout, pc.hash_scheme)),
      payload_bytes_(page_data_bytes(pc.geometry) + page_scale_bytes(pc.geometry)),
      slot_bytes_(remote::kValueHeaderBytes + payload_bytes_),
      fetch_memory_(std::move(fetch_memory)),
      store_memory_(std::move(store_memory)),
      written_(uint64_t{1} << 20),
      fetch_client_(std::make_unique<remote::ClusterClient>(cluster_options(config_))),
      store_client_(std::make_unique<remote::ClusterClient>(cluster_options(config_))),
      events_(events) {
  for (uint32_t i = config_.staging_pages; i-- > 0;) {
    free_fetch_.push_back(i);
    free_store_.push_back(i);
  }
  if (config_.write == RemoteTierConfig::Write::on_demote) {
    if (config_.admit == RemoteTierConfig::Admit::reused)
      reused_ = core::GhostSet(uint64_t{1} << 20);
    next_ = pool_.observer();
    pool_.set_observer(this);
  }
}

RemoteTier::~RemoteTier() {
  if (config_.write == RemoteTierConfig::Write::on_demote) pool_.set_observer(next_);
  (void)pool_.close_owner(owner_);
}

void RemoteTier::name_tenant(Namespace ns, const std::string& tenant) {
  KVPOOL_CHECK(ns != 0);
  if (tenants_.size() < ns) tenants_.resize(ns);
  if (tenants_[ns - 1].empty()) tenants_[ns - 1] = tenant;
}

void RemoteTier::stored(Namespace ns, const BlockHash& hash, PageId page) {
  if (next_ != nullptr) next_->stored(ns, hash, page);
}

void RemoteTier::removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) {
  if (why == Removal::evicted && page != kNoPage) evicted_.push_back({ns, hash, page});
  if (next_ != nullptr) next_->removed(ns, hash, page, why);
}

void RemoteTier::host_stored(Namespace ns, const BlockHash& hash) {
  if (next_ != nullptr) next_->host_stored(ns, hash);
}

void RemoteTier::host_removed(Namespace ns, const BlockHash& hash, bool promoting) {
  if (next_ != nullptr) next_->host_removed(ns, hash, promoting);
}

std::string RemoteTier::key(Namespace ns, const BlockHash& hash) const {
  if (ns == 0 || ns > tenants_.size() || tenants_[ns - 1].empty()) return {};
  const std::string& tenant = tenants_[ns - 1];
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(fingerprint_));
  if (group_.empty()) return config_.key_namespace + ":" + tenant + ":" + fp + ":" + to_hex(hash);
  return config_.key_namespace + ":" + tenant + ":" + group_ + ":" + fp + ":" + to_hex(hash);
}

bool RemoteTier::reachable() const {
  return LatencyRecorder::now_ns() >= down_until_ns_;
}

void RemoteTier::note_reachable(bool reachable) {
  if (!reachable) {
    down_until_ns_ = LatencyRecorder::now_ns() + uint64_t{kRemoteRetryAfterMs} * 1'000'000;
    if (!logged_down_) {
      logged_down_ = true;
      log_event(LogLevel::warn, "remote_tier_unreachable",
                {kv("pool", label_), kv("error", fetch_client_->view().last_error),
                 kv("retry_ms", kRemoteRetryAfterMs)});
    }
  } else if (logged_down_) {
    logged_down_ = false;
    log_event(LogLevel::info, "remote_tier_reachable", {kv("pool", label_)});
  }
}

std::unique_ptr<RemoteFetch> RemoteTier::plan_fetch(Namespace ns, std::span<const BlockHash> chain,
                                                    uint32_t max) {
  if (!reachable()) {
    ++stats_.skipped_down;
    return nullptr;
  }
  const size_t n =
      std::min({chain.size(), size_t{max}, size_t{config_.batch_pages}, free_fetch_.size()});
  if (n == 0 || key(ns, chain[0]).empty()) return nullptr;
  auto f = std::make_unique<RemoteFetch>();
  f->space = ns;
  for (size_t i = 0; i < n; ++i) {
    f->keys.push_back(key(ns, chain[i]));
    f->hashes.push_back(chain[i]);
    f->slots.push_back(free_fetch_.back());
    free_fetch_.pop_back();
  }
  ++stats_.lookups;
  return f;
}

std::unique_ptr<RemoteFetch> RemoteTier::plan_fetch_slots(Namespace ns, uint32_t max) {
  if (!reachable()) {
    ++stats_.skipped_down;
    return nullptr;
  }
  const size_t n = std::min({size_t{max}, size_t{config_.batch_pages}, free_fetch_.size()});
  if (n == 0) return nullptr;
  auto f = std::make_unique<RemoteFetch>();
  f->space = ns;
  for (size_t i = 0; i < n; ++i) {
    f->slots.push_back(free_fetch_.back());
    free_fetch_.pop_back();
  }
  ++stats_.lookups;
  return f;
}

void RemoteTier::fetch(RemoteFetch& f) {
  KVPOOL_CHECK(f.keys.size() <= f.slots.size() && f.keys.size() == f.hashes.size());
  const uint64_t t0 = LatencyRecorder::now_ns();
  std::vector<uint8_t> ok(f.keys.size(), 0);
  f.batch = fetch_client_->get(
      f.keys,
      [&](size_t i, std::span<const std::byte> value) {
        const remote::ValueFault fault =
            remote::check_value(value, fingerprint_, payload_bytes_, f.hashes[i]);
        ++f.faults[static_cast<size_t>(fault)];
        if (fault != remote::ValueFault::none) return;
        std::memcpy(fetch_memory_->base() + uint64_t{f.slots[i]} * slot_bytes_, value.data(),
                    value.size());
        ok[i] = 1;
      },
      &f.absent);
  f.found = static_cast<uint32_t>(std::find(ok.begin(), ok.end(), 0) - ok.begin());
  f.valid = std::move(ok);
  f.ns = LatencyRecorder::now_ns() - t0;
}

namespace {
std::vector<uint32_t> first_keys(size_t n) {
  std::vector<uint32_t> keys(n);
  for (size_t i = 0; i < n; ++i)
    keys[i] = static_cast<uint32_t>(i);
  return keys;
}
}  // namespace

void RemoteTier::plan_promote(const kernels::PagedKv& kv, const RemoteFetch& f,
                              std::span<const PageId> pages, std::vector<ByteRun>& runs) const {
  KVPOOL_CHECK(pages.size() <= f.found);
  plan_promote(kv, f, first_keys(pages.size()), pages, runs);
}

void RemoteTier::plan_promote(const kernels::PagedKv& kv, const RemoteFetch& f,
                              std::span<const uint32_t> keys, std::span<const PageId> pages,
                              std::vector<ByteRun>& runs) const {
  KVPOOL_CHECK(keys.size() == pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    KVPOOL_CHECK(keys[i] < f.valid.size() && f.valid[keys[i]] != 0);
    std::byte* value = fetch_memory_->base() + uint64_t{f.slots[keys[i]]} * slot_bytes_;
    append_page_runs(kv, pages[i], value + remote::kValueHeaderBytes, /*to_packed=*/false, runs);
  }
}

void RemoteTier::finish_fetch(RemoteFetch& f, uint32_t promoted) {
  finish_fetch(f, first_keys(promoted));
}

void RemoteTier::cancel_fetch(RemoteFetch& f) {
  free_fetch_.insert(free_fetch_.end(), f.slots.begin(), f.slots.end());
  f.slots.clear();
  --stats_.lookups;  // plan_fetch counted it
}

void RemoteTier::finish_fetch(RemoteFetch& f, std::span<const uint32_t> promoted_keys) {
  const auto promoted = static_cast<uint32_t>(promoted_keys.size());
  free_fetch_.insert(free_fetch_.end(), f.slots.begin(), f.slots.end());
  f.slots.clear();
  ++stats_.fetch_batches;
  stats_.fetch_ns += f.ns;
  stats_.fetch_failed += f.batch.failed;
  const uint32_t rejected = f.faults[1] + f.faults[2] + f.faults[3] + f.faults[4];
  if (rejected != 0) {
    stats_.rejected += rejected;
    log_event(LogLevel::warn, "remote_value_rejected",
              {kv("pool", label_), kv("values", rejected), kv("malformed", f.faults[1]),
               kv("geometry", f.faults[2]), kv("block", f.faults[3]), kv("checksum", f.faults[4])});
  }
  stats_.hit_blocks += promoted;
  stats_.fetch_bytes += uint64_t{promoted} * slot_bytes_;
  if (promoted == 0) ++stats_.miss_lookups;
  // What came from the cluster is there already: not written back.
  for (const uint32_t k : promoted_keys)
    written_.insert(key_of(f.keys[k]));
  // A key this daemon wrote (or fetched) lately that has no value now expired or was evicted
  // there: said so, and it may be written again.
  for (size_t i = 0; i < f.absent.size(); ++i) {
    if (f.absent[i] != 0 && written_.take(key_of(f.keys[i])) && events_ != nullptr) {
      events_->remote_removed(f.space, f.hashes[i]);
    }
  }
  expire_announced();
  note_reachable(!f.batch.unreachable);
}

void RemoteTier::expire_announced() {
  if (announced_.empty()) return;
  // Past this many, the oldest are said to be gone early: a router forgets a block it might
  // have fetched, never keeps one that is gone for longer than its expiry.
  constexpr size_t kMaxAnnounced = size_t{1} << 20;
  const uint64_t now = LatencyRecorder::now_ns();
  while (!announced_.empty() &&
         (announced_.front().expires_ns <= now || announced_.size() > kMaxAnnounced)) {
    const Announced& a = announced_.front();
    events_->remote_removed(a.ns, a.hash);
    // Gone from the cluster (or about to be): it may be written again.
    if (a.expires_ns <= now) (void)written_.take(key_of(key(a.ns, a.hash)));
    announced_.pop_front();
  }
}

void RemoteTier::offer(Namespace ns, const BlockHash& hash, PageId page, bool published) {
  if (config_.write == RemoteTierConfig::Write::off) return;
  if (published != (config_.admit == RemoteTierConfig::Admit::all)) return;
  if (config_.write == RemoteTierConfig::Write::on_demote) {
    // Written when it leaves the device, if it does; admit reused: only a block hit by then.
    if (!published) reused_.insert(key_of(key(ns, hash)));
    return;
  }
  std::string k = key(ns, hash);
  if (k.empty()) return;
  const uint64_t tag = key_of(k);
  if (written_.contains(tag)) return;
  // The pages held for writes stay under an eighth of the pool, so that a slow or full cluster
  // never leaves the workers' allocs without pages.
  const uint32_t hold_limit = std::max(1u, pool_.num_pages() / 8);
  if (offered_.size() >= free_store_.size() || held_ >= hold_limit || !reachable()) {
    ++stats_.store_skipped;
    return;
  }
  if (!pool_.share(owner_, page).ok()) return;  // no one holds it: its bytes may be reused
  written_.insert(tag);
  ++held_;
  offered_.push_back({std::move(k), ns, hash, page});
}

void RemoteTier::plan_demote(const kernels::PagedKv& kv, TierCopy& tier) {
  if (evicted_.empty()) return;
  if (tier.remote_down == 0) tier.remote_down = next_down_++;
  std::vector<Staged>& batch = copying_[tier.remote_down];
  const bool up = reachable();
  for (const Eviction& e : evicted_) {
    std::string k = key(e.ns, e.hash);
    if (k.empty()) {
      ++stats_.store_skipped;
      continue;
    }
    const uint64_t tag = key_of(k);
    if (written_.contains(tag)) continue;  // written or fetched here lately: the cluster has it
    if (config_.admit == RemoteTierConfig::Admit::reused && !reused_.take(tag)) continue;
    if (free_store_.empty() || !up) {
      ++stats_.store_skipped;
      continue;
    }
    const uint32_t slot = free_store_.back();
    free_store_.pop_back();
    append_page_runs(kv, e.page, store_slot(slot) + remote::kValueHeaderBytes,
                     /*to_packed=*/true, tier.remote_down_runs);
    written_.insert(tag);
    batch.push_back({std::move(k), e.ns, e.hash, slot});
  }
  evicted_.clear();
  if (batch.empty()) {
    copying_.erase(tier.remote_down);
    tier.remote_down = 0;
  }
}

std::string RemoteTier::copy_down(std::span<const ByteRun> runs) {
  const std::lock_guard lock(store_copy_mutex_);
  return store_memory_->copy(runs);
}

void RemoteTier::finish_demote(TierCopy& tier) {
  if (!tier.remote_held.empty()) {
    KVPOOL_CHECK(pool_.release(owner_, tier.remote_held).ok());
    tier.remote_held.clear();
  }
  if (tier.remote_down == 0) return;
  auto node = copying_.extract(tier.remote_down);
  KVPOOL_CHECK(!node.empty());
  tier.remote_down = 0;
  std::vector<Staged>& batch = node.mapped();
  if (!tier.remote_down_error.empty()) {
    log_event(LogLevel::error, "remote_tier_copy_failed",
              {kv("pool", label_), kv("copy", "demote"), kv("error", tier.remote_down_error)});
    stats_.store_failed += batch.size();
    for (const Staged& st : batch) {
      free_store_.push_back(st.slot);
      (void)written_.take(key_of(st.key));
    }
    return;
  }
  stats_.demoted += batch.size();
  for (Staged& st : batch)
    staged_.push_back(std::move(st));
}

std::unique_ptr<RemoteStore> RemoteTier::plan_store(const kernels::PagedKv& kv) {
  expire_announced();  // asked after every call: expiries are announced without remote traffic
  if (offered_.empty() && staged_.empty()) return nullptr;
  auto s = std::make_unique<RemoteStore>();
  // Staged values first: their slots are taken while they wait, no page is.
  const size_t staged = std::min(staged_.size(), size_t{config_.batch_pages});
  for (size_t i = 0; i < staged; ++i) {
    s->keys.push_back(std::move(staged_[i].key));
    s->namespaces.push_back(staged_[i].ns);
    s->hashes.push_back(staged_[i].hash);
    s->slots.push_back(staged_[i].slot);
  }
  staged_.erase(staged_.begin(), staged_.begin() + static_cast<ptrdiff_t>(staged));
  const size_t n = std::min(offered_.size(), size_t{config_.batch_pages} - staged);
  for (size_t i = 0; i < n; ++i) {
    Offer& o = offered_[i];
    const uint32_t slot = free_store_.back();
    free_store_.pop_back();
    append_page_runs(kv, o.page, store_slot(slot) + remote::kValueHeaderBytes,
                     /*to_packed=*/true, s->runs);
    s->keys.push_back(std::move(o.key));
    s->namespaces.push_back(o.ns);
    s->hashes.push_back(o.hash);
    s->pages.push_back(o.page);
    s->slots.push_back(slot);
  }
  offered_.erase(offered_.begin(), offered_.begin() + static_cast<ptrdiff_t>(n));
  return s;
}

void RemoteTier::store(RemoteStore& s) {
  const uint64_t t0 = LatencyRecorder::now_ns();
  if (!s.runs.empty()) s.copy_error = copy_down(s.runs);
  if (s.copy_error.empty()) {
    std::vector<std::span<const std::byte>> values;
    values.reserve(s.slots.size());
    for (size_t i = 0; i < s.slots.size(); ++i) {
      const std::span value(store_slot(s.slots[i]), slot_bytes_);
      remote::write_value_header(value, fingerprint_, geometry_, layout_, s.hashes[i]);
      values.push_back(value);
    }
    s.batch = store_client_->set(s.keys, values, config_.ttl_s, &s.written);
  }
  s.ns = LatencyRecorder::now_ns() - t0;
}

void RemoteTier::finish_store(RemoteStore& s) {
  KVPOOL_CHECK(pool_.release(owner_, s.pages).ok());
  held_ -= static_cast<uint32_t>(s.pages.size());
  free_store_.insert(free_store_.end(), s.slots.begin(), s.slots.end());
  ++stats_.store_batches;
  stats_.store_ns += s.ns;
  // A block not written may be offered again (its next publish, or hit). One written is
  // announced (KV events, medium REMOTE) until its expiry.
  const uint64_t expires =
      config_.ttl_s == 0 ? UINT64_MAX
                         : LatencyRecorder::now_ns() + uint64_t{config_.ttl_s} * 1'000'000'000;
  for (size_t i = 0; i < s.keys.size(); ++i) {
    if (i >= s.written.size() || s.written[i] == 0) {
      (void)written_.take(key_of(s.keys[i]));
    } else if (events_ != nullptr) {
      events_->remote_stored(s.namespaces[i], s.hashes[i]);
      announced_.push_back({expires, s.namespaces[i], s.hashes[i]});
    }
  }
  expire_announced();
  if (!s.copy_error.empty()) {
    stats_.store_failed += s.keys.size();
    log_event(LogLevel::error, "remote_tier_copy_failed",
              {kv("pool", label_), kv("error", s.copy_error)});
    return;
  }
  stats_.stored += s.batch.answered;
  stats_.store_failed += s.batch.failed;
  stats_.store_bytes += uint64_t{s.batch.answered} * slot_bytes_;
  // Only reads decide that the cluster is unreachable: a write batch whose megabytes did not go
  // out within timeout_ms (a busy link, a busy machine) says nothing of a lookup's few GETs.
}

}  // namespace kvpool::daemon

// Service: what kvpoold does for its sessions, without the sockets: it turns each decoded request
// of a session into a reply.
//
// It holds the pools (PoolSet, daemon/pool/), who may do what (Access: tenants, session limits,
// quotas, pins, the admin check) and dispatches each request to its handler. The Server does the
// I/O and calls it from the one event-loop thread. The Service does no socket I/O, so tests
// drive it directly; memory work it cannot finish in about a millisecond (copies and host-tier
// moves above inline_copy_bytes, making and releasing elastic segments) it hands out as CopyJobs
// for the Server's copy thread, and the memcpy of smaller ones runs inside handle().
//
// Namespaces: a session's namespace is the index of its tenant (Access), never the client's say,
// so two tenants sharing a pool never hit, probe or time each other's prefixes (DESIGN §5).
//
// Copies: copy is for pages the session holds, into destinations that are not published (a
// published page's bytes are shared and fixed; DESIGN §3), no page twice, at most
// wire::kMaxCopyBytes per request; the daemon copies with its pool memory's PageCopier. A copy of
// more than inline_copy_bytes() (or any copy while another of its pool is running) is not run by
// handle(): it returns a CopyJob for the caller to run off the event loop, and finish_copy()
// answers it. Until then the session's pages must stay held (the Server reads nothing more from
// that connection and defers its close).
//
// Host tier: the copies a call's evictions and promotions need (host_tier_store.h) follow the
// same rule: more than inline_copy_bytes(), or any while a job of the pool is in flight, go to
// the caller as a CopyJob, and the call's reply (a lookup's promoted pages are published only
// then) waits for them. Calls that move no tier bytes answer at once meanwhile.
//
// Hints: alloc, retain, lookup and publish may carry PageHints, limited by Access. Pins hold
// pages, not sessions: they outlive the session that set them, until they expire or an operator
// flushes.
//
// Admin: evict, flush, resize and reload change what every tenant gets, so they need root or
// membership of the config's admin_group. sessions shows an admin every session of the pool and
// anyone else the sessions of its own tenant.
//
// Operations, metrics and events (service_ops.cpp): prefixes lists the most-hit indexed blocks
// and subscribe follows the index's events, both scoped like lookups (an admin sees every
// tenant, anyone else only its own); reload runs the handler kvpoold installed (the SIGHUP path)
// and is admin only; snapshot answers with the stats snapshot the daemon also publishes in
// shared memory. handle() times itself into the "service" latency histograms.
//
// Thread-safety: none; one thread (the event loop) owns a Service.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/stats_layout.h"
#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/pool/pool_set.h"
#include "daemon/service/access.h"
#include "daemon/service/copy_job.h"
#include "daemon/service/session.h"
#include "daemon/telemetry/events.h"
#include "daemon/telemetry/kv_event_encoder.h"
#include "daemon/telemetry/latency.h"

namespace kvpool::daemon {

struct GroupFetch;  // service_groups_remote.cpp

class Service {
 public:
  // Copies up to this many bytes run inside handle(), on the event loop (~0.1 ms of memcpy).
  static constexpr uint64_t kDefaultInlineCopyBytes = uint64_t{1} << 20;

  // Builds the pools of `config` on `backend`. Errors name the pool and the cause.
  static wire::Result<std::unique_ptr<Service>> create(const Config& config,
                                                       std::unique_ptr<MemoryBackend> backend);

  // A new connection. Fails (too_many_sessions, permission_denied) when it must be refused.
  wire::Result<std::unique_ptr<SessionState>> open_session(const PeerCredentials& peer);
  // The connection is gone: everything the session holds is released (published pages stay
  // cached, the rest become free).
  void close_session(SessionState& session);

  // Handles one request, appending the whole reply frame to `out`. When the reply must carry
  // file descriptors (hello on a descriptor backend), *fds_to_pass is set to them (owned by the
  // pool, which outlives every session); otherwise it is left empty.
  // When `deferred` is given, work too large for the event loop is not run: *deferred gets the
  // job and nothing is appended; the caller runs it and calls finish_copy. Without `deferred`
  // everything runs here.
  void handle(SessionState& session, uint32_t request_id, const wire::Request& request,
              std::vector<std::byte>& out, std::span<const int>* fds_to_pass,
              std::unique_ptr<CopyJob>* deferred = nullptr);
  // Appends the reply of a deferred job that has run; or, for a lookup's remote fetch whose
  // promotion's copies are too large for the loop, returns them as the next job to run (its own
  // finish_copy then answers) and appends nothing.
  std::unique_ptr<CopyJob> finish_copy(CopyJob& job, std::vector<std::byte>& out);
  // The daemon's own work off the loop (segments made ahead of need, shrunk ones given back),
  // one job at a time until null; the caller runs each and then calls finish_background.
  std::unique_ptr<CopyJob> take_background_job();
  void finish_background(CopyJob& job);

  const std::vector<std::unique_ptr<PoolRuntime>>& pools() const { return pools_->pools(); }
  const std::vector<std::string>& tenants() const { return access_.tenants(); }
  uint32_t session_count() const { return access_.session_count(); }
  const MemoryBackend& backend() const { return *backend_; }
  const Config& config() const { return config_; }
  // Copies up to this many bytes run on the event loop (kvpoold --inline-copy-bytes).
  uint64_t inline_copy_bytes() const { return inline_copy_bytes_; }
  void set_inline_copy_bytes(uint64_t bytes) { inline_copy_bytes_ = bytes; }

  // Reload: applies what can change while sessions run (limits, tenants, default tenant, log
  // level, a pool's eviction policy, share_between_tenants and grow_ahead) and returns the
  // dotted keys that changed but need a restart (socket.*, backend, device, max_segment_bytes,
  // memory_budget, pools, metrics, events), which keep their running values. Existing sessions
  // keep their tenant.
  std::vector<std::string> apply_live(const Config& next);

  // What kvpoold's reload does (re-read the file, apply_live, log, notify systemd).
  void set_reload_handler(std::function<wire::ReloadReply()> handler) {
    reload_handler_ = std::move(handler);
  }
  void note_reload(bool applied);
  // True once after an evict, flush, resize or reload changed what the stats show (the stats
  // publisher then publishes before the reply leaves).
  bool take_operator_change() {
    const bool op = std::exchange(operator_change_, false);
    const bool resized = pools_->take_stats_change();
    return op || resized;
  }
  // True once after a pool's segments changed: the Server then tells its other sessions.
  bool take_pool_change() { return pools_->take_pool_change(); }
  const EventLog& events() const { return *events_; }
  // The KV event publisher's counters, shown in the stats snapshot (null = none). Not owned.
  void set_kv_event_counters(const KvEventCounters* counters) { kv_counters_ = counters; }
  LatencyRecorder& request_latency() { return request_latency_; }
  ConnectionStats& connection_stats() { return connection_stats_; }
  // The daemon-wide stats snapshot: counters and pages by state per pool, sessions, events,
  // latency histograms.
  void fill_snapshot(stats::Snapshot& out) const;
  // The daemon's own figures (the daemon counter table's rows), as the snapshot and the stats
  // reply show them.
  void fill_daemon(stats::DaemonStats& d) const;
  // For a subscribed session: appends to `batch` up to `max` events it has not seen yet (a gap
  // marker first when it fell behind the ring). Empty when there is nothing new.
  void collect_events(SessionState& s, size_t max, wire::EventBatch& batch);

 private:
  Service(const Config& config, std::unique_ptr<MemoryBackend> backend);
  static wire::Result<std::unique_ptr<Service>> create_unguarded(
      const Config& config, std::unique_ptr<MemoryBackend> backend);

  // What a handler may need of its call besides the session and the request.
  struct Call {
    uint32_t request_id = 0;
    std::span<const int>* fds = nullptr;  // descriptors the reply carries (hello, segments)
    uint64_t started_ns = 0;
    std::unique_ptr<CopyJob>* deferred = nullptr;  // see handle()
  };
  // The handlers, one per row of the opcode table (common/wire/protocol.h), named as the row:
  // service.cpp, copies in service_copy.cpp, operations, metrics, events and elastic pools in
  // service_ops.cpp. handle() has checked the table's columns (attached, admin) before.
#define KVPOOL_SERVICE_HANDLER(name, number, Req, Rep, ...) \
  wire::Result<wire::Reply> name(SessionState& s, const wire::Req& r, Call& call);
  KVPOOL_WIRE_OPCODES(KVPOOL_SERVICE_HANDLER)
#undef KVPOOL_SERVICE_HANDLER
  // The request's handler.
  wire::Result<wire::Reply> dispatch(SessionState& s, const wire::Request& request, Call& call);
  // After a call: the host-tier copies its evictions (and a lookup's promotion) need, run here
  // or handed out through `deferred` (then true: the reply waits for them).
  bool run_tier_copies(SessionState& s, uint32_t request_id, wire::Opcode op, uint64_t started_ns,
                       wire::Result<wire::Reply>& reply, std::unique_ptr<CopyJob>* deferred);
  // hello's part for a group of a hybrid model: joins the session to `link` (0: a new set).
  wire::Result<bool> join_model(SessionState& s, PoolRuntime& pool, uint64_t link);
  // What one lookup_groups may copy up from the groups' host tiers, on the loop: ~8 ms at the
  // 8 GB/s a CPU copies pinned memory (bench/RESULTS.md, "Host tier").
  static constexpr uint64_t kMaxGroupPromoteBytes = uint64_t{64} << 20;
  // Per group of a hybrid model, a byte per chain position (an empty vector: all 0).
  using GroupMarks = std::vector<std::vector<uint8_t>>;
  // The longest hit of a hybrid model's chain every group can serve now (no references taken),
  // at most `upper` blocks: from its device tier, its host tier where a promotion can read the
  // block now, or (fetched[g][i] != 0) what the group's remote tier fetched, copying up at most
  // promote_left bytes in all.
  uint32_t group_hit(Namespace ns, std::span<const BlockHash> chain,
                     const std::vector<PoolRuntime*>& groups, uint32_t upper, uint64_t promote_left,
                     const GroupMarks* fetched = nullptr) const;
  // lookup_groups' error when a group of s's model has no session linked to s.
  std::optional<wire::Error> check_linked(const SessionState& s,
                                          const std::vector<PoolRuntime*>& groups) const;
  // lookup_groups' answer from the groups' device and host tiers (hints: per group), copying
  // up at most promote_left bytes; came_from[g][i], when not 0, is the tier block i of group g
  // came up from before the call (kTierRemote); first_hit: group_hit's answer for the whole
  // chain and promote_left when the caller has it, else kHitUnknown.
  static constexpr uint32_t kHitUnknown = UINT32_MAX;
  wire::Result<wire::Reply> answer_groups(SessionState& s, std::span<const BlockHash> chain,
                                          const std::vector<core::CallHints>& hints,
                                          GroupMarks came_from, uint64_t promote_left,
                                          uint32_t first_hit = kHitUnknown);
  // A hybrid model's remote tiers (service_groups_remote.cpp). When the groups' local tiers
  // serve `local` blocks, fewer than the chain, each group's fetch of the blocks a longer hit
  // would need that it lacks, made the call's job (call_job_); false when nothing is asked.
  bool plan_group_fetch(SessionState& s, const std::vector<PoolRuntime*>& groups,
                        std::span<const BlockHash> chain, const std::vector<core::CallHints>& hints,
                        uint32_t local);
  // Once fetched, on the loop: the blocks the longest hit needs copied up into each group's
  // pool and published, then answer_groups.
  wire::Result<wire::Reply> groups_fetched(SessionState& s, GroupFetch& f);
  // lookup_groups' promotion in one group: the host tier's run at the start of `rest` into
  // pages the group's session holds (written to out), copied on the loop, within promote_left
  // bytes (reduced by what came up); how many blocks came up.
  uint32_t promote_group(PoolRuntime& pool, SessionState& gs, Namespace ns,
                         std::span<const BlockHash> rest, std::span<PageId> out,
                         uint64_t& promote_left);
  // The error for a release that would drop a reference a static reservation holds.
  std::optional<wire::Error> reserved_error(const SessionState& s,
                                            std::span<const PageId> pages) const;
  // A pool's figures that come from its sessions (sessions, reserved pages).
  void add_session_figures(const PoolRuntime& pool, stats::PoolStats& p) const;
  // lookup_groups' hints, set on the pages of its answer; on a refusal everything the answer
  // holds is released and the error returned.
  std::optional<wire::Error> apply_group_hints(SessionState& s,
                                               const std::vector<PoolRuntime*>& groups,
                                               const std::vector<core::CallHints>& hints,
                                               wire::GroupLookupReply& reply);
  // The remote tier (service_remote.cpp). A lookup that missed locally at `hits` (rest: the
  // chain after): its fetch, made the call's job (call_job_); false when the pool has no remote
  // tier or the tier cannot be asked now.
  bool plan_remote_fetch(SessionState& s, Namespace ns, const core::CallHints& hints,
                         wire::LookupReply& l, uint32_t hits, std::span<const BlockHash> rest);
  // Once fetched, on the loop: the run found is allocated and its copies planned (call_tier_,
  // call_finish_: handle() or finish_copy runs them), or the reply with the local hits.
  wire::Result<wire::Reply> remote_fetched(SessionState& s, Namespace ns,
                                           const core::CallHints& hints, wire::LookupReply l,
                                           uint32_t hits, const std::shared_ptr<RemoteFetch>& f);
  // The blocks a publish stored, or a lookup hit, offered to the pool's remote tier.
  void offer_remote(SessionState& s, std::span<const PublishItem> items,
                    std::span<const PublishResult> results);
  void offer_remote_hits(SessionState& s, std::span<const BlockHash> chain,
                         std::span<const PageId> pages);
  // The remote tiers' next batch of writes, as a background job (null: none waiting).
  std::unique_ptr<CopyJob> take_remote_store();
  // The job the current call made for itself (call_job_), addressed to its caller.
  std::unique_ptr<CopyJob> take_call_job(SessionState& s, uint32_t request_id, wire::Opcode op,
                                         uint64_t started_ns);
  // A lookup's reply with its first `hits` pages, counted in the prefix stats.
  wire::Result<wire::Reply> lookup_reply(SessionState& s, wire::LookupReply l, uint32_t hits);
  // Appends a call's reply (after a pool_changed notice when the session's segment list is old).
  void encode_answer(SessionState& s, uint32_t request_id, wire::Opcode op,
                     const wire::Result<wire::Reply>& reply, std::vector<std::byte>& out);
  // Validates a copy; the job to run, or the error to answer with (service_copy.cpp).
  wire::Result<std::unique_ptr<CopyJob>> prepare_copy(SessionState& s, uint32_t request_id,
                                                      const wire::CopyRequest& r);
  // The reply to a copy that has run.
  wire::Result<wire::Reply> copy_reply(const CopyJob& job) const;
  // An admin resize upwards: segments planned here, made off the loop (call_job_).
  wire::Result<wire::Reply> resize_up(SessionState& s, PoolRuntime& pool, uint32_t target);

  // Declared first: access_ and the pools read it.
  Config config_;
  std::unique_ptr<MemoryBackend> backend_;
  std::unique_ptr<EventLog> events_;
  std::unique_ptr<PoolSet> pools_;
  Access access_{config_};
  uint64_t inline_copy_bytes_ = kDefaultInlineCopyBytes;

  LatencyRecorder service_latency_{true};
  LatencyRecorder request_latency_{true};
  std::function<wire::ReloadReply()> reload_handler_;
  uint64_t start_unix_ms_ = 0;
  // The current call's host-tier copies and, for a lookup that promotes, the rest of its reply.
  TierCopy call_tier_;
  std::function<wire::Result<wire::Reply>(TierCopy&)> call_finish_;
  // A job the current call made for itself (an admin resize's segments, a remote fetch);
  // handle() hands it out.
  std::unique_ptr<CopyJob> call_job_;
  uint32_t subscribers_ = 0;
  uint64_t reloads_ = 0;
  uint64_t reload_failures_ = 0;
  ConnectionStats connection_stats_;
  bool operator_change_ = false;
  const KvEventCounters* kv_counters_ = nullptr;
};

}  // namespace kvpool::daemon

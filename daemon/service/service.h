// Service: what kvpoold does for its sessions, without the sockets.
//
// It owns the pools (a PagePool and a memory segment each), maps peers to tenants, enforces the
// limits of the config and turns each decoded request of a session into a reply. The Server does
// the I/O and calls it from the one event-loop thread. The Service does no socket I/O, so tests
// drive it directly; memory work it cannot finish in about a millisecond (copies and host-tier
// moves above inline_copy_bytes, making and releasing elastic segments) it hands out as CopyJobs
// for the Server's copy thread, and the memcpy of smaller ones runs inside handle().
//
// Namespaces: a session's namespace is the index of its tenant, derived here from the peer's
// credentials (SO_PEERCRED) and the config, never from the client. Two tenants sharing a pool
// therefore never hit, probe or time each other's prefixes (DESIGN §5).
//
// Tenants: a tenant's index (and so its namespace, index + 1) is given the first time its name is
// seen and never changes while the daemon runs, across reloads too: a session keeps the namespace
// it attached with, and a tenant that leaves the config and comes back finds its cache again.
//
// Sessions: open_session refuses a peer (too_many_sessions) when limits.max_sessions sessions or
// limits.max_sessions_per_uid sessions of its uid are open, unless the peer is an admin (root or
// admin_group), who may open kAdminReservedSessions more, so no flood locks an operator out.
//
// Quotas: every call that can hand a session a page it does not hold counts against
// max_pages_per_session and max_pages_per_tenant (distinct pages held): alloc is refused with
// quota_exceeded when the request would pass them; a lookup's prefix ends (as at a miss) where a
// further hit would; a publish whose duplicates would pass them is refused. retain and copy only
// touch pages the session already holds.
//
// Tenants and pools: a tenant may attach to the pools its entry lists; the implicit default
// tenant to the pools no entry lists (config.h); an admin to every pool. The config refuses two
// tenants on one pool unless the pool says share_between_tenants; such pools are named in the log
// at start.
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
// Hints: alloc, retain, lookup and publish may carry PageHints. A pin's TTL must not pass
// limits.max_pin_ttl_ms; pins are charged to the session's tenant, at most
// limits.max_pinned_pages_per_tenant pages per pool (default a quarter of it), so no tenant's pins
// can starve a pool. Pins hold pages, not sessions: they outlive the session that set them, until
// they expire or an operator flushes.
//
// Admin: evict, flush and reload change what every tenant gets, so they need root or membership
// (primary or supplementary) of the config's admin_group. sessions shows an admin every session
// of the pool and anyone else the sessions of its own tenant.
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
#include "daemon/core/page_pool.h"
#include "daemon/memory/host_tier_store.h"
#include "daemon/memory/memory_backend.h"
#include "daemon/telemetry/events.h"
#include "daemon/telemetry/index_events.h"
#include "daemon/telemetry/kv_event_encoder.h"
#include "daemon/telemetry/latency.h"
#include "daemon/telemetry/prefix_stats.h"

namespace kvpool::daemon {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct Pool {
  PoolConfig config;
  wire::PoolInfo info;
  std::unique_ptr<PoolMemory> memory;
  std::unique_ptr<core::PagePool> pages;
  uint32_t copies_in_flight = 0;  // CopyJobs handed out and not finished
  // Operations, metrics and events.
  uint16_t index = 0;  // position in Service::pools()
  std::unique_ptr<PrefixStats> prefix_stats;
  std::unique_ptr<PoolIndexEvents> index_events;
  // KV events for routers (events.zmq_endpoint): this pool's changes since the Server last
  // handed them to the KvEventPublisher, and how they are described. Null when off.
  std::unique_ptr<KvEventBatcher> kv_events;
  KvEventFormat kv_format;
  // The host tier under the pool (pools[i].host_tier); null when none.
  std::unique_ptr<PoolHostTier> host_tier;
  // Elastic pools (service_resize.cpp); min_pages is 0 for a fixed pool.
  uint32_t min_pages = 0;
  uint64_t hits_at_resize = 0;  // counters.hit_blocks at the last resize: the donor choice
  uint64_t grows = 0;
  uint64_t shrinks = 0;
  uint64_t growing_ahead = 0;       // bytes of the segment being made ahead of need (0: none)
  uint64_t resizing_bytes = 0;      // bytes an admin resize is making (0: none)
  uint32_t grow_ahead_retry_s = 0;  // no growth ahead before this (seconds_now) after a failure
  // The last resizes, oldest first once full: (Unix ms, pages after), for kvpoolctl status.
  static constexpr size_t kResizeHistory = 8;
  std::array<std::pair<uint64_t, uint32_t>, kResizeHistory> resize_history{};
  uint64_t resize_count = 0;
  bool elastic() const { return min_pages != 0; }
};

// The pool's memory as the kernels and the daemon's copies see it.
kernels::PagedKv paged_kv(const Pool& pool);

// Per-connection state the Service keeps; the Server holds one per connection.
// What the Server tells the Service about its connections, for the stats snapshot.
struct ConnectionStats {
  uint64_t buffered_bytes = 0;    // all connections' buffers now
  uint64_t sessions_refused = 0;  // connections refused at accept
  uint64_t closed_by_limits = 0;  // hello deadline, frame timeout, buffer budget
};

struct SessionState {
  uint64_t id = 0;
  PeerCredentials peer;
  std::string worker_name;
  bool attached = false;
  Pool* pool = nullptr;
  uint32_t known_epoch = 0;  // the pool's segment list this session was last told of
  uint32_t tenant = 0;       // index into Service::tenants()
  core::OwnerId owner = 0;
  uint64_t held_pages = 0;  // distinct pages held, as of the last call
  // Set by a subscribe: the connection now carries events (the Server pushes them).
  std::optional<Subscription> subscription;
};

// Work of one call that runs off the event loop: a validated page copy (opcode copy), or the
// host-tier copies of an alloc, lookup or evict whose reply waits for them. run() may be called
// on any thread (one job of a pool at a time: while one is in flight every further job of its
// pool queues behind it); everything else belongs to the event loop.
struct CopyJob {
  Pool* pool = nullptr;
  SessionState* session = nullptr;  // a call's job: the caller (alive until it is finished)
  uint32_t request_id = 0;
  wire::Opcode op = wire::Opcode::copy;
  uint64_t started_ns = 0;  // for the service latency histogram (0 = not timed)
  std::vector<PageId> src;
  std::vector<PageId> dst;
  kernels::CopyPagesArgs args;  // points into src and dst
  std::string error;            // set by run(): "" or the copier's error text
  // Host-tier copies (PoolHostTier's step 2).
  std::unique_ptr<TierCopy> tier;
  // Other work off the loop (making or releasing segments).
  std::function<void()> work;
  // On the loop once run: the call's reply (null: a page copy's), or, for the daemon's own
  // background jobs (no session), what completes them.
  std::function<wire::Result<wire::Reply>()> finish;
  std::function<void()> done;

  // Page and host-tier copies (no other work) count in pool->copies_in_flight: they use the
  // pool's copiers, one job at a time.
  bool counted() const { return !work; }

  // The page count was taken on the loop (args.kv.num_pages): an elastic pool may resize while
  // this runs, above the pages it copies, which its session holds.
  void run() {
    if (tier) pool->host_tier->run(*tier);
    if (work) work();
    if (args.num_pairs != 0) error = pool->memory->copy_pages(args, args.kv.num_pages);
  }
};

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
  // When `deferred` is given, a copy too large for the event loop is not run: *deferred gets the
  // job and nothing is appended; the caller runs it and calls finish_copy. Without `deferred`
  // every copy runs here.
  void handle(SessionState& session, uint32_t request_id, const wire::Request& request,
              std::vector<std::byte>& out, std::span<const int>* fds_to_pass,
              std::unique_ptr<CopyJob>* deferred = nullptr);
  // Appends the reply of a deferred job that has run.
  void finish_copy(CopyJob& job, std::vector<std::byte>& out);
  // The daemon's own work off the loop (segments made ahead of need, shrunk ones given back),
  // one job at a time until null; the caller runs each and then calls finish_background.
  std::unique_ptr<CopyJob> take_background_job();
  void finish_background(CopyJob& job);

  const std::vector<std::unique_ptr<Pool>>& pools() const { return pools_; }
  const std::vector<std::string>& tenants() const { return tenant_names_; }
  uint32_t session_count() const { return sessions_; }
  const MemoryBackend& backend() const { return *backend_; }
  const Config& config() const { return config_; }
  // Copies up to this many bytes run on the event loop (kvpoold --inline-copy-bytes).
  uint64_t inline_copy_bytes() const { return inline_copy_bytes_; }
  void set_inline_copy_bytes(uint64_t bytes) { inline_copy_bytes_ = bytes; }

  // Reload: applies what can change while sessions run (limits, tenants, default tenant, log
  // level, a pool's eviction policy and share_between_tenants) and returns the dotted keys that
  // changed but need a restart (socket.*, backend, device, pools, metrics, events), which keep
  // their running values. Existing sessions keep their tenant.
  std::vector<std::string> apply_live(const Config& next);

 private:
  Service(const Config& config, std::unique_ptr<MemoryBackend> backend);
  // create() without its guard against std::bad_alloc; `current` names the pool being set up.
  static wire::Result<std::unique_ptr<Service>> create_unguarded(
      const Config& config, std::unique_ptr<MemoryBackend> backend, const PoolConfig*& current);

  // Builds the pool's host tier when its config asks for one (after init_operations()).
  wire::Result<bool> attach_host_tier(Pool& pool);
  // Index into tenant_names_ for a peer, or -1 to refuse it.
  int tenant_of(const PeerCredentials& peer);
  // Pages the session may still take that it does not hold (quotas), or PagePool::kUnlimited.
  uint32_t new_pages_allowed(const SessionState& s) const;
  // The quota_exceeded error for `wanted` more pages, naming the limit that refuses them.
  wire::Error quota_error(const SessionState& s, uint64_t wanted) const;
  // Pages one tenant may keep pinned in `pool`.
  uint32_t pin_limit(const Pool& pool) const;
  // The pool's CallHints for a request's hints, or the error naming the limit they pass.
  wire::Result<core::CallHints> call_hints(const SessionState& s, const PageHints& hints) const;
  // The error for a failed hinted call: pin_limit_exceeded names the tenant's limit.
  wire::Error hint_error(const SessionState& s, const Status& st) const;
  // Logs the pools that tenants share (at start and after a reload).
  void log_shared_pools() const;
  // The stable index of a tenant name, registering it on first sight.
  uint32_t tenant_index(const std::string& name);
  bool tenant_may_use(uint32_t tenant, const Pool& pool) const;
  void refresh_held(SessionState& s);

  wire::Result<wire::Reply> hello(SessionState& s, const wire::HelloRequest& r,
                                  std::span<const int>* fds);
  wire::Result<wire::Reply> alloc(SessionState& s, const wire::AllocRequest& r);
  wire::Result<wire::Reply> retain(SessionState& s, const wire::RetainRequest& r);
  wire::Result<wire::Reply> release(SessionState& s, const wire::ReleaseRequest& r);
  wire::Result<wire::Reply> lookup(SessionState& s, const wire::LookupRequest& r);
  // A lookup's reply with its first `hits` pages, counted in the prefix stats.
  wire::Result<wire::Reply> lookup_reply(SessionState& s, wire::LookupReply l, uint32_t hits);
  // Appends a call's reply (after a pool_changed notice when the session's segment list is old).
  void encode_answer(SessionState& s, uint32_t request_id, wire::Opcode op,
                     const wire::Result<wire::Reply>& reply, std::vector<std::byte>& out);
  wire::Result<wire::Reply> publish(SessionState& s, const wire::PublishRequest& r);
  wire::Result<wire::Reply> stats(SessionState& s);
  wire::Result<wire::Reply> evict(SessionState& s, const wire::EvictRequest& r);
  wire::Result<wire::Reply> flush(SessionState& s);
  wire::Result<wire::Reply> sessions(SessionState& s);
  wire::Result<wire::Reply> pages(SessionState& s);
  // Elastic pools (service_resize.cpp): the pool as it is now, with its descriptors; an admin
  // resize.
  wire::Result<wire::Reply> segments(SessionState& s, std::span<const int>* fds);
  wire::Result<wire::Reply> resize(SessionState& s, const wire::ResizeRequest& r);
  // An admin resize upwards: segments planned here, made off the loop (call_job_).
  wire::Result<wire::Reply> resize_up(SessionState& s, Pool& pool, uint32_t target);
  // Makes an elastic pool's memory and sets its info (create()); the pool's page count.
  wire::Result<uint32_t> create_elastic(Pool& pool, uint32_t initial_pages);
  // Grows an elastic pool by segments until it has `free_wanted` free pages, its max, or no
  // memory the budget allows (taking segments from other pools as the policy says). Returns
  // whether it grew.
  bool grow_for(Pool& pool, uint64_t free_wanted);
  // At most how many pages grow_for could add to the pool now: whole segments up to its max, as
  // far as the budget's room and every other elastic pool's whole segments above its min would
  // fund (an upper bound: a donor whose tail pages are held gives less). 0 for a fixed pool.
  uint64_t growable_pages(const Pool& pool) const;
  // The error of an alloc the pool refuses before anything changes (admit_alloc's status).
  wire::Error alloc_error(const SessionState& s, const Status& st, uint64_t growable) const;
  // One segment more / fewer; the error names the cause (max, budget, pages in use).
  wire::Result<bool> grow_one(Pool& pool);
  wire::Result<bool> shrink_one(Pool& pool);
  uint32_t pages_after_shrink(const Pool& pool) const;
  // Frees at least `bytes` of the budget by shrinking other elastic pools, lowest hits per byte
  // first, only those below `below` hits per byte (< 0: any), never `taker`, never below a
  // pool's min, never one running a copy; shrinks nothing when they cannot give enough.
  bool reclaim(const Pool& taker, uint64_t bytes, double below);
  // The bytes of the pool's next segment (the last one may be short); its hits per mapped byte
  // since its last resize.
  uint64_t next_segment_bytes(const Pool& pool) const;
  double hits_per_byte(const Pool& pool) const;
  // Bytes the elastic pools map now, and what the budget allows (UINT64_MAX: no budget).
  uint64_t elastic_bytes() const;
  // After a resize: page count, info, epoch, history, log and event.
  void resized(Pool& pool, bool grew);
  // Starts the pool's next segment off the loop when its free pages run low and the budget has
  // room (no other pool is shrunk for it); a background job maps it once made.
  void grow_ahead(Pool& pool);
  // Maps a segment made off the loop and grows the pool over it; "" or why not (the memory then
  // goes back off the loop): it could not be made, the budget has no room left, the pool's end
  // moved to where a segment of another size goes, or the pool reached its max.
  std::string commit_growth(Pool& pool, Growth& g);
  // Bytes of segments being made ahead of need, in all pools.
  uint64_t ahead_bytes() const;
  // A copy: run here, or handed to the caller through `deferred` (see handle()).
  wire::Result<wire::Reply> copy(SessionState& s, uint32_t request_id, const wire::CopyRequest& r,
                                 uint64_t started_ns, std::unique_ptr<CopyJob>* deferred);
  // Validates a copy; the job to run, or the error to answer with (service_copy.cpp).
  wire::Result<std::unique_ptr<CopyJob>> prepare_copy(SessionState& s, uint32_t request_id,
                                                      const wire::CopyRequest& r);
  // The reply to a copy that has run.
  wire::Result<wire::Reply> copy_reply(const CopyJob& job) const;
  // Root, or a member of admin_group; else the permission_denied error to answer with.
  wire::Result<bool> check_admin(const PeerCredentials& peer, std::string_view what) const;

  Config config_;
  std::unique_ptr<MemoryBackend> backend_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::vector<std::string> tenant_names_;  // every tenant seen; index = namespace − 1, stable
  std::vector<uint64_t> tenant_held_;      // distinct pages held by the tenant's sessions
  uint32_t sessions_ = 0;
  std::unordered_map<uid_t, uint32_t> uid_sessions_;  // open sessions per peer uid
  std::set<SessionState*> live_;  // every open session (owned by its connection)
  uint64_t next_session_id_ = 1;
  uint64_t inline_copy_bytes_ = kDefaultInlineCopyBytes;

  // Operations, metrics and events (service_ops.cpp) -----------------------------------------
 public:
  // What kvpoold's reload does (re-read the file, apply_live, log, notify systemd).
  void set_reload_handler(std::function<wire::ReloadReply()> handler) {
    reload_handler_ = std::move(handler);
  }
  void note_reload(bool applied);
  // True once after an evict, flush or reload changed what the stats show (the stats publisher
  // then publishes before the reply leaves).
  bool take_operator_change() { return std::exchange(operator_change_, false); }
  // True once after a pool's segments changed: the Server then tells its other sessions.
  bool take_pool_change() { return std::exchange(pool_changed_, false); }
  const EventLog& events() const { return *events_; }
  // The KV event publisher's counters, shown in the stats snapshot (null = none). Not owned.
  void set_kv_event_counters(const KvEventCounters* counters) { kv_counters_ = counters; }
  LatencyRecorder& request_latency() { return request_latency_; }
  ConnectionStats& connection_stats() { return connection_stats_; }
  // The daemon-wide stats snapshot: counters and pages by state per pool, sessions, events,
  // latency histograms.
  void fill_snapshot(stats::Snapshot& out) const;
  // For a subscribed session: appends to `batch` up to `max` events it has not seen yet (a gap
  // marker first when it fell behind the ring). Empty when there is nothing new.
  void collect_events(SessionState& s, size_t max, wire::EventBatch& batch);

 private:
  // Sets up what the operations block keeps per pool (from create()).
  void init_operations();
  // Seconds since start + 1, as PrefixStats counts time.
  uint32_t seconds_now() const;
  bool is_admin(const SessionState& s) const { return check_admin(s.peer, "").ok(); }
  wire::Result<wire::Reply> prefixes(SessionState& s, const wire::PrefixesRequest& r);
  wire::Result<wire::Reply> reload(SessionState& s);
  wire::Result<wire::Reply> subscribe(SessionState& s, uint32_t request_id,
                                      const wire::SubscribeRequest& r);
  wire::Result<wire::Reply> snapshot(SessionState& s);

  std::unique_ptr<EventLog> events_;
  LatencyRecorder service_latency_{true};
  LatencyRecorder request_latency_{true};
  std::function<wire::ReloadReply()> reload_handler_;
  uint64_t start_mono_ns_ = 0;
  uint64_t start_unix_ms_ = 0;
  uint32_t now_s_ = 1;  // seconds_now() as of the current request
  // The current call's host-tier copies and, for a lookup that promotes, the rest of its reply.
  TierCopy call_tier_;
  std::function<wire::Result<wire::Reply>(TierCopy&)> call_finish_;
  // A job the current call made for itself (an admin resize's segments); handle() hands it out.
  std::unique_ptr<CopyJob> call_job_;
  // Background jobs not yet taken, and shrunk segments whose memory is still to go back.
  std::vector<std::unique_ptr<CopyJob>> background_;
  std::vector<LooseSegment> released_;
  uint32_t subscribers_ = 0;
  uint64_t reloads_ = 0;
  uint64_t reload_failures_ = 0;
  ConnectionStats connection_stats_;
  bool operator_change_ = false;
  bool pool_changed_ = false;
  uint64_t budget_bytes_ = UINT64_MAX;  // memory_budget resolved at start
  const KvEventCounters* kv_counters_ = nullptr;
};

}  // namespace kvpool::daemon

// SessionState: what the Service keeps per connection (the Server holds one per connection), and
// the peer credentials it was opened with.
//
// Invariants: while attached, pool is set and owner is open in pool->pages(); held_pages is the
// owner's distinct pages as of the session's last call, and is what its tenant's total counts.
//
// Thread-safety: event loop only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/core/types.h"
#include "daemon/telemetry/events.h"

namespace kvpool::daemon {

class PoolRuntime;

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// What the Server tells the Service about its connections, for the stats snapshot.
struct ConnectionStats {
  uint64_t buffered_bytes = 0;    // all connections' buffers now
  uint64_t sessions_refused = 0;  // connections refused at accept
  uint64_t closed_by_limits = 0;  // hello deadline, frame timeout, buffer budget
};

struct SessionState;

// The sessions of one process attached to the groups of one hybrid model, joined by hello's
// link_session: at most one per group (index = group; null = none). lookup_groups on any of them
// takes each group's pages into that group's session.
struct ModelSessions {
  std::vector<SessionState*> by_group;
};

struct SessionState {
  uint64_t id = 0;
  PeerCredentials peer;
  std::string worker_name;
  bool attached = false;
  // Its connection closed while a job of it ran: what finishes that job takes nothing new (a
  // remote fetch allocates no pages for it).
  bool closing = false;
  PoolRuntime* pool = nullptr;
  uint32_t known_epoch = 0;  // the pool's segment list this session was last told of
  uint32_t tenant = 0;       // index into Access::tenants()
  core::OwnerId owner = 0;
  uint64_t held_pages = 0;  // distinct pages held, as of the last call
  // Set while attached to a group of a hybrid model (shared with the linked sessions).
  std::shared_ptr<ModelSessions> model;
  // Static reservations (reserve): id → block table (kNoPage for blocks a window skipped); the
  // references they hold, per page, which release leaves alone; their pages in all.
  std::unordered_map<uint64_t, std::vector<PageId>> reservations;
  std::unordered_map<PageId, uint32_t> reserved_refs;
  uint64_t reserved_pages = 0;
  uint64_t next_reservation = 1;
  // Set by a subscribe: the connection now carries events (the Server pushes them).
  std::optional<Subscription> subscription;
};

}  // namespace kvpool::daemon

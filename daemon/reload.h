// Reloading kvpoold's configuration: what SIGHUP and the reload op both do.
//
// The file is read and validated as at start; an invalid one is refused with its
// "FILE:LINE: KEY: ..." error and the running configuration stays. A valid one goes through
// Service::apply_live: each key as the key table (daemon/config/config_keys.h) classifies it:
// limits, tenants, default tenant, admin group, logging and a pool's policy,
// share_between_tenants and grow_ahead change at once, while keys that cannot change under
// running sessions (socket.*, backend, device, max_segment_bytes, memory_budget, the rest of
// pools, metrics, events) keep their running values and are returned as needing a restart. Each
// outcome is logged (reloaded, reload_failed, reload_needs_restart, reload_skipped) and counted
// in the stats snapshot.
//
// Thread-safety: event-loop thread (it changes the Service).
#pragma once

#include <string>

#include "common/wire/protocol.h"
#include "daemon/service/service.h"

namespace kvpool::daemon {

// `path` "" means the daemon runs the built-in config: nothing to re-read (kNoConfigFile).
// `socket_override` (--socket) keeps overriding the file's socket.path.
wire::ReloadReply reload_config(const std::string& path, const std::string& socket_override,
                                Service& service);

// A note for systemd's STATUS= line after a reload ("" when it was applied in full).
std::string reload_status_note(const wire::ReloadReply& outcome);

}  // namespace kvpool::daemon

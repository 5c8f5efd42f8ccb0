#include "daemon/reload.h"

#include "daemon/config/config.h"
#include "daemon/config/config_keys.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

std::string joined(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys)
    out += (out.empty() ? "" : ",") + k;
  return out;
}

}  // namespace

wire::ReloadReply reload_config(const std::string& path, const std::string& socket_override,
                                Service& service) {
  wire::ReloadReply r;
  if (path.empty()) {
    log_event(LogLevel::info, "reload_skipped",
              {kv("detail", "no --config file: the built-in default config stays")});
    r.outcome = wire::ReloadReply::kNoConfigFile;
    r.message = "kvpoold runs its built-in default config (no --config file): nothing to reload";
    return r;
  }
  auto next = load_config(path);
  if (!next.ok()) {
    log_event(LogLevel::error, "reload_failed",
              {kv("error", next.error().message), kv("detail", "keeping the running config")});
    service.note_reload(false);
    r.outcome = wire::ReloadReply::kRefused;
    r.message = next.error().message.substr(0, wire::kMaxMessageBytes);
    return r;
  }
  Config config = std::move(next.value());
  if (!socket_override.empty()) config.socket_path = socket_override;
  // Tenants apply live, conversions at the next start: the running conversions must hold under
  // the new tenants.
  Config would_run = config;
  (void)keep_restart_keys(would_run, service.config());
  if (std::string why = conversion_tenancy_error(would_run); !why.empty()) {
    const std::string message = path + ": " + why +
                                " (the running conversions stay until a "
                                "restart; refusing the reload)";
    log_event(LogLevel::error, "reload_failed",
              {kv("error", message), kv("detail", "keeping the running config")});
    service.note_reload(false);
    r.outcome = wire::ReloadReply::kRefused;
    r.message = message.substr(0, wire::kMaxMessageBytes);
    return r;
  }
  r.restart = service.apply_live(config);
  LogLevel level = LogLevel::info;
  parse_log_level(service.config().log_level, level);
  set_log_level(level);
  service.note_reload(true);
  log_event(LogLevel::info, "reloaded",
            {kv("config", path), kv("max_sessions", service.config().max_sessions),
             kv("max_pages_per_session", service.config().max_pages_per_session),
             kv("max_pages_per_tenant", service.config().max_pages_per_tenant),
             kv("tenants", service.config().tenants.size())});
  if (!r.restart.empty()) {
    log_event(LogLevel::warn, "reload_needs_restart",
              {kv("keys", joined(r.restart)),
               kv("detail", "these changes take effect at the next start")});
  }
  r.outcome = wire::ReloadReply::kApplied;
  r.message = path;
  return r;
}

std::string reload_status_note(const wire::ReloadReply& outcome) {
  if (outcome.outcome == wire::ReloadReply::kRefused) {
    return "; last reload failed, running the previous config";
  }
  if (!outcome.restart.empty()) return "; changed " + joined(outcome.restart) + " need a restart";
  return "";
}

}  // namespace kvpool::daemon

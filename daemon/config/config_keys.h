// The config's key table: every key kvpoold's config knows, once. The parser takes each
// mapping's allowed keys from it (keys_under), the schema check (config_keys(), a test against
// daemon/config/config.h's comment and config/kvpoold.yaml) lists it, and a reload classifies
// each key by it: a live key takes its new value at once; a restart key keeps its running value
// (keep) and, when it changed, is named under its restart_name (one name may stand for a group:
// "pools", "metrics", "events").
//
// Paths are dotted; "[]" marks a list whose items are mappings ("pools[].geometry.layers").
// A key that is not in the table is an unknown key to the parser, so a key cannot be parsed
// without being classified.
//
// Thread-safety: constant data.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"

namespace kvpool::daemon {

enum class Reload : uint8_t { live, restart };

struct ConfigKey {
  std::string_view path;
  Reload reload;
  std::string_view restart_name;  // restart keys: what a reload names when it changed
  void (*keep)(Config& next, const Config& running);  // restart keys: the running value back
};

std::span<const ConfigKey> config_key_table();
// The keys directly under `prefix` ("" for the top level, "socket.", "pools[].",
// "pools[].geometry."), in table order.
std::vector<std::string_view> keys_under(std::string_view prefix);
// Puts every restart key's running value back into `next`; returns the restart names of those
// that changed, in table order, each once.
std::vector<std::string> keep_restart_keys(Config& next, const Config& running);

}  // namespace kvpool::daemon

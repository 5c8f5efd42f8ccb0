// Logging for kvpoold: one key=value line per event on stderr (journald adds the timestamp).
//
//   level=info event=session_open session=3 pid=4242 uid=1000 tenant=default pool=default
//
// Values with spaces, quotes or '=' are quoted. Values may carry client data (worker names are
// any bytes), so a backslash, control characters and bytes that are not valid UTF-8 are escaped
// as display_text does (common/text.h: \\, \n, \r, \x1b, \xff): a line is always one line of
// printable UTF-8. Thread-safety: a line is written with one fwrite, so lines from different
// threads never interleave.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvpool::daemon {

enum class LogLevel : uint8_t { debug = 0, info = 1, warn = 2, error = 3 };

// Returns false for a name other than debug, info, warn, error.
bool parse_log_level(std::string_view name, LogLevel& out);
void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);

using LogField = std::pair<std::string_view, std::string>;

void log_event(LogLevel level, std::string_view event, std::initializer_list<LogField> fields = {});

inline LogField kv(std::string_view key, std::string value) {
  return {key, std::move(value)};
}
template <typename T>
LogField kv(std::string_view key, T value) {
  if constexpr (std::is_convertible_v<T, std::string_view>) {
    return {key, std::string(std::string_view(value))};
  } else {
    return {key, std::to_string(value)};
  }
}

}  // namespace kvpool::daemon

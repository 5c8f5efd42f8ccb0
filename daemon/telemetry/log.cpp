#include "daemon/telemetry/log.h"

#include <atomic>
#include <cstdio>

#include "common/text.h"

namespace kvpool::daemon {

namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::info)};

const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
  }
  return "info";
}

// Values may carry client data (a worker name is any bytes): display_text escapes control
// characters and bytes that are not valid UTF-8, so a line stays one printable line.
void append_value(std::string& out, std::string_view v) {
  const bool quote = v.empty() || v.find_first_of(" \t\"=\n") != std::string_view::npos;
  const std::string shown = display_text(v);
  if (!quote) {
    out += shown;
    return;
  }
  out += '"';
  for (const char c : shown) {
    if (c == '"') out += '\\';
    out += c;
  }
  out += '"';
}

}  // namespace

bool parse_log_level(std::string_view name, LogLevel& out) {
  for (const LogLevel l : {LogLevel::debug, LogLevel::info, LogLevel::warn, LogLevel::error}) {
    if (name == level_name(l)) {
      out = l;
      return true;
    }
  }
  return false;
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

bool log_enabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load();
}

void log_event(LogLevel level, std::string_view event, std::initializer_list<LogField> fields) {
  if (!log_enabled(level)) return;
  std::string line = "level=";
  line += level_name(level);
  line += " event=";
  append_value(line, event);
  for (const auto& [key, value] : fields) {
    line += ' ';
    line += key;
    line += '=';
    append_value(line, value);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace kvpool::daemon

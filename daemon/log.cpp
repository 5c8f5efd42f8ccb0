#include "daemon/log.h"

#include <atomic>
#include <cstdio>

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

void append_value(std::string& out, std::string_view v) {
  const bool quote = v.empty() || v.find_first_of(" \t\"=\n") != std::string_view::npos;
  if (!quote) {
    out += v;
    return;
  }
  out += '"';
  for (const char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
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

#include "bench/replay/trace.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace kvpool::bench {

namespace {

[[noreturn]] void fail(const std::string& path, size_t line, const std::string& what) {
  throw std::runtime_error(path + ":" + std::to_string(line) + ": " + what);
}

uint64_t unsigned_field(const nlohmann::json& obj, const char* key, const std::string& path,
                        size_t line, bool required) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) fail(path, line, std::string("missing field \"") + key + "\"");
    return 0;
  }
  if (!it->is_number_unsigned()) {
    fail(path, line, std::string("field \"") + key + "\" must be a non-negative integer");
  }
  return it->get<uint64_t>();
}

}  // namespace

bool parse_priority(std::string_view name, Priority& out) {
  constexpr std::pair<std::string_view, Priority> kNames[] = {
      {"none", Priority::none},
      {"one_off", Priority::one_off},
      {"conversation", Priority::conversation},
      {"system", Priority::system}};
  for (const auto& [n, p] : kNames) {
    if (n == name) {
      out = p;
      return true;
    }
  }
  return false;
}

Trace load_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open trace file");
  Trace trace;
  std::unordered_set<uint64_t> distinct;
  std::string text;
  size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json obj;
    try {
      obj = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      fail(path, line, std::string("not valid JSON: ") + e.what());
    }
    if (!obj.is_object()) fail(path, line, "expected a JSON object");
    TraceRequest r;
    r.timestamp_ms = unsigned_field(obj, "timestamp", path, line, false);
    r.input_length = unsigned_field(obj, "input_length", path, line, false);
    r.output_length = unsigned_field(obj, "output_length", path, line, false);
    const auto ids = obj.find("hash_ids");
    if (ids == obj.end() || !ids->is_array()) fail(path, line, "missing array \"hash_ids\"");
    r.hash_ids.reserve(ids->size());
    for (const auto& id : *ids) {
      if (!id.is_number_unsigned()) fail(path, line, "hash_ids must hold non-negative integers");
      r.hash_ids.push_back(id.get<uint64_t>());
      distinct.insert(r.hash_ids.back());
    }
    if (const auto it = obj.find("priority"); it != obj.end()) {
      if (!it->is_string() || !parse_priority(it->get<std::string>(), r.priority)) {
        fail(path, line, "\"priority\" must be none, one_off, conversation or system");
      }
      trace.has_hints = true;
    }
    const uint64_t system_blocks = unsigned_field(obj, "system_blocks", path, line, false);
    if (system_blocks > r.hash_ids.size()) {
      fail(path, line, "\"system_blocks\" is larger than the request's hash_ids");
    }
    r.system_blocks = static_cast<uint32_t>(system_blocks);
    const uint64_t ttl = unsigned_field(obj, "pin_ttl_ms", path, line, false);
    if (ttl > UINT32_MAX) fail(path, line, "\"pin_ttl_ms\" is out of range");
    r.pin_ttl_ms = static_cast<uint32_t>(ttl);
    if (r.system_blocks != 0 || r.pin_ttl_ms != 0) trace.has_hints = true;
    trace.total_blocks += r.hash_ids.size();
    trace.requests.push_back(std::move(r));
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  trace.distinct_blocks = distinct.size();
  return trace;
}

}  // namespace kvpool::bench

// Reading a kvpoold config file's YAML tree (see config_yaml.h): the lines and dotted paths that
// error messages name, checked mappings and lists, and the scalar accessors (strings, choices,
// integers, socket modes, booleans). The schema built on them is in config.cpp.
#include "daemon/config/config_yaml.h"

#include <algorithm>
#include <charconv>
#include <utility>

namespace kvpool::daemon::config_yaml {

namespace {

constexpr uint32_t kMaxSocketMode = 0777;

bool contains(std::span<const std::string_view> words, std::string_view w) {
  return std::find(words.begin(), words.end(), w) != words.end();
}

// A scalar the YAML text quoted (or tagged !!str): a string even when it reads like a number.
bool is_quoted(const YAML::Node& node) {
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

// The entry `key` of `parent`. A mapping or list is reported at its key's line (yaml-cpp marks
// a block mapping at its first key), anything else at its own line.
Value child(const Value& parent, const YAML::Node& node, std::string_view key, int key_line) {
  std::string path = parent.path.empty() ? std::string(key) : parent.path + "." + std::string(key);
  const int line = node.IsMap() || node.IsSequence() ? key_line : line_of(node, key_line);
  return Value{node, std::move(path), line};
}

}  // namespace

int line_of(const YAML::Node& node, int fallback) {
  if (!node.IsDefined() || node.IsNull() || node.Mark().is_null()) return fallback;
  return node.Mark().line + 1;
}

std::string kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "the scalar \"" + node.Scalar() + "\"";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      break;
  }
  return "empty";
}

std::string join(std::span<const std::string_view> words) {
  std::string out;
  for (std::string_view w : words) {
    if (!out.empty()) out += ", ";
    out += w;
  }
  return out;
}

std::string quoted(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void NodeReader::fail(const Value& v, const std::string& what) const {
  throw ParseFailure{location(v) + ": " + what};
}

std::string NodeReader::location(const Value& v) const {
  std::string where = std::string(source_) + ":" + std::to_string(v.line);
  if (!v.path.empty()) where += ": " + v.path;
  return where;
}

const Value* NodeReader::find(const Fields& f, std::string_view key) {
  auto it = f.find(key);
  return it == f.end() ? nullptr : &it->second;
}

NodeReader::Fields NodeReader::fields(const Value& v, std::span<const std::string_view> known,
                                      bool null_ok) const {
  Fields out;
  if (v.node.IsNull() && null_ok) return out;
  if (!v.node.IsMap()) fail(v, "must be a mapping, not " + kind_of(v.node));
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    // The iterator yields a temporary pair: copy the nodes (they are handles).
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    const int key_line = line_of(key, v.line);
    if (!key.IsScalar()) {
      fail(Value{key, v.path, key_line}, "a key must be a plain string, not " + kind_of(key));
    }
    const std::string& name = key.Scalar();
    const Value entry = child(v, value, name, key_line);
    if (!contains(known, name)) {
      fail(Value{key, entry.path, key_line}, "unknown key (known keys: " + join(known) + ")");
    }
    if (out.count(name) != 0) {
      fail(Value{key, entry.path, key_line},
           "duplicate key (first set on line " + std::to_string(out.at(name).line) + ")");
    }
    out.emplace(name, entry);
  }
  return out;
}

const Value& NodeReader::required(const Fields& f, const Value& parent,
                                  std::string_view key) const {
  if (const Value* v = find(f, key)) return *v;
  fail(parent, "missing required key \"" + std::string(key) + "\"");
}

std::vector<Value> NodeReader::items(const Value& v) const {
  std::vector<Value> out;
  if (v.node.IsNull()) return out;
  if (!v.node.IsSequence()) fail(v, "must be a list, not " + kind_of(v.node));
  size_t i = 0;
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    const YAML::Node item = *it;
    // yaml-cpp marks an empty item at the next token; the list's own mark is its first item.
    int line = line_of(item, v.line);
    if (item.IsNull()) {
      line = i == 0 || item.Mark().is_null() ? line_of(v.node, v.line) : item.Mark().line + 1;
    }
    out.push_back(Value{item, v.path + "[" + std::to_string(i) + "]", line});
    ++i;
  }
  return out;
}

void NodeReader::require_scalar(const Value& v, std::string_view type) const {
  if (v.node.IsScalar()) return;
  if (v.node.IsNull()) fail(v, "has no value (expected " + std::string(type) + ")");
  fail(v, "must be " + std::string(type) + ", not " + kind_of(v.node));
}

std::string NodeReader::get_string(const Value& v, std::string_view expected) const {
  if (v.node.IsNull()) fail(v, "has no value (expected " + std::string(expected) + ")");
  require_scalar(v, "a string");
  return v.node.Scalar();
}

std::string NodeReader::get_choice(const Value& v,
                                   std::span<const std::string_view> choices) const {
  std::string s = get_string(v, "one of " + join(choices));
  if (!contains(choices, s)) fail(v, quoted(s) + " is not one of " + join(choices));
  return s;
}

uint64_t NodeReader::get_uint(const Value& v, uint64_t min, uint64_t max) const {
  require_scalar(v, "an integer");
  const std::string& s = v.node.Scalar();
  if (is_quoted(v.node)) fail(v, "must be an integer, not the string " + quoted(s));
  std::string_view digits = s;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  if (!digits.empty() && digits.front() == '-' && all_digits(digits.substr(1))) {
    fail(v, "must not be negative (got " + s + ")");
  }
  if (!all_digits(digits)) fail(v, "must be an integer, not " + quoted(s));
  if (digits.size() > 1 && digits.front() == '0') {
    fail(v, "must be a decimal integer without leading zeros (got " + s + ")");
  }
  uint64_t n = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec == std::errc::result_out_of_range || n > max) {
    fail(v, "must be at most " + std::to_string(max) + " (got " + s + ")");
  }
  if (ec != std::errc() || ptr != digits.data() + digits.size()) {
    fail(v, "must be an integer, not " + quoted(s));
  }
  if (n < min) fail(v, "must be at least " + std::to_string(min) + " (got " + s + ")");
  return n;
}

uint32_t NodeReader::get_mode(const Value& v) const {
  const std::string what = "must be an octal string like \"0660\" or an integer <= 0777";
  require_scalar(v, "a mode");
  std::string_view s = v.node.Scalar();
  int base = is_quoted(v.node) ? 8 : 10;
  if (s.starts_with("0o") || s.starts_with("0O")) {
    s.remove_prefix(2);
    base = 8;
  } else if (s.size() > 1 && s.front() == '0') {
    base = 8;
  }
  if (!all_digits(s)) fail(v, what + " (got " + quoted(v.node.Scalar()) + ")");
  uint64_t n = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n, base);
  if (ec != std::errc() || ptr != s.data() + s.size() || n > kMaxSocketMode) {
    fail(v, what + " (got " + quoted(v.node.Scalar()) + ")");
  }
  return static_cast<uint32_t>(n);
}

bool NodeReader::get_bool(const Value& v) const {
  require_scalar(v, "true or false");
  const std::string& s = v.node.Scalar();
  if (!is_quoted(v.node) && s == "true") return true;
  if (!is_quoted(v.node) && s == "false") return false;
  fail(v, "must be true or false, not " + quoted(s));
}

}  // namespace kvpool::daemon::config_yaml

// Internal to kvpool_daemon: reading a kvpoold config file's YAML tree, for the schema in
// daemon/config/config.cpp (defined in daemon/config/config_yaml.cpp). A Value is a node with the
// dotted path that names it and the line to report it at; NodeReader checks mappings, lists and
// scalars and fails with "SOURCE:LINE: PATH: what is wrong" by throwing ParseFailure, which
// parse_config turns into an Error.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace kvpool::daemon::config_yaml {

// Thrown inside the parser only; parse_config turns it into an Error.
struct ParseFailure {
  std::string message;
};

// A node with the dotted path that names it and the 1-based line to report it at.
struct Value {
  YAML::Node node;
  std::string path;
  int line = 1;
};

// The line of `node`, or `fallback` where yaml-cpp has no useful mark (null values are marked at
// the next token, which can be lines further down).
int line_of(const YAML::Node& node, int fallback);

// "a mapping", "a list", "the scalar \"…\"" or "empty", for error messages.
std::string kind_of(const YAML::Node& node);

std::string quoted(std::string_view s);
std::string join(std::span<const std::string_view> words);
bool all_digits(std::string_view s);

class NodeReader {
 public:
  explicit NodeReader(std::string_view source) : source_(source) {}

 protected:
  using Fields = std::map<std::string, Value, std::less<>>;

  [[noreturn]] void fail(const Value& v, const std::string& what) const;

  // "SOURCE:LINE: PATH", as fail() names a value.
  std::string location(const Value& v) const;

  static const Value* find(const Fields& f, std::string_view key);

  // The entries of a mapping, every key checked against `known`. A null value (a section whose
  // entries are all commented out) is an empty mapping when `null_ok`.
  Fields fields(const Value& v, std::span<const std::string_view> known, bool null_ok = true) const;

  // A mapping's required entry; its absence is reported at the mapping.
  const Value& required(const Fields& f, const Value& parent, std::string_view key) const;

  // The items of a list; a null value is an empty list.
  std::vector<Value> items(const Value& v) const;

  void require_scalar(const Value& v, std::string_view type) const;

  // A scalar's text; `expected` says what belongs there when the value is missing.
  std::string get_string(const Value& v,
                         std::string_view expected = "a string; write \"\" for an empty one") const;

  std::string get_choice(const Value& v, std::span<const std::string_view> choices) const;

  // A non-negative decimal integer in [min, max], written unquoted.
  uint64_t get_uint(const Value& v, uint64_t min, uint64_t max) const;

  // An octal string ("0660", "660", "0o660") or an integer ≤ 0777; an unquoted number with a
  // leading 0 is octal as well, as in YAML 1.1.
  uint32_t get_mode(const Value& v) const;

  bool get_bool(const Value& v) const;

 private:
  std::string_view source_;
};

}  // namespace kvpool::daemon::config_yaml

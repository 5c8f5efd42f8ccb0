// Capacity strings of kvpoold's config (see parse_capacity in config.h): bytes with an optional
// binary or decimal unit, "N pages", or "P%" of the backend's free memory.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>

#include "daemon/config/config.h"
#include "daemon/config/config_yaml.h"

namespace kvpool::daemon {

namespace {

using config_yaml::all_digits;
using config_yaml::quoted;

constexpr uint64_t kMaxCapacity = uint64_t{1} << 63;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
    s.remove_suffix(1);
  return s;
}

}  // namespace

std::string parse_capacity(std::string_view text, Capacity& out) {
  const std::string_view s = trim(text);
  const std::string shown = quoted(text);
  const std::string expected =
      ": expected bytes (a number, optionally with B, KiB, MiB, GiB, TiB, KB, MB, GB or TB), "
      "\"N pages\" or \"P%\"";
  if (s.empty()) return "capacity is empty" + expected;
  if (s.front() == '-') return "capacity " + shown + " is negative";

  if (s.back() == '%') {
    const std::string_view num = trim(s.substr(0, s.size() - 1));
    const size_t dot = num.find('.');
    const bool well_formed = dot == std::string_view::npos ? all_digits(num)
                                                           : all_digits(num.substr(0, dot)) &&
                                                                 all_digits(num.substr(dot + 1));
    if (!well_formed) return "capacity " + shown + " is not a percentage like \"40%\"";
    double pct = 0;
    const auto [ptr, ec] = std::from_chars(num.data(), num.data() + num.size(), pct);
    if (ec != std::errc() || ptr != num.data() + num.size()) {
      return "capacity " + shown + " is not a percentage like \"40%\"";
    }
    if (!(pct > 0.0 && pct <= 100.0)) return "capacity " + shown + " is not in (0%, 100%]";
    out = Capacity{.unit = Capacity::Unit::fraction, .value = 0, .fraction = pct / 100.0};
    return {};
  }

  size_t n_digits = 0;
  while (n_digits < s.size() && s[n_digits] >= '0' && s[n_digits] <= '9')
    ++n_digits;
  if (n_digits == 0) return "capacity " + shown + " does not start with a number" + expected;
  uint64_t n = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + n_digits, n);
  if (ec == std::errc::result_out_of_range) return "capacity " + shown + " exceeds 2^63";
  if (ec != std::errc() || ptr != s.data() + n_digits) {
    return "capacity " + shown + " does not start with a number" + expected;
  }
  const std::string_view unit = trim(s.substr(n_digits));
  if (unit.starts_with(".")) {
    return "capacity " + shown + " is fractional; use a whole number of a smaller unit";
  }

  struct UnitDef {
    std::string_view name;
    uint64_t scale;
    Capacity::Unit unit;
  };
  static constexpr UnitDef kUnits[] = {
      {"", 1, Capacity::Unit::bytes},
      {"B", 1, Capacity::Unit::bytes},
      {"KiB", uint64_t{1} << 10, Capacity::Unit::bytes},
      {"MiB", uint64_t{1} << 20, Capacity::Unit::bytes},
      {"GiB", uint64_t{1} << 30, Capacity::Unit::bytes},
      {"TiB", uint64_t{1} << 40, Capacity::Unit::bytes},
      {"KB", 1000, Capacity::Unit::bytes},
      {"kB", 1000, Capacity::Unit::bytes},
      {"MB", uint64_t{1000} * 1000, Capacity::Unit::bytes},
      {"GB", uint64_t{1000} * 1000 * 1000, Capacity::Unit::bytes},
      {"TB", uint64_t{1000} * 1000 * 1000 * 1000, Capacity::Unit::bytes},
      {"page", 1, Capacity::Unit::pages},
      {"pages", 1, Capacity::Unit::pages},
  };
  const auto* def = std::find_if(std::begin(kUnits), std::end(kUnits),
                                 [&](const UnitDef& d) { return d.name == unit; });
  if (def == std::end(kUnits)) {
    return "capacity " + shown + " has an unknown unit " + quoted(unit) + expected;
  }
  if (n == 0) return "capacity " + shown + " is zero";
  if (n > kMaxCapacity / def->scale) return "capacity " + shown + " exceeds 2^63";
  out = Capacity{.unit = def->unit, .value = n * def->scale, .fraction = 0.0};
  return {};
}

}  // namespace kvpool::daemon

// A strict parser of the Prometheus text exposition format (0.0.4) for tests: it accepts what
// the format allows and what a scraper relies on, and reports the first thing that is wrong.
//
// Checked: metric and label names against their grammars; label values quoted with only \\, \"
// and \n escapes; numeric values (floats, +Inf, -Inf, NaN); HELP and TYPE at most once per
// family and before its samples, TYPE one of counter, gauge, histogram, summary, untyped; every
// sample belongs to a family declared by TYPE (a histogram X owns X_bucket, X_sum, X_count) and
// a family's samples are contiguous; no sample repeats a name and label set; counters are not
// negative; every histogram series (labels without le) has buckets in increasing le whose counts
// never decrease, a le="+Inf" bucket equal to its _count, and a _sum.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace kvpool::testing {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromParse {
  std::string error;                         // "" when the text is valid
  std::map<std::string, std::string> types;  // family → type
  std::vector<PromSample> samples;

  // The value of the sample `name` whose labels include all of `want`; NaN when none.
  double value(const std::string& name, const std::map<std::string, std::string>& want = {}) const {
    for (const PromSample& s : samples) {
      if (s.name != name) continue;
      bool all = true;
      for (const auto& [k, v] : want) {
        auto it = s.labels.find(k);
        all = all && it != s.labels.end() && it->second == v;
      }
      if (all) return s.value;
    }
    return std::nan("");
  }
};

inline bool prom_number(const std::string& text, double& out) {
  if (text == "+Inf" || text == "Inf" || text == "-Inf" || text == "NaN") {
    out = text == "NaN" ? NAN : text == "-Inf" ? -INFINITY : INFINITY;
    return true;
  }
  static const std::regex number(R"([+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?)");
  if (!std::regex_match(text, number)) return false;
  out = std::strtod(text.c_str(), nullptr);
  return true;
}

inline PromParse parse_prometheus(const std::string& text) {
  PromParse r;
  static const std::regex metric_name(R"([a-zA-Z_:][a-zA-Z0-9_:]*)");
  static const std::regex label_name(R"([a-zA-Z_][a-zA-Z0-9_]*)");
  static const std::set<std::string> kTypes = {"counter", "gauge", "histogram", "summary",
                                               "untyped"};
  std::set<std::string> helped, finished;
  std::string current;  // the family whose samples are being read
  std::set<std::string> seen_series;
  auto family_of = [&](const std::string& name) -> std::string {
    if (r.types.count(name)) return name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        const std::string base = name.substr(0, name.size() - s.size());
        auto it = r.types.find(base);
        if (it != r.types.end() && (it->second == "histogram" || it->second == "summary")) {
          return base;
        }
      }
    }
    return "";
  };
  std::istringstream in(text);
  std::string line;
  int n = 0;
  auto fail = [&](const std::string& why) {
    r.error = "line " + std::to_string(n) + ": " + why + ": " + line;
    return r;
  };
  if (!text.empty() && text.back() != '\n') {
    r.error = "the text does not end with a newline";
    return r;
  }
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) return fail("empty line");
    if (line[0] == '#') {
      std::istringstream words(line);
      std::string hash, kind, name;
      words >> hash >> kind >> name;
      if (kind != "HELP" && kind != "TYPE") continue;  // a plain comment
      if (!std::regex_match(name, metric_name)) return fail("bad metric name");
      if (finished.count(name) || (name == current)) {
        return fail(kind + " after the family's samples");
      }
      if (kind == "HELP") {
        if (!helped.insert(name).second) return fail("second HELP");
      } else {
        std::string type, extra;
        words >> type;
        if (!kTypes.count(type)) return fail("unknown type");
        if (words >> extra) return fail("text after the type");
        if (!r.types.emplace(name, type).second) return fail("second TYPE");
      }
      continue;
    }
    // name{labels} value [timestamp]
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ')
      ++i;
    PromSample s;
    s.name = line.substr(0, i);
    if (!std::regex_match(s.name, metric_name)) return fail("bad metric name");
    std::string series = s.name + "{";
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t eq = line.find('=', i);
        if (eq == std::string::npos) return fail("label without =");
        const std::string key = line.substr(i, eq - i);
        if (!std::regex_match(key, label_name)) return fail("bad label name '" + key + "'");
        if (eq + 1 >= line.size() || line[eq + 1] != '"') return fail("label value not quoted");
        std::string value;
        size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\') {
            if (j + 1 >= line.size()) return fail("dangling escape");
            const char e = line[++j];
            if (e == 'n') {
              value += '\n';
            } else if (e == '\\' || e == '"') {
              value += e;
            } else {
              return fail("bad escape");
            }
          } else if (line[j] == '\n') {
            return fail("raw newline in a label value");
          } else {
            value += line[j];
          }
        }
        if (j >= line.size()) return fail("unterminated label value");
        if (!s.labels.emplace(key, value).second) return fail("label repeated");
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return fail("unterminated label set");
      ++i;
    }
    for (const auto& [k, v] : s.labels)
      series += k + "=" + v + ",";
    if (i >= line.size() || line[i] != ' ') return fail("no space before the value");
    std::istringstream rest(line.substr(i + 1));
    std::string value, timestamp, extra;
    rest >> value >> timestamp >> extra;
    if (!prom_number(value, s.value)) return fail("bad value");
    if (!extra.empty()) return fail("text after the timestamp");
    if (!timestamp.empty() && !std::regex_match(timestamp, std::regex(R"(-?[0-9]+)"))) {
      return fail("bad timestamp");
    }
    const std::string family = family_of(s.name);
    if (family.empty()) return fail("sample without a TYPE for its family");
    if (family != current) {
      if (finished.count(family)) return fail("family's samples are not contiguous");
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    if (!seen_series.insert(series).second) return fail("duplicate sample");
    if (r.types[family] == "counter" && s.value < 0) return fail("negative counter");
    r.samples.push_back(std::move(s));
  }
  // Histograms.
  for (const auto& [family, type] : r.types) {
    if (type != "histogram") continue;
    struct Series {
      std::vector<std::pair<double, double>> buckets;  // le, count
      bool has_sum = false, has_count = false;
      double count = 0;
    };
    std::map<std::string, Series> all;
    for (const PromSample& s : r.samples) {
      if (family_of(s.name) != family) continue;
      std::string key;
      for (const auto& [k, v] : s.labels) {
        if (k != "le") key += k + "=" + v + ",";
      }
      Series& se = all[key];
      if (s.name == family + "_bucket") {
        auto le = s.labels.find("le");
        double bound = 0;
        if (le == s.labels.end() || !prom_number(le->second, bound)) {
          r.error = family + " bucket without a numeric le";
          return r;
        }
        se.buckets.emplace_back(bound, s.value);
      } else if (s.name == family + "_sum") {
        se.has_sum = true;
      } else if (s.name == family + "_count") {
        se.has_count = true;
        se.count = s.value;
      } else {
        r.error = family + ": sample " + s.name + " is not _bucket, _sum or _count";
        return r;
      }
    }
    for (const auto& [key, se] : all) {
      const std::string where = family + "{" + key + "}";
      if (!se.has_sum || !se.has_count) {
        r.error = where + " lacks _sum or _count";
        return r;
      }
      if (se.buckets.empty() || !std::isinf(se.buckets.back().first)) {
        r.error = where + " does not end with le=\"+Inf\"";
        return r;
      }
      for (size_t k = 1; k < se.buckets.size(); ++k) {
        if (!(se.buckets[k].first > se.buckets[k - 1].first)) {
          r.error = where + " has buckets out of le order";
          return r;
        }
        if (se.buckets[k].second < se.buckets[k - 1].second) {
          r.error = where + " has a bucket count that decreases";
          return r;
        }
      }
      if (se.buckets.back().second != se.count) {
        r.error = where + ": +Inf bucket != _count";
        return r;
      }
    }
  }
  return r;
}

}  // namespace kvpool::testing

#include "common/prometheus.h"

#include <cinttypes>
#include <cstdio>
#include <string_view>

#include "common/stats_counters.h"

namespace kvpool::stats {

namespace {

class Out {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help) {
    text_ += "# HELP ";
    text_ += name;
    text_ += ' ';
    text_ += help;
    text_ += "\n# TYPE ";
    text_ += name;
    text_ += ' ';
    text_ += type;
    text_ += '\n';
  }
  // name{labels} value; `labels` already escaped and joined ("" = none).
  void sample(std::string_view name, const std::string& labels, uint64_t value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIu64, value);
    line(name, labels, buf);
  }
  void sample(std::string_view name, const std::string& labels, double value) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.10g", value);
    line(name, labels, buf);
  }
  std::string take() { return std::move(text_); }

 private:
  void line(std::string_view name, const std::string& labels, const char* value) {
    text_ += name;
    if (!labels.empty()) {
      text_ += '{';
      text_ += labels;
      text_ += '}';
    }
    text_ += ' ';
    text_ += value;
    text_ += '\n';
  }
  std::string text_;
};

std::string label(std::string_view key, std::string_view value) {
  std::string s(key);
  s += "=\"";
  s += escape_label(value);
  s += '"';
  return s;
}

void histograms(Out& out, const char* name, const char* help, const OpLatency (&ops)[kMaxOps]) {
  out.family(name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  for (const OpLatency& h : ops) {
    if (h.count == 0 || h.name[0] == '\0') continue;
    const std::string op = label("op", h.name);
    uint64_t cumulative = 0;
    for (uint32_t i = 0; i + 1 < kLatencyBuckets; ++i) {
      cumulative += h.buckets[i];
      char le[40];
      std::snprintf(le, sizeof le, "%.10g", static_cast<double>(bucket_upper_ns(i)) * 1e-9);
      out.sample(bucket, op + "," + label("le", le), cumulative);
    }
    out.sample(bucket, op + ",le=\"+Inf\"", h.count);
    out.sample(std::string(name) + "_sum", op, static_cast<double>(h.sum_ns) * 1e-9);
    out.sample(std::string(name) + "_count", op, h.count);
  }
}

}  // namespace

std::string escape_label(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string prometheus_text(const Snapshot& s, std::string_view pool) {
  Out out;
  std::vector<size_t> shown;
  std::vector<std::string> lbl;
  for (size_t i = 0; i < s.pools.size(); ++i) {
    if (!pool.empty() && s.pool_name(i) != pool) continue;
    shown.push_back(i);
    lbl.push_back(label("pool", s.pool_name(i)));
  }
  // One per-pool family: `field` picks the value.
  auto per_pool = [&](const char* name, const char* type, const char* help, auto field) {
    out.family(name, type, help);
    for (size_t k = 0; k < shown.size(); ++k)
      out.sample(name, lbl[k], static_cast<uint64_t>(field(s.pools[shown[k]])));
  };

  out.family("kvpool_pages", "gauge", "Pages by state.");
  for (size_t k = 0; k < shown.size(); ++k) {
    const PoolStats& p = s.pools[shown[k]];
    out.sample("kvpool_pages", lbl[k] + ",state=\"free\"", uint64_t{p.free});
    out.sample("kvpool_pages", lbl[k] + ",state=\"in_use\"", uint64_t{p.in_use});
    out.sample("kvpool_pages", lbl[k] + ",state=\"cached\"", uint64_t{p.cached});
  }
  per_pool("kvpool_pool_bytes", "gauge", "Bytes of pool memory.",
           [](const PoolStats& p) { return p.segment_bytes; });
  per_pool("kvpool_page_bytes", "gauge", "Bytes from one page to the next.",
           [](const PoolStats& p) { return p.page_stride; });
  per_pool("kvpool_sessions", "gauge", "Worker sessions attached to the pool.",
           [](const PoolStats& p) { return p.sessions; });
  // The pool counter table's rows, but those shown by hand below under a label.
  for (const PoolCounter& c : kPoolCounters) {
    if (c.form == PromForm::by_hand) continue;
    out.family(c.family, c.kind == CounterKind::counter ? "counter" : "gauge", c.help);
    for (size_t k = 0; k < shown.size(); ++k) {
      const PoolStats& p = s.pools[shown[k]];
      out.sample(c.family, lbl[k],
                 c.get(p) * (c.form == PromForm::as_tokens ? uint64_t{p.tokens_per_page} : 1));
    }
  }
  // The rows shown by hand: a family each pair shares under a label, named and described by the
  // table.
  const PoolCounter& resizes = pool_counter("grows");
  out.family(resizes.family, "counter", resizes.help);
  for (size_t k = 0; k < shown.size(); ++k) {
    const PoolStats& p = s.pools[shown[k]];
    out.sample(resizes.family, lbl[k] + ",direction=\"grow\"", p.grows);
    out.sample(resizes.family, lbl[k] + ",direction=\"shrink\"", p.shrinks);
  }
  const PoolCounter& copies = pool_counter("host_demote_ns");
  out.family(copies.family, "counter", copies.help);
  for (size_t k = 0; k < shown.size(); ++k) {
    const PoolStats& p = s.pools[shown[k]];
    out.sample(copies.family, lbl[k] + ",direction=\"demote\"",
               static_cast<double>(p.host_demote_ns) / 1e9);
    out.sample(copies.family, lbl[k] + ",direction=\"promote\"",
               static_cast<double>(p.host_promote_ns) / 1e9);
  }

  // The daemon table's rows, but those shown by hand below and those shown nowhere.
  const DaemonStats& d = s.daemon;
  for (const DaemonCounter& c : kDaemonCounters) {
    if (c.form == PromForm::by_hand || c.form == PromForm::none) continue;
    out.family(c.family, c.kind == CounterKind::counter ? "counter" : "gauge", c.help);
    if (c.form == PromForm::ms_as_seconds) {
      out.sample(c.family, "", static_cast<double>(c.get(d)) / 1000.0);
    } else {
      out.sample(c.family, "", c.get(d));
    }
  }
  // The by-hand rows' help describes their raw values; the families show reckoned ones.
  const DaemonCounter& events = daemon_counter("event_next_seq");
  out.family(events.family, "counter", "Index events (stored, removed, cleared) logged.");
  out.sample(events.family, "", d.event_next_seq > 0 ? d.event_next_seq - 1 : 0);
  const DaemonCounter& reloads = daemon_counter("reloads");
  out.family(reloads.family, "counter", "Configuration reloads, by result.");
  out.sample(reloads.family, "result=\"applied\"", d.reloads - d.reload_failures);
  out.sample(reloads.family, "result=\"refused\"", d.reload_failures);

  histograms(out, "kvpool_op_duration_seconds",
             "Time the daemon spent handling one request, by operation.", s.service);
  histograms(out, "kvpool_request_duration_seconds",
             "Time from a request's arrival to its reply being queued, by operation.", s.request);
  return out.take();
}

}  // namespace kvpool::stats

// kvpoolctl verbs that ask the daemon directly: sessions, pages, evict/flush, resize, prefixes,
// reload.
#include <algorithm>
#include <string>

#include "client/ctl/common.h"
#include "common/block_hash.h"

namespace kvpool::ctl {

int sessions_verb(const Globals& g) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->sessions();
  if (!succeeded(r)) return 1;
  const uint64_t self = c->session_id();
  if (g.json) {
    std::printf("{\"schema\":%d,\"pool\":\"%s\",\"sessions\":[", kSchema,
                json_escape(c->pool().pool_name).c_str());
    bool first = true;
    for (const auto& s : r.value()) {
      if (s.id == self) continue;
      std::printf(
          "%s{\"id\":%llu,\"pid\":%u,\"uid\":%u,\"held_pages\":%u,\"worker\":\"%s\","
          "\"tenant\":\"%s\"}",
          first ? "" : ",", static_cast<unsigned long long>(s.id), s.pid, s.uid, s.held_pages,
          json_escape(s.worker).c_str(), json_escape(s.tenant).c_str());
      first = false;
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("%8s %8s %8s %10s  %-12s %s\n", "session", "pid", "uid", "pages", "tenant", "worker");
  for (const auto& s : r.value()) {
    if (s.id == self) continue;
    std::printf("%8llu %8u %8u %10s  %-12s %s\n", static_cast<unsigned long long>(s.id), s.pid,
                s.uid, count_text(s.held_pages, g.raw).c_str(), display_text(s.tenant).c_str(),
                display_text(s.worker).c_str());
  }
  return 0;
}

// A map of the pool: each character stands for `per_cell` consecutive pages and shows the state
// most of them are in ('.' free, '#' in use, 'o' cached; ties go to in use, then cached).
int pages_verb(const Globals& g, uint32_t width) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->pages();
  if (!succeeded(r)) return 1;
  const std::vector<uint8_t>& st = r.value();
  uint64_t count[3] = {0, 0, 0};
  for (const uint8_t s : st)
    ++count[s];
  if (g.json) {
    // Runs of equal state: [state, length], in page order.
    std::printf(
        "{\"schema\":%d,\"pool\":\"%s\",\"pages\":%zu,\"free\":%llu,\"in_use\":%llu,"
        "\"cached\":%llu,\"runs\":[",
        kSchema, json_escape(c->pool().pool_name).c_str(), st.size(),
        static_cast<unsigned long long>(count[0]), static_cast<unsigned long long>(count[1]),
        static_cast<unsigned long long>(count[2]));
    for (size_t i = 0; i < st.size();) {
      size_t j = i;
      while (j < st.size() && st[j] == st[i])
        ++j;
      std::printf("%s[%u,%zu]", i == 0 ? "" : ",", st[i], j - i);
      i = j;
    }
    std::printf("]}\n");
    return 0;
  }
  constexpr uint32_t kMaxRows = 32;
  const uint64_t cells =
      std::max<uint64_t>(1, std::min<uint64_t>(st.size(), uint64_t{width} * kMaxRows));
  const uint64_t per_cell = (st.size() + cells - 1) / cells;
  std::printf(
      "pool %s: %zu pages, each character %llu page(s):  . free (%llu)  # in use (%llu)  "
      "o cached (%llu)\n",
      display_text(c->pool().pool_name).c_str(), st.size(),
      static_cast<unsigned long long>(per_cell), static_cast<unsigned long long>(count[0]),
      static_cast<unsigned long long>(count[1]), static_cast<unsigned long long>(count[2]));
  std::string row;
  uint64_t row_start = 0;
  for (uint64_t first = 0; first < st.size(); first += per_cell) {
    uint64_t n[3] = {0, 0, 0};
    for (uint64_t p = first; p < std::min<uint64_t>(st.size(), first + per_cell); ++p)
      ++n[st[p]];
    char ch = '.';
    if (n[1] > 0 && n[1] >= n[0] && n[1] >= n[2]) {
      ch = '#';
    } else if (n[2] > 0 && n[2] >= n[0]) {
      ch = 'o';
    }
    if (row.empty()) row_start = first;
    row += ch;
    if (row.size() == width) {
      std::printf("%8llu  %s\n", static_cast<unsigned long long>(row_start), row.c_str());
      row.clear();
    }
  }
  if (!row.empty())
    std::printf("%8llu  %s\n", static_cast<unsigned long long>(row_start), row.c_str());
  return 0;
}

int drop_verb(const Globals& g, uint32_t count) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = count == 0 ? c->flush() : c->evict(count);
  if (!succeeded(r)) return 1;
  const char* verb = count == 0 ? "flushed" : "evicted";
  if (g.json) {
    std::printf("{\"schema\":%d,\"pool\":\"%s\",\"%s\":%u}\n", kSchema,
                json_escape(c->pool().pool_name).c_str(), verb, r.value());
  } else {
    std::printf("%s %u cached page(s) from pool %s\n", verb, r.value(),
                display_text(c->pool().pool_name).c_str());
  }
  return 0;
}

int resize_verb(const Globals& g, uint32_t pages) {
  auto c = connect(g);
  if (!c) return 1;
  const uint32_t before = c->pool().num_pages;
  auto r = c->call(wire::ResizeRequest{pages});
  if (!succeeded(r)) return 1;
  const auto* reply = std::get_if<wire::ResizeReply>(&r.value());
  if (reply == nullptr) {
    std::fprintf(stderr, "kvpoolctl: the daemon answered resize with another reply\n");
    return 1;
  }
  if (g.json) {
    std::printf("{\"schema\":%d,\"pool\":\"%s\",\"from\":%u,\"pages\":%u}\n", kSchema,
                json_escape(c->pool().pool_name).c_str(), before, reply->pages);
  } else {
    std::printf("pool %s: %u pages (was %u)\n", display_text(c->pool().pool_name).c_str(),
                reply->pages, before);
  }
  return 0;
}

int prefixes_verb(const Globals& g, uint32_t limit) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->prefixes(limit);
  if (!succeeded(r)) return 1;
  const wire::PrefixesReply& p = r.value();
  const uint64_t t = c->pool().geometry.tokens_per_page;
  const std::string pool = c->pool().pool_name;
  using E = wire::PrefixEntry;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"pool\":\"%s\",\"tokens_per_page\":%llu,\"indexed\":%u,"
        "\"prefixes\":[",
        kSchema, json_escape(pool).c_str(), static_cast<unsigned long long>(t), p.indexed);
    for (size_t i = 0; i < p.entries.size(); ++i) {
      const E& e = p.entries[i];
      const bool known = e.depth != E::kUnknownDepth;
      const std::string depth = known ? std::to_string(e.depth) : "null";
      const std::string blocks = known ? std::to_string(uint64_t{e.depth} + 1) : "null";
      const std::string tokens = known ? std::to_string((uint64_t{e.depth} + 1) * t) : "null";
      const std::string idle = e.idle_s == E::kNever ? "null" : std::to_string(e.idle_s);
      const uint64_t hit_tokens = uint64_t{e.hits} * t;
      std::printf(
          "%s{\"hash\":\"%s\",\"page\":%u,\"hits\":%u,\"hit_tokens\":%llu,\"depth\":%s,"
          "\"prefix_blocks\":%s,\"prefix_tokens\":%s,\"state\":\"%s\",\"age_s\":%u,"
          "\"idle_s\":%s,\"tenant\":\"%s\"}",
          i == 0 ? "" : ",", to_hex(e.hash).c_str(), e.page, e.hits,
          static_cast<unsigned long long>(hit_tokens), depth.c_str(), blocks.c_str(),
          tokens.c_str(), e.state == wire::PagesReply::kCached ? "cached" : "in_use", e.age_s,
          idle.c_str(), json_escape(e.tenant).c_str());
    }
    std::printf("]}\n");
    return 0;
  }
  std::printf("pool %s: %s block(s) indexed, %llu tokens each; the %zu most hit:\n",
              display_text(pool).c_str(), count_text(p.indexed, g.raw).c_str(),
              static_cast<unsigned long long>(t), p.entries.size());
  if (p.entries.empty()) return 0;
  std::printf("%8s %11s %6s %14s  %-7s %7s %9s  %-16s %s\n", "hits", "hit tokens", "depth",
              "prefix tokens", "state", "age", "last hit", "block", "tenant");
  for (const E& e : p.entries) {
    const bool known = e.depth != E::kUnknownDepth;
    const std::string last = e.idle_s == E::kNever ? "never" : std::to_string(e.idle_s) + "s ago";
    std::printf("%8s %11s %6s %14s  %-7s %6us %9s  %-16s %s\n", count_text(e.hits, g.raw).c_str(),
                count_text(uint64_t{e.hits} * t, g.raw).c_str(),
                known ? std::to_string(e.depth).c_str() : "-",
                known ? count_text((uint64_t{e.depth} + 1) * t, g.raw).c_str() : "-",
                e.state == wire::PagesReply::kCached ? "cached" : "in use", e.age_s, last.c_str(),
                to_hex(e.hash).substr(0, 16).c_str(), display_text(e.tenant).c_str());
  }
  return 0;
}

int reload_verb(const Globals& g) {
  auto c = connect(g);
  if (!c) return 1;
  auto r = c->reload();
  if (!succeeded(r)) return 1;
  const wire::ReloadReply& o = r.value();
  static constexpr const char* kOutcomes[] = {"applied", "refused", "no_config_file"};
  if (g.json) {
    std::printf("{\"schema\":%d,\"outcome\":\"%s\",\"message\":\"%s\",\"restart\":[", kSchema,
                kOutcomes[o.outcome], json_escape(o.message).c_str());
    for (size_t i = 0; i < o.restart.size(); ++i)
      std::printf("%s\"%s\"", i == 0 ? "" : ",", json_escape(o.restart[i]).c_str());
    std::printf("]}\n");
  } else if (o.outcome == wire::ReloadReply::kApplied) {
    std::printf("reloaded %s\n", display_text(o.message).c_str());
    if (!o.restart.empty()) {
      std::string keys;
      for (const std::string& k : o.restart)
        keys += (keys.empty() ? "" : ", ") + display_text(k);
      std::printf("changed but waiting for a restart (running values kept): %s\n", keys.c_str());
    }
  } else if (o.outcome == wire::ReloadReply::kRefused) {
    std::fprintf(stderr, "kvpoolctl: reload refused, the running configuration stays: %s\n",
                 display_text(o.message).c_str());
  } else {
    std::fprintf(stderr, "kvpoolctl: %s\n", display_text(o.message).c_str());
  }
  return o.outcome == wire::ReloadReply::kApplied ? 0 : 1;
}

}  // namespace kvpool::ctl

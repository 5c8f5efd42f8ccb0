#include "client/ctl/common.h"

#include "client/connection/stats_reader.h"
#include "common/byte_units.h"

namespace kvpool::ctl {

std::string bytes_text(uint64_t b, bool raw) {
  if (raw) return std::to_string(b);
  if (b < 1024) return std::to_string(b) + " B";
  const ScaledBytes s = scale_bytes(b);
  char buf[48];
  if (b >= 1000000000ull) {
    std::snprintf(buf, sizeof buf, "%.2f %s (%.1f GB)", s.value, s.unit, double(b) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", s.value, s.unit);
  }
  return buf;
}

std::string count_text(uint64_t n, bool raw) {
  std::string digits = std::to_string(n);
  if (raw) return digits;
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string duration_text(double ns) {
  char buf[32];
  if (ns < 1e3) {
    std::snprintf(buf, sizeof buf, "%.0f ns", ns);
  } else if (ns < 1e6) {
    std::snprintf(buf, sizeof buf, "%.1f us", ns / 1e3);
  } else if (ns < 1e9) {
    std::snprintf(buf, sizeof buf, "%.2f ms", ns / 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f s", ns / 1e9);
  }
  return buf;
}

std::unique_ptr<client::Connection> connect(const Globals& g) {
  // kvpoolctl hashes nothing: its hello names no scheme, so it inspects pools of every scheme.
  auto c = client::Connection::attach(g.socket, "kvpoolctl", g.pool,
                                      client::Connection::Memory::none, 0, HashScheme{});
  if (!c.ok()) {
    std::fprintf(stderr, "kvpoolctl: %s\n", display_text(c.error().message).c_str());
    return nullptr;
  }
  return std::move(c.value());
}

bool fetch_snapshot(const Globals& g, Fetched& out) {
  if (!g.no_shm && client::read_stats_segment(g.socket, out.snapshot).empty()) {
    out.from_segment = true;
    if (out.snapshot.find_pool(g.pool) != nullptr) return true;
    std::fprintf(stderr, "kvpoolctl: kvpoold has no pool named %s\n", display_text(g.pool).c_str());
    return false;
  }
  auto c = connect(g);
  if (!c) return false;
  auto r = c->snapshot();
  if (!succeeded(r)) return false;
  const std::string why = stats::decode(r.value().bytes, r.value().layout_version, out.snapshot);
  if (!why.empty()) {
    std::fprintf(stderr, "kvpoolctl: %s\n", display_text(why).c_str());
    return false;
  }
  out.from_segment = false;
  out.tenant = c->pool().tenant;
  // This query's own session is not a worker.
  if (out.snapshot.daemon.sessions > 0) --out.snapshot.daemon.sessions;
  for (size_t i = 0; i < out.snapshot.pools.size(); ++i) {
    if (out.snapshot.pool_name(i) == c->pool().pool_name && out.snapshot.pools[i].sessions > 0) {
      --out.snapshot.pools[i].sessions;
    }
  }
  return true;
}

}  // namespace kvpool::ctl

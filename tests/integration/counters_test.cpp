// The counter tables (common/stats_counters.h) through every surface: a real kvpoold with a host
// tier is driven until most counters move, then every row of the pool table and of the daemon
// table must show, with the same value, in the stats reply, the stats segment, kvpoolctl stats
// --json, the Prometheus text and the C API (Python: tests/python/test_connection.py). A row
// added to a table that some surface leaves out fails here.

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "client/connection/stats_reader.h"
#include "common/stats_counters.h"
#include "tests/common/prom_parser.h"
#include "tests/integration/ctl_helpers.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

constexpr char kPool[] = R"(
pools:
  - name: default
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 8 pages
    host_tier: 16 pages
)";

// The value Prometheus shows for a row of pool `default`, or -1 when it has none.
double prometheus_value(const PromParse& p, const stats::PoolCounter& c) {
  const std::map<std::string, std::string> pool{{"pool", "default"}};
  if (c.form != stats::PromForm::by_hand) return p.value(std::string(c.family), pool);
  // The rows shown by hand under a label (common/prometheus.cpp).
  const auto labelled = [&](const char* direction) {
    return p.value(std::string(c.family), {{"pool", "default"}, {"direction", direction}});
  };
  if (c.name == "grows") return labelled("grow");
  if (c.name == "shrinks") return labelled("shrink");
  if (c.name == "host_demote_ns") return labelled("demote") * 1e9;
  if (c.name == "host_promote_ns") return labelled("promote") * 1e9;
  return -1;
}

// The value Prometheus shows for a row of the daemon table (in the row's own unit), or -1.
double prometheus_value(const PromParse& p, const stats::DaemonCounter& c) {
  const std::string family(c.family);
  switch (c.form) {
    case stats::PromForm::as_is:
      return p.value(family, {});
    case stats::PromForm::ms_as_seconds:
      return p.value(family, {}) * 1000.0;
    case stats::PromForm::by_hand:
      if (c.name == "event_next_seq") return p.value(family, {}) + 1;  // events logged so far
      if (c.name == "reload_failures") return p.value(family, {{"result", "refused"}});
      if (c.name == "reloads") {
        return p.value(family, {{"result", "applied"}}) + p.value(family, {{"result", "refused"}});
      }
      return -1;
    default:
      return -1;
  }
}

// The value of the row named `name` among `values` (a table's values, in its order).
template <class Row, size_t N>
uint64_t value_in(const Row (&table)[N], const std::vector<uint64_t>& values,
                  std::string_view name) {
  for (size_t i = 0; i < N && i < values.size(); ++i) {
    if (table[i].name == name) return values[i];
  }
  return 0;
}

// What kvpoolctl stats shows (the Prometheus text and --json) and what the C API reads through
// `get` (kvpool_get_counters or kvpool_get_daemon_counters): `rows` values and a few more slots.
struct Surfaces {
  PromParse prom;
  nlohmann::json json;
  std::vector<uint64_t> from_c;
};
using GetValues = int (*)(kvpool_conn*, uint64_t*, size_t, size_t*);
void read_surfaces(const Daemon& d, GetValues get, size_t rows, Surfaces& out) {
  std::string prom;
  ASSERT_EQ(ctl(d, "stats --format prom", prom), 0) << prom;
  out.prom = parse_prometheus(prom);
  ASSERT_EQ(out.prom.error, "") << prom;
  out.json = ctl_json(d, "stats");
  kvpool_conn* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c-api", nullptr, &c, err, sizeof err), 0) << err;
  out.from_c.assign(rows + 4, 0);
  size_t written = 0;
  EXPECT_EQ(get(c, out.from_c.data(), out.from_c.size(), &written), 0);
  EXPECT_EQ(written, rows);
  kvpool_detach(c);
}

TEST(Counters, EveryRowOfTheTableShowsOnEverySurface) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  // Traffic that moves the counters: publish 8 blocks into the 8-page pool, publish 4 more (the
  // first go down to the host tier), look the first up again (promoted back), a duplicate.
  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 12; ++i)
    chain.push_back(BlockHash{i + 1, 7});
  for (int round = 0; round < 2; ++round) {
    const size_t first = round == 0 ? 0 : 8;
    const size_t n = round == 0 ? 8 : 4;
    auto pages = w->alloc(static_cast<uint32_t>(n));
    ASSERT_TRUE(pages.ok()) << pages.error().message;
    std::vector<PublishItem> items;
    for (size_t i = 0; i < n; ++i)
      items.push_back(PublishItem{pages.value()[i], chain[first + i]});
    ASSERT_TRUE(w->publish(items).ok());
    ASSERT_TRUE(w->release(pages.value()).ok());
  }
  auto hit = w->lookup(std::vector<BlockHash>(chain.begin(), chain.begin() + 2));
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  ASSERT_TRUE(w->release(hit.value()).ok());

  // The stats reply: every row, in table order.
  auto reply = w->stats();
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  const std::vector<uint64_t> values = reply.value().counters;
  ASSERT_EQ(values.size(), stats::kNumPoolCounters);
  const auto value_of = [&](std::string_view name) {
    return value_in(stats::kPoolCounters, values, name);
  };
  // A promotion allocates and publishes the pages it brings back.
  EXPECT_GE(value_of("host_promoted"), 1u);
  EXPECT_EQ(value_of("allocated"), 12u + value_of("host_promoted"));
  EXPECT_EQ(value_of("published"), 12u + value_of("host_promoted"));
  EXPECT_EQ(value_of("lookups"), 1u);
  EXPECT_GE(value_of("host_demoted"), 2u);
  EXPECT_EQ(value_of("host_slots"), 16u);
  EXPECT_EQ(value_of("max_pages"), 8u);
  EXPECT_EQ(value_of("allocated"), reply.value().counter("allocated"));

  // The stats segment, once it shows the same calls (it trails by up to 10 ms).
  stats::Snapshot snap;
  ASSERT_TRUE(wait_until([&] {
    return client::read_stats_segment(d.socket(), snap).empty() &&
           snap.pools[0].lookups == value_of("lookups") &&
           snap.pools[0].released == value_of("released");
  }));
  Surfaces got;
  ASSERT_NO_FATAL_FAILURE(read_surfaces(d, kvpool_get_counters, stats::kNumPoolCounters, got));
  const PromParse& parsed = got.prom;
  const nlohmann::json& json = got.json;
  const std::vector<uint64_t>& from_c = got.from_c;
  ASSERT_EQ(kvpool_counter_count(), stats::kNumPoolCounters);
  EXPECT_EQ(kvpool_counter_name(stats::kNumPoolCounters), nullptr);

  for (size_t i = 0; i < stats::kNumPoolCounters; ++i) {
    const stats::PoolCounter& row = stats::kPoolCounters[i];
    const std::string name(row.name);
    EXPECT_EQ(row.get(snap.pools[0]), values[i]) << name << ": segment against the stats reply";
    ASSERT_TRUE(json["counters"].contains(name)) << name << " is missing from kvpoolctl stats";
    EXPECT_EQ(json["counters"][name].get<uint64_t>(), row.get(snap.pools[0])) << name;
    const double scale = row.form == stats::PromForm::as_tokens ? 16.0 : 1.0;
    const double expected = static_cast<double>(values[i]) * scale;
    // Seconds are printed with 10 significant digits.
    EXPECT_NEAR(prometheus_value(parsed, row), expected, 1e-6 * expected + 1e-3)
        << name << " in Prometheus (" << row.family << ")";
    ASSERT_EQ(parsed.types.count(std::string(row.family)), 1u) << row.family;
    EXPECT_EQ(parsed.types.at(std::string(row.family)),
              row.kind == stats::CounterKind::counter ? "counter" : "gauge")
        << row.family;
    EXPECT_STREQ(kvpool_counter_name(i), name.c_str());
    EXPECT_EQ(from_c[i], values[i]) << name << " from the C API";
  }
}

TEST(Counters, EveryDaemonRowShowsOnEverySurface) {
  Daemon d(kPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto w = attach(d, "worker");
  ASSERT_NE(w, nullptr);
  // Traffic that moves the daemon's counters: index events, one reload applied, one refused.
  auto pages = w->alloc(2);
  ASSERT_TRUE(pages.ok()) << pages.error().message;
  const std::vector<PublishItem> items{PublishItem{pages.value()[0], BlockHash{1, 1}},
                                       PublishItem{pages.value()[1], BlockHash{2, 1}}};
  ASSERT_TRUE(w->publish(items).ok());
  std::string out;
  ASSERT_EQ(ctl(d, "reload", out), 0) << out;
  std::ofstream(d.config_path(), std::ios::app) << "no_such_key: 1\n";
  ASSERT_EQ(ctl(d, "reload", out), 1) << out;

  auto reply = w->stats();
  ASSERT_TRUE(reply.ok()) << reply.error().message;
  const std::vector<uint64_t> values = reply.value().daemon_counters;
  ASSERT_EQ(values.size(), stats::kNumDaemonCounters);
  const auto value_of = [&](std::string_view name) {
    return value_in(stats::kDaemonCounters, values, name);
  };
  EXPECT_EQ(value_of("pid"), static_cast<uint64_t>(d.pid()));
  EXPECT_EQ(value_of("num_pools"), 1u);
  EXPECT_EQ(value_of("reloads"), 2u);
  EXPECT_EQ(value_of("reload_failures"), 1u);
  EXPECT_GE(value_of("event_next_seq"), 3u);  // two stored events, numbered from 1
  EXPECT_GE(value_of("sessions"), 1u);

  // Rows that move with time or with the surfaces' own connections: shown, not compared.
  const std::set<std::string_view> moving{"published_mono_ns", "uptime_ms", "sessions",
                                          "buffered_bytes"};
  stats::Snapshot snap;
  ASSERT_TRUE(wait_until([&] {
    return client::read_stats_segment(d.socket(), snap).empty() &&
           snap.daemon.reload_failures == value_of("reload_failures") &&
           snap.daemon.event_next_seq == value_of("event_next_seq");
  }));
  Surfaces got;
  ASSERT_NO_FATAL_FAILURE(
      read_surfaces(d, kvpool_get_daemon_counters, stats::kNumDaemonCounters, got));
  const PromParse& parsed = got.prom;
  const nlohmann::json& json = got.json;
  const std::vector<uint64_t>& from_c = got.from_c;
  ASSERT_EQ(kvpool_daemon_counter_count(), stats::kNumDaemonCounters);
  EXPECT_EQ(kvpool_daemon_counter_name(stats::kNumDaemonCounters), nullptr);

  for (size_t i = 0; i < stats::kNumDaemonCounters; ++i) {
    const stats::DaemonCounter& row = stats::kDaemonCounters[i];
    const std::string name(row.name);
    EXPECT_STREQ(kvpool_daemon_counter_name(i), name.c_str());
    ASSERT_TRUE(json["daemon_counters"].contains(name)) << name << " is missing from kvpoolctl";
    if (row.form != stats::PromForm::none) {
      ASSERT_EQ(parsed.types.count(std::string(row.family)), 1u) << row.family;
      EXPECT_EQ(parsed.types.at(std::string(row.family)),
                row.kind == stats::CounterKind::counter ? "counter" : "gauge")
          << row.family;
      EXPECT_GE(prometheus_value(parsed, row), 0.0) << name << " in Prometheus";
    }
    if (moving.count(row.name) != 0) continue;
    EXPECT_EQ(row.get(snap.daemon), values[i]) << name << ": segment against the stats reply";
    EXPECT_EQ(json["daemon_counters"][name].get<uint64_t>(), values[i]) << name << " (kvpoolctl)";
    EXPECT_EQ(from_c[i], values[i]) << name << " from the C API";
    if (row.form != stats::PromForm::none) {
      const double expected = static_cast<double>(values[i]);
      // Seconds are printed with 10 significant digits.
      EXPECT_NEAR(prometheus_value(parsed, row), expected, 1e-6 * expected + 1e-3)
          << name << " in Prometheus (" << row.family << ")";
    }
  }
}

}  // namespace
}  // namespace kvpool::testing

// The stats snapshot (common/stats_layout.h): histogram buckets and quantiles, the codec, the
// seqlock under a concurrent writer, and the Prometheus text (common/prometheus.h) checked by
// the strict parser the integration tests use too.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/prometheus.h"
#include "common/stats_layout.h"
#include "tests/common/prom_parser.h"

namespace kvpool::stats {
namespace {

TEST(StatsHistogram, BucketsArePowersOfTwoFrom256ns) {
  EXPECT_EQ(latency_bucket(0), 0u);
  EXPECT_EQ(latency_bucket(256), 0u);
  EXPECT_EQ(latency_bucket(257), 1u);
  EXPECT_EQ(latency_bucket(512), 1u);
  EXPECT_EQ(latency_bucket(513), 2u);
  EXPECT_EQ(latency_bucket(uint64_t{1} << 30), kLatencyBuckets - 2);
  EXPECT_EQ(latency_bucket((uint64_t{1} << 30) + 1), kLatencyBuckets - 1);
  EXPECT_EQ(latency_bucket(UINT64_MAX), kLatencyBuckets - 1);
  EXPECT_EQ(bucket_upper_ns(0), 256u);
  EXPECT_EQ(bucket_upper_ns(kLatencyBuckets - 2), uint64_t{1} << 30);
  EXPECT_EQ(bucket_upper_ns(kLatencyBuckets - 1), 0u);
  for (uint64_t ns : {1ull, 300ull, 5000ull, 123456789ull}) {
    const uint32_t b = latency_bucket(ns);
    EXPECT_LE(ns, bucket_upper_ns(b)) << ns;
    if (b > 0) {
      EXPECT_GT(ns, bucket_upper_ns(b - 1)) << ns;
    }
  }
}

TEST(StatsHistogram, QuantilesStayInTheirBucketAndBelowTheMaximum) {
  OpLatency h;
  EXPECT_EQ(quantile_ns(h, 0.5), 0.0);
  for (int i = 0; i < 99; ++i)
    record(h, 1000);   // bucket (512, 1024]
  record(h, 1000000);  // one slow call
  EXPECT_EQ(h.count, 100u);
  EXPECT_EQ(h.sum_ns, 99u * 1000 + 1000000);
  EXPECT_EQ(h.max_ns, 1000000u);
  const double p50 = quantile_ns(h, 0.5);
  EXPECT_GT(p50, 512);
  EXPECT_LE(p50, 1024);
  EXPECT_LE(quantile_ns(h, 0.99), 1024);
  const double p100 = quantile_ns(h, 1.0);
  EXPECT_GT(p100, 524288);
  EXPECT_LE(p100, 1000000);
}

Snapshot sample(size_t pools) {
  Snapshot s;
  s.daemon.pid = 42;
  s.daemon.sessions = 3;
  s.daemon.event_next_seq = 17;
  set_name(s.service[2].name, "alloc");
  record(s.service[2], 700);
  set_name(s.request[2].name, "alloc");
  record(s.request[2], 900);
  s.pools.resize(pools);
  for (size_t i = 0; i < pools; ++i) {
    const std::string name = i == 0 ? "default" : "p\"o\\l\n" + std::to_string(i);
    set_name(s.pools[i].name, name, false);
    s.pools[i].name_len = static_cast<uint32_t>(name.size());
    set_name(s.pools[i].backend, "host");
    s.pools[i].total = 64;
    s.pools[i].free = 60;
    s.pools[i].in_use = 3;
    s.pools[i].cached = 1;
    s.pools[i].tokens_per_page = 16;
    s.pools[i].lookup_blocks = 10;
    s.pools[i].hit_blocks = 4;
  }
  return s;
}

TEST(StatsCodec, RoundTripAndValidation) {
  const Snapshot s = sample(2);
  std::vector<std::byte> bytes;
  encode(s, bytes);
  EXPECT_EQ(bytes.size(), snapshot_bytes(2));
  Snapshot d;
  ASSERT_EQ(decode(bytes, kLayoutVersion, d), "");
  EXPECT_EQ(d.daemon.num_pools, 2u);
  EXPECT_EQ(d.pool_name(1), "p\"o\\l\n1");
  EXPECT_EQ(d.backend(0), "host");
  EXPECT_EQ(d.service[2].count, 1u);
  EXPECT_EQ(d.find_pool("")->total, 64u);
  EXPECT_EQ(d.find_pool("nope"), nullptr);
  EXPECT_NE(decode(bytes, kLayoutVersion + 1, d), "");
  std::vector<std::byte> cut(bytes.begin(), bytes.end() - 8);
  EXPECT_NE(decode(cut, kLayoutVersion, d), "");
  std::vector<std::byte> bad = bytes;
  bad[offsetof(DaemonStats, num_pools)] = std::byte{5};  // says 5 pools, holds 2
  EXPECT_NE(decode(bad, kLayoutVersion, d), "");
  bad = bytes;
  const size_t backend = kSnapshotFixedBytes + offsetof(PoolStats, backend);
  std::memset(bad.data() + backend, 'x', sizeof(PoolStats::backend));  // unterminated
  EXPECT_NE(decode(bad, kLayoutVersion, d), "");
}

TEST(StatsSeqlock, ReadersSeeOnlyWholeSnapshots) {
  Snapshot s = sample(1);
  std::vector<std::byte> bytes;
  encode(s, bytes);
  std::vector<std::byte> segment(sizeof(SegmentHeader) + bytes.size());
  std::vector<std::byte> out;
  seqlock_init(segment.data(), bytes.size());
  EXPECT_NE(seqlock_read(segment.data(), segment.size(), out), "");  // nothing published yet
  seqlock_write(segment.data(), bytes);
  ASSERT_EQ(seqlock_read(segment.data(), segment.size(), out), "");
  EXPECT_EQ(out, bytes);
  EXPECT_NE(seqlock_read(segment.data(), 10, out), "");

  // A writer that keeps every counter of a snapshot equal; readers must never see them differ.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::thread writer([&] {
    Snapshot w = sample(1);
    std::vector<std::byte> b;
    for (uint64_t i = 1; !stop.load(std::memory_order_relaxed); ++i) {
      w.daemon.uptime_ms = w.daemon.reloads = w.pools[0].allocated = w.pools[0].flushed = i;
      encode(w, b);
      seqlock_write(segment.data(), b);
      writes.store(i, std::memory_order_relaxed);
      // A pause, as the daemon's publisher makes (it writes every 10 ms): a writer that rewrites
      // the 15 KB snapshot back to back leaves a reader on a 2-core machine almost no window to
      // copy it whole, and each read then gives up after kReadAttempts (minutes per test).
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int reads = 0;
  // Reads until 20,000 attempts have run and the writer has rewritten the snapshot 100 times
  // meanwhile, however the two threads are scheduled (a loaded machine may run the reader first).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int i = 0;
       (i < 20000 || writes.load() <= 100) && std::chrono::steady_clock::now() < deadline; ++i) {
    if (!seqlock_read(segment.data(), segment.size(), out).empty()) continue;
    Snapshot r;
    ASSERT_EQ(decode(out, kLayoutVersion, r), "");
    ASSERT_EQ(r.daemon.uptime_ms, r.daemon.reloads);
    ASSERT_EQ(r.daemon.uptime_ms, r.pools[0].allocated);
    ASSERT_EQ(r.daemon.uptime_ms, r.pools[0].flushed);
    ++reads;
  }
  stop = true;
  writer.join();
  EXPECT_GT(reads, 1000);
  EXPECT_GT(writes.load(), 100u);  // the reads ran while the snapshot was being rewritten
}

TEST(StatsPrometheus, TextParsesStrictlyAndEscapesLabels) {
  const Snapshot s = sample(2);
  const std::string text = prometheus_text(s);
  const auto p = testing::parse_prometheus(text);
  ASSERT_EQ(p.error, "") << text;
  EXPECT_EQ(p.types.at("kvpool_op_duration_seconds"), "histogram");
  EXPECT_EQ(p.value("kvpool_pages", {{"pool", "default"}, {"state", "free"}}), 60);
  EXPECT_EQ(p.value("kvpool_pages", {{"pool", "p\"o\\l\n1"}, {"state", "cached"}}), 1);
  EXPECT_EQ(p.value("kvpool_prefix_hit_tokens_total", {{"pool", "default"}}), 64);
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_count", {{"op", "alloc"}}), 1);
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_bucket", {{"op", "alloc"}, {"le", "+Inf"}}), 1);
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_bucket", {{"op", "alloc"}, {"le", "5.12e-07"}}), 0);
  EXPECT_EQ(p.value("kvpool_op_duration_seconds_bucket", {{"op", "alloc"}, {"le", "1.024e-06"}}),
            1);
  EXPECT_NE(text.find("pool=\"p\\\"o\\\\l\\n1\""), std::string::npos);
  // KV events for routers: the publisher's counters (layout version 3).
  Snapshot z = s;
  z.daemon.kv_batches_published = 41;
  z.daemon.kv_batches_dropped = 2;
  const auto zp = testing::parse_prometheus(prometheus_text(z));
  ASSERT_EQ(zp.error, "");
  EXPECT_EQ(zp.types.at("kvpool_kv_event_batches_published_total"), "counter");
  EXPECT_EQ(zp.value("kvpool_kv_event_batches_published_total", {}), 41);
  EXPECT_EQ(zp.value("kvpool_kv_event_batches_dropped_total", {}), 2);
  // One pool only.
  const auto one = testing::parse_prometheus(prometheus_text(s, "default"));
  ASSERT_EQ(one.error, "");
  EXPECT_TRUE(std::isnan(one.value("kvpool_pages", {{"pool", "p\"o\\l\n1"}})));
}

TEST(StatsPrometheus, TheParserRefusesWhatIsWrong) {
  const char* bad[] = {
      "x 1\n",                                                     // no TYPE
      "# TYPE x gauge\nx{a=\"1} 2\n",                              // unterminated value
      "# TYPE x gauge\nx{a=\"\\t\"} 2\n",                          // bad escape
      "# TYPE x gauge\nx 1\nx 2\n",                                // duplicate
      "# TYPE x gauge\n# TYPE y gauge\nx 1\ny 1\nx{a=\"b\"} 2\n",  // not contiguous
      "# TYPE x counter\nx -1\n",                                  // negative counter
      "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
      "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",  // +Inf != count
      "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",     // no +Inf
      "# TYPE x gauge\nx 1",                                                // no final newline
      "# TYPE 1x gauge\n",                                                  // metric name
      "# TYPE x gauge\nx{1a=\"b\"} 1\n",                                    // label name
      "# TYPE x gauge\nx one\n",                                            // value
  };
  for (const char* text : bad)
    EXPECT_NE(testing::parse_prometheus(text).error, "") << text;
  EXPECT_EQ(testing::parse_prometheus("# HELP x a\n# TYPE x gauge\nx{a=\"\\\"\"} +Inf\n").error,
            "");
}

}  // namespace
}  // namespace kvpool::stats

// LatencyRecorder: per-operation latency histograms in log-scale buckets.
//
// One stats::OpLatency per opcode number below stats::kMaxOps (powers of two from 256 ns to
// ~1.07 s, then one bucket above; count, sum and maximum), named after the operation so a reader
// needs no opcode table. record() is a handful of instructions: a bit_width, three adds and a
// max. The daemon keeps two: the time inside Service::handle ("service") and the time from a
// frame's arrival (the read that completed it) to its reply being queued ("request"). Both
// are off when the config's metrics.latency_histograms is false, so the clock is never read.
//
// Thread-safety: none; the event loop records, the stats snapshot copies.
#pragma once

#include <cstdint>
#include <ctime>

#include "common/stats_layout.h"

namespace kvpool::daemon {

class LatencyRecorder {
 public:
  explicit LatencyRecorder(bool enabled);

  bool enabled() const { return enabled_; }
  // CLOCK_MONOTONIC in ns.
  static uint64_t now_ns() {
    timespec t{};
    ::clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
  }
  // Counts `ns` for `opcode`; opcodes at or above stats::kMaxOps are ignored.
  void record(uint16_t opcode, uint64_t ns) {
    if (opcode < stats::kMaxOps) stats::record(ops_[opcode], ns);
  }
  const stats::OpLatency (&ops() const)[stats::kMaxOps] { return ops_; }

 private:
  bool enabled_;
  stats::OpLatency ops_[stats::kMaxOps];
};

}  // namespace kvpool::daemon

// attach(): a worker's connection to a test's daemon. A failure to attach is recorded as a test
// failure (ADD_FAILURE, naming the daemon's message) and gives nullptr, so the test stops at its
// own next check instead of crashing.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "client/connection/connection.h"
#include "common/stats_layout.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {

inline std::unique_ptr<client::Connection> attach(
    const Daemon& d, const std::string& name, const std::string& pool = "",
    client::Connection::Memory memory = client::Connection::Memory::map) {
  auto c = client::Connection::attach(d.socket(), name, pool, memory);
  if (!c.ok()) {
    ADD_FAILURE() << "attach " << name << ": " << c.error().message;
    return nullptr;
  }
  return std::move(c.value());
}

// Pool `pool`'s figures as the daemon sees them now (the snapshot op, not the stats segment,
// which trails). A failed call or decode is a test failure.
inline stats::PoolStats pool_stats(client::Connection& c, size_t pool = 0) {
  auto snap = c.snapshot();
  EXPECT_TRUE(snap.ok());
  stats::Snapshot s;
  if (snap.ok()) {
    EXPECT_EQ(stats::decode(snap.value().bytes, snap.value().layout_version, s), "");
  }
  return pool < s.pools.size() ? s.pools[pool] : stats::PoolStats{};
}

}  // namespace kvpool::testing

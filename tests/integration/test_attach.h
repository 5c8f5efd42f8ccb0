// attach(): a worker's connection to a test's daemon. A failure to attach is recorded as a test
// failure (ADD_FAILURE, naming the daemon's message) and gives nullptr, so the test stops at its
// own next check instead of crashing.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "client/connection/connection.h"
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

}  // namespace kvpool::testing

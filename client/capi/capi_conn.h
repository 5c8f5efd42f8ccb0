// What the C API's translation units share (client/capi/kvpool.h over client::Connection): the
// connection handle and the error helpers that fill its last_error. Private to libkvpool.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"

struct kvpool_conn {
  std::unique_ptr<kvpool::client::Connection> conn;
  std::string last_error;
  kvpool::PageHints hints;
  // The model's names as the hello gave them, kept here so that the pointers kvpool_model_name
  // and kvpool_group_name return live until kvpool_detach (a session's model never changes).
  std::string model{};
  std::vector<std::string> groups{};
};

namespace kvpool::capi {

// last_error = "name: message" (the name once: the daemon's messages do not repeat it); returns
// the code.
template <typename T>
int fail(kvpool_conn* c, const kvpool::client::Result<T>& r) {
  c->last_error =
      std::string(kvpool::errc_name(r.error().status.code())) + ": " + r.error().message;
  return static_cast<int>(r.error().status.code());
}

// A call that answers whether the pool's mapping changed: *changed (may be NULL) = 1 or 0, or 0
// and the error.
inline int report_changed(kvpool_conn* c, const kvpool::client::Result<bool>& r, int* changed) {
  if (changed != nullptr) *changed = r.ok() && r.value() ? 1 : 0;
  return r.ok() ? KVPOOL_OK : fail(c, r);
}

// An argument refused before anything is sent: invalid_argument with `message`.
inline int refuse(kvpool_conn* c, std::string message) {
  c->last_error = "invalid_argument: " + std::move(message);
  return static_cast<int>(kvpool::Errc::invalid_argument);
}

// Counts beyond the protocol's batch limit are refused before anything is allocated for them.
inline int too_many(kvpool_conn* c, size_t n) {
  c->last_error = "batch of " + std::to_string(n) + " items exceeds the protocol's limit of " +
                  std::to_string(kvpool::wire::kMaxBatch);
  return static_cast<int>(kvpool::Errc::invalid_argument);
}

}  // namespace kvpool::capi

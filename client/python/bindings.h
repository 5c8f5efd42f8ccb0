// The Python module kvpool._kvpool (pybind11): what its translation units share.
//
// Ownership: a Python Connection holds a shared_ptr to the C++ client::Connection; every object
// that points into the pool's memory (views) or uses the connection (SequenceCache) holds that
// shared_ptr too. So the mapping and the session live until the last of them is gone: a view
// can never point at unmapped memory. Connection.close() drops the Python connection's own
// reference; the daemon releases the session's pages when the last holder lets go.
//
// Errors: a daemon or client error becomes kvpool.Error (attributes code, name, message); bad
// Python arguments raise ValueError/TypeError naming the argument. Every socket round trip runs
// without the GIL, so threads with connections of their own proceed in parallel.
//
// Thread-safety: as client::Connection: one call at a time per connection. The module takes a
// per-connection lock, so Python threads sharing one connection serialise instead of corrupting
// its byte stream.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/connection/connection.h"

namespace kvpool::python {

namespace py = pybind11;

// A connection and the lock that serialises its calls.
struct SharedConnection {
  std::unique_ptr<client::Connection> conn;
  std::mutex lock;
};
using ConnectionRef = std::shared_ptr<SharedConnection>;

// Raised as kvpool.Error.
struct KvpoolError {
  Errc code;
  std::string message;
};
[[noreturn]] void raise(const wire::Error& e);

// Unwraps a client result or raises kvpool.Error.
template <typename T>
T value_or_raise(client::Result<T>&& r) {
  if (!r.ok()) raise(r.error());
  return std::move(r.value());
}

// Argument checks (arguments.cpp), each raising ValueError naming `arg`.
// Token ids as uint32 (ints in 0..2^32 − 1; never wrapped).
std::vector<uint32_t> token_ids(const py::handle& tokens, const char* arg);
// A page count, 0..2^32 − 1.
uint32_t page_count(int64_t n, const char* arg);
// A priority class by name ("none", "one_off", "conversation", "system") or number 0..3; None is
// none.
Priority priority_of(const py::handle& priority);

void bind_errors(py::module_& m);
void bind_hashing(py::module_& m);
void bind_vllm_hashing(py::module_& m);
void bind_connection(py::module_& m);
void bind_memory(py::module_& m);
void bind_sequence_cache(py::module_& m);
void bind_mixed_sequence(py::module_& m);
void bind_events(py::module_& m);
void bind_bench_hooks(py::module_& m);

}  // namespace kvpool::python

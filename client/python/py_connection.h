// PyConnection: the Python Connection object, a handle on a SharedConnection (bindings.h).
#pragma once

#include "client/python/bindings.h"

namespace kvpool::python {

struct PyConnection {
  ConnectionRef ref;

  SharedConnection& get() const {
    if (!ref) throw py::value_error("the connection is closed");
    return *ref;
  }
  // Runs f(connection) without the GIL and under the connection's lock; raises kvpool.Error.
  template <typename F>
  auto call(F&& f) {
    SharedConnection& s = get();
    auto r = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard lock(s.lock);
      return f(*s.conn);
    }();
    return value_or_raise(std::move(r));
  }
  void close() { ref.reset(); }
};

}  // namespace kvpool::python

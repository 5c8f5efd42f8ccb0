// _native_call_times: the C++ client's own per-call times, measured inside this process on the
// same connection and daemon as the Python calls they are compared with
// (bench/python/call_overhead.py). A baseline measured in a separate process differs by more
// than the overhead being measured (scheduling, cache warmth), so the comparison is made here.

#include <pybind11/stl.h>

#include <chrono>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"

namespace kvpool::python {

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// (times of op, times of the release that follows each), microseconds. op: "alloc" (of `pages`
// pages) or "lookup" (of `chain`).
std::pair<std::vector<double>, std::vector<double>> native_call_times(
    PyConnection& c, const std::string& op, uint32_t pages, const std::vector<BlockHash>& chain,
    uint32_t iterations) {
  if (op != "alloc" && op != "lookup") throw py::value_error("op must be alloc or lookup");
  SharedConnection& s = c.get();
  std::vector<double> first, release;
  first.reserve(iterations);
  release.reserve(iterations);
  std::optional<wire::Error> failed;
  {
    py::gil_scoped_release nogil;
    std::lock_guard lock(s.lock);
    for (uint32_t i = 0; i < iterations && !failed; ++i) {
      const auto t0 = Clock::now();
      auto got = op == "alloc" ? s.conn->alloc(pages) : s.conn->lookup(chain);
      const auto t1 = Clock::now();
      if (!got.ok()) {
        failed = got.error();
        break;
      }
      auto done = s.conn->release(got.value());
      const auto t2 = Clock::now();
      if (!done.ok()) failed = done.error();
      first.push_back(micros(t0, t1));
      release.push_back(micros(t1, t2));
    }
  }
  if (failed) raise(*failed);
  return {std::move(first), std::move(release)};
}

}  // namespace

void bind_bench_hooks(py::module_& m) {
  m.def("_native_call_times", &native_call_times, py::arg("connection"), py::arg("op"),
        py::arg("pages"), py::arg("chain"), py::arg("iterations"),
        "Benchmark baseline: per-call microseconds of the C++ client on this connection.");
}

}  // namespace kvpool::python

// _native_call_times: the C++ client's own per-call times, measured inside this process on the
// same connection and daemon as the Python calls they are compared with
// (bench/python/call_overhead.py). A baseline measured in a separate process differs by more
// than the overhead being measured (scheduling, cache warmth), so the comparison is made here.

#include <pybind11/stl.h>

#include <time.h>

#include <chrono>
#include <tuple>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"

namespace kvpool::python {

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double thread_cpu_micros() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

// (times of op, times of the release that follows each, this thread's CPU time for the whole
// loop), microseconds. op: "alloc" (of `pages` pages) or "lookup" (of `chain`).
std::tuple<std::vector<double>, std::vector<double>, double> native_call_times(
    PyConnection& c, const std::string& op, uint32_t pages, const std::vector<BlockHash>& chain,
    uint32_t iterations) {
  if (op != "alloc" && op != "lookup") throw py::value_error("op must be alloc or lookup");
  SharedConnection& s = c.get();
  std::vector<double> first, release;
  first.reserve(iterations);
  release.reserve(iterations);
  std::optional<wire::Error> failed;
  double cpu = 0;
  {
    py::gil_scoped_release nogil;
    std::lock_guard lock(s.lock);
    const double cpu0 = thread_cpu_micros();
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
    cpu = thread_cpu_micros() - cpu0;
  }
  if (failed) raise(*failed);
  return {std::move(first), std::move(release), cpu};
}

}  // namespace

void bind_bench_hooks(py::module_& m) {
  m.def("_native_call_times", &native_call_times, py::arg("connection"), py::arg("op"),
        py::arg("pages"), py::arg("chain"), py::arg("iterations"),
        "Benchmark baseline: per-call microseconds of the C++ client on this connection.");
}

}  // namespace kvpool::python

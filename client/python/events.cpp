// EventStream for Python: the daemon's prefix-index events (client/connection/event_stream.h), as a
// KV-aware router follows them over the socket. (Routers written for vLLM can instead subscribe
// to the daemon's ZeroMQ endpoint, which publishes the same changes in vLLM's format.)

#include <pybind11/stl.h>

#include "client/connection/event_stream.h"
#include "client/python/bindings.h"

namespace kvpool::python {

void bind_events(py::module_& m) {
  py::class_<wire::Event>(m, "Event",
                          "kind: stored | removed | cleared | gap. stored/removed carry hash, "
                          "page and tenant; cleared and gap carry count.")
      .def_readonly("seq", &wire::Event::seq, "The event's sequence number (consecutive per pool).")
      .def_property_readonly(
          "kind", [](const wire::Event& e) { return wire::event_kind_name(e.kind); },
          "What happened: \"stored\", \"removed\", \"cleared\", \"gap\" or \"resized\".")
      .def_property_readonly(
          "cause", [](const wire::Event& e) { return wire::event_cause_name(e.cause); },
          "Why: \"evicted\" or \"flushed\" (removed), \"grown\" or \"shrunk\" (resized), else "
          "\"\".")
      .def_readonly("page", &wire::Event::page, "The first page concerned.")
      .def_readonly("count", &wire::Event::count, "Pages concerned.")
      .def_readonly("hash", &wire::Event::hash, "The block hash concerned (zero when none).")
      .def_readonly("tenant", &wire::Event::tenant, "The tenant whose session caused it.")
      .def("__repr__", [](const wire::Event& e) {
        return "Event(seq=" + std::to_string(e.seq) + ", kind='" + wire::event_kind_name(e.kind) +
               "')";
      });

  py::class_<client::EventStream>(m, "EventStream",
                                  "A subscription to a pool's events (its own connection).")
      .def(py::init([](const std::optional<std::string>& socket, const std::string& pool,
                       uint64_t from_seq) {
             const std::string path = socket.value_or(client::default_socket_path());
             auto r = [&] {
               py::gil_scoped_release nogil;
               return client::EventStream::open(path, pool, from_seq);
             }();
             return value_or_raise(std::move(r));
           }),
           py::arg("socket") = py::none(), py::arg("pool") = "", py::arg("from_seq") = 0,
           "Subscribes to a pool's index events: from_seq 0 = new events only.")
      .def_property_readonly(
          "stream_id", [](const client::EventStream& s) { return s.subscribed().stream_id; },
          "The daemon's id for this subscription.")
      .def_property_readonly(
          "next_seq", [](const client::EventStream& s) { return s.subscribed().next_seq; },
          "The sequence number the next event will carry.")
      .def(
          "next",
          [](client::EventStream& s, int timeout_ms) {
            auto r = [&] {
              py::gil_scoped_release nogil;
              return s.next(timeout_ms);
            }();
            return value_or_raise(std::move(r)).events;
          },
          py::arg("timeout_ms") = -1,
          "The next batch of events (a list; empty when timeout_ms passed first).")
      .def("close", &client::EventStream::close, "Ends the subscription now; idempotent.")
      .def_property_readonly("closed", &client::EventStream::closed,
                             "True after close() or once the daemon has gone.")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](client::EventStream& s, const py::object&, const py::object&, const py::object&) {
            s.close();
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"));
}

}  // namespace kvpool::python

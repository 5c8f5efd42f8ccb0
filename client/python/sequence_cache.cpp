// SequenceCache for Python: one sequence's pages and block hashes (client/sequence_cache.h).
// It holds its connection and hasher, so neither can go away under it.

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"
#include "client/sequence_cache.h"

namespace kvpool::python {

namespace {

using Tokens = py::array_t<uint32_t, py::array::c_style | py::array::forcecast>;

struct PySequenceCache {
  ConnectionRef ref;
  std::shared_ptr<BlockHasher> hasher;
  std::unique_ptr<client::SequenceCache> cache;  // declared last: destroyed first

  // Runs f(cache) without the GIL, under the connection's lock; raises kvpool.Error.
  template <typename F>
  auto call(F&& f) {
    auto r = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard lock(ref->lock);
      return f(*cache);
    }();
    return value_or_raise(std::move(r));
  }
};

}  // namespace

void bind_sequence_cache(py::module_& m) {
  py::class_<PySequenceCache>(
      m, "SequenceCache",
      "One sequence's KV pages: begin(prompt) reuses the cached prefix and allocates the rest, "
      "append() gives each new token's slot, publish_full() shares full blocks, release() gives "
      "every page back tail first.")
      .def(py::init([](PyConnection& c, const std::shared_ptr<BlockHasher>& hasher,
                       const BlockHash& root) {
             SharedConnection& s = c.get();
             PySequenceCache out{c.ref, hasher, nullptr};
             out.cache = std::make_unique<client::SequenceCache>(*s.conn, *hasher, root);
             return out;
           }),
           py::arg("connection"), py::arg("hasher"), py::arg("root"))
      .def(
          "begin",
          [](PySequenceCache& s, const Tokens& prompt) {
            if (prompt.ndim() != 1) throw py::value_error("prompt must be one-dimensional");
            const std::span<const uint32_t> p(prompt.data(), static_cast<size_t>(prompt.size()));
            return s.call([&](client::SequenceCache& c) { return c.begin(p); });
          },
          py::arg("prompt"),
          "Starts the sequence; returns how many leading tokens are already cached.")
      .def(
          "append",
          [](PySequenceCache& s, uint32_t token) {
            auto slot = s.call([&](client::SequenceCache& c) { return c.append(token); });
            return py::make_tuple(slot.page, slot.offset);
          },
          py::arg("token"), "Appends one token; returns its slot (page, offset).")
      .def(
          "slot",
          [](const PySequenceCache& s, uint32_t pos) {
            if (pos >= s.cache->tokens()) throw py::index_error("position past the sequence");
            const auto slot = s.cache->slot(pos);
            return py::make_tuple(slot.page, slot.offset);
          },
          py::arg("pos"))
      .def(
          "publish_full",
          [](PySequenceCache& s) {
            return s.call([](client::SequenceCache& c) { return c.publish_full(); });
          },
          "Publishes every full block not yet published; returns how many were adopted.")
      .def("fork",
           [](PySequenceCache& s) {
             auto child = s.call([](client::SequenceCache& c) { return c.fork(); });
             return PySequenceCache{s.ref, s.hasher, std::move(child)};
           })
      .def(
          "apply_window",
          [](PySequenceCache& s, uint32_t window) {
            s.call([&](client::SequenceCache& c) { return c.apply_window(window); });
          },
          py::arg("window"))
      .def("release",
           [](PySequenceCache& s) { s.call([](client::SequenceCache& c) { return c.release(); }); })
      .def(
          "set_hints",
          [](PySequenceCache& s, uint8_t priority, uint32_t pin_ttl_ms) {
            if (priority > kMaxPriority) throw py::value_error("priority must be 0..3");
            s.cache->set_hints(PageHints{static_cast<Priority>(priority), pin_ttl_ms});
          },
          py::arg("priority") = 0, py::arg("pin_ttl_ms") = 0)
      .def_property_readonly("tokens", [](const PySequenceCache& s) { return s.cache->tokens(); })
      .def_property_readonly("block_table",
                             [](const PySequenceCache& s) { return s.cache->block_table(); })
      .def_property_readonly("block_hashes",
                             [](const PySequenceCache& s) { return s.cache->block_hashes(); })
      .def_property_readonly("published_blocks",
                             [](const PySequenceCache& s) { return s.cache->published_blocks(); });
}

}  // namespace kvpool::python

// SequenceCache for Python: one sequence's pages and block hashes (client/worker/sequence_cache.h).
// It holds its connection and hasher, so neither can go away under it.

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"
#include "client/worker/sequence_cache.h"

namespace kvpool::python {

namespace {

struct PySequenceCache {
  ConnectionRef ref;
  std::shared_ptr<BlockHasher> hasher;
  std::unique_ptr<client::SequenceCache> cache;  // declared last: destroyed first

  client::SequenceCache& get() const {
    if (!cache) throw py::value_error("the SequenceCache is closed");
    return *cache;
  }
  // Runs f(cache) without the GIL, under the connection's lock; raises kvpool.Error. A close()
  // on another thread meanwhile is seen under the lock (the call then fails, naming it), and
  // the local reference keeps the lock alive whatever close() lets go of.
  template <typename F>
  auto call(F&& f) {
    get();
    const ConnectionRef keep = ref;
    auto r = [&]() -> decltype(f(*cache)) {
      py::gil_scoped_release nogil;
      std::lock_guard lock(keep->lock);
      if (!cache) return wire::Error{Status(Errc::invalid_argument), "the SequenceCache is closed"};
      return f(*cache);
    }();
    return value_or_raise(std::move(r));
  }
  // Releases the pages (tail first) and drops the cache and the connection; idempotent. The
  // release's result, ok when there was nothing to close.
  client::Result<client::Ok> close() {
    if (!cache) return client::Ok{};
    const ConnectionRef keep = ref;
    auto r = [&]() -> client::Result<client::Ok> {
      py::gil_scoped_release nogil;
      std::lock_guard lock(keep->lock);
      if (!cache) return client::Ok{};
      auto done = cache->release();
      cache.reset();
      return done;
    }();
    ref.reset();  // with the GIL: the session can end once nothing else uses it
    return r;
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
          [](PySequenceCache& s, const py::object& prompt) {
            const std::vector<uint32_t> p = token_ids(prompt, "prompt");
            return s.call([&](client::SequenceCache& c) { return c.begin(p); });
          },
          py::arg("prompt"),
          "Starts the sequence; returns how many leading tokens are already cached.")
      .def(
          "begin_from",
          [](PySequenceCache& s, const py::object& prompt,
             const std::vector<std::optional<PageId>>& held) {
            const std::vector<uint32_t> p = token_ids(prompt, "prompt");
            std::vector<PageId> pages;
            for (const auto& page : held)
              pages.push_back(page.value_or(kNoPage));
            return s.call([&](client::SequenceCache& c) { return c.begin_from(p, pages); });
          },
          py::arg("prompt"), py::arg("held"),
          "begin() from a prefix hit this connection already holds (its group's part of "
          "Connection.lookup_groups; None for blocks a window skipped): the cache takes those "
          "references over, whether it succeeds or not (a refused begin_from gives them back). "
          "Returns the cached tokens.")
      .def(
          "append",
          [](PySequenceCache& s, int64_t token) {
            if (token < 0 || token > int64_t{UINT32_MAX}) {
              throw py::value_error("token is " + std::to_string(token) +
                                    ": token ids are 0..4294967295");
            }
            const auto t = static_cast<uint32_t>(token);
            auto slot = s.call([&](client::SequenceCache& c) { return c.append(t); });
            return py::make_tuple(slot.page, slot.offset);
          },
          py::arg("token"), "Appends one token; returns its slot (page, offset).")
      .def(
          "slot",
          [](const PySequenceCache& s, uint32_t pos) {
            if (pos >= s.get().tokens()) throw py::index_error("position past the sequence");
            const auto slot = s.get().slot(pos);
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
          "close", [](PySequenceCache& s) { value_or_raise(s.close()); },
          "Releases the sequence's pages and closes it; idempotent. Later calls raise ValueError.")
      .def_property_readonly(
          "closed", [](const PySequenceCache& s) { return !s.cache; },
          "True after close() (or release()).")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PySequenceCache& s, const py::object&, const py::object&, const py::object&) {
            (void)s.close();  // on the way out of a with-block, a failed release stays unraised
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"))
      .def(
          "set_hints",
          [](PySequenceCache& s, const py::object& priority, uint32_t pin_ttl_ms) {
            s.get().set_hints(PageHints{priority_of(priority), pin_ttl_ms});
          },
          py::arg("priority") = py::none(), py::arg("pin_ttl_ms") = 0,
          "Hints for the pages this sequence takes from now on: a priority class by name "
          "(\"none\", \"one_off\", \"conversation\", \"system\") or 0..3, and a pin TTL.")
      .def_property(
          "lora_name", [](const PySequenceCache& s) { return s.get().lora_name(); },
          [](PySequenceCache& s, std::string name) { s.get().set_lora_name(std::move(name)); },
          "The adapter (LoRA) named in the KV events of the blocks publish_full() publishes from "
          "now on (\"\" = none; at most 256 bytes). The hash chain's root names it for lookups.")
      .def_property_readonly(
          "tokens", [](const PySequenceCache& s) { return s.get().tokens(); },
          "Tokens the sequence holds.")
      .def_property_readonly(
          "first_visible", [](const PySequenceCache& s) { return s.get().first_visible(); },
          "The first token the next query sees by the pool's attention kind (0 for full). On a "
          "sliding or chunked pool, publish_full() releases the published blocks before it (the "
          "pool keeps them cached).")
      .def_property_readonly(
          "block_table", [](const PySequenceCache& s) { return s.get().block_table(); },
          "The sequence's pages, block by block.")
      .def_property_readonly(
          "kv_block_table", [](const PySequenceCache& s) { return s.get().kv_block_table(); },
          "The block table as kv_cache_view()'s block dimension counts: the pages themselves, "
          "except in a segmented (elastic) layer_major pool, where each is pool.block_index(page) "
          "(4294967295 stays, a block the window left). What an engine's own kernels take.")
      .def_property_readonly(
          "block_hashes", [](const PySequenceCache& s) { return s.get().block_hashes(); },
          "The hashes of its full blocks, in order.")
      .def_property_readonly(
          "published_blocks", [](const PySequenceCache& s) { return s.get().published_blocks(); },
          "Full blocks published so far.");
}

}  // namespace kvpool::python

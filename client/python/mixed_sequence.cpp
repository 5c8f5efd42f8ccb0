// MixedSequence for Python: one sequence over a 16-bit pool and an 8-bit pool of one shape
// (client/worker/mixed_sequence.h). It holds both connections, their kernels and the hasher, so
// none can go away under it. Every call takes both connections' locks (std::scoped_lock, which
// orders them), so threads sharing either connection serialise with it.

#include <pybind11/stl.h>

#include <mutex>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"
#include "client/worker/mixed_sequence.h"
#include "client/worker/pool_kernels.h"

namespace kvpool::python {

namespace {

struct PyMixedSequence {
  ConnectionRef recent;
  ConnectionRef older;
  std::shared_ptr<BlockHasher> hasher;
  std::unique_ptr<client::PoolKernels> recent_k;
  std::unique_ptr<client::PoolKernels> older_k;
  std::unique_ptr<client::MixedSequence> seq;  // declared last: destroyed first

  client::MixedSequence& get() const {
    if (!seq) throw py::value_error("the MixedSequence is closed");
    return *seq;
  }
  // Runs f(sequence) without the GIL, under both connections' locks; raises kvpool.Error.
  template <typename F>
  auto call(F&& f) {
    get();
    const ConnectionRef keep_recent = recent, keep_older = older;
    auto r = [&]() -> decltype(f(*seq)) {
      py::gil_scoped_release nogil;
      std::scoped_lock lock(keep_recent->lock, keep_older->lock);
      if (!seq) return wire::Error{Status(Errc::invalid_argument), "the MixedSequence is closed"};
      return f(*seq);
    }();
    return value_or_raise(std::move(r));
  }
  // Releases the pages and drops the sequence, kernels and connections; idempotent.
  client::Result<client::Ok> close() {
    if (!seq) return client::Ok{};
    const ConnectionRef keep_recent = recent, keep_older = older;
    auto r = [&]() -> client::Result<client::Ok> {
      py::gil_scoped_release nogil;
      std::scoped_lock lock(keep_recent->lock, keep_older->lock);
      if (!seq) return client::Ok{};
      auto done = seq->release();
      seq.reset();
      recent_k.reset();
      older_k.reset();
      return done;
    }();
    recent.reset();
    older.reset();
    return r;
  }
};

}  // namespace

void bind_mixed_sequence(py::module_& m) {
  py::class_<PyMixedSequence>(
      m, "MixedSequence",
      "One sequence whose recent tokens stay in a 16-bit pool and whose older ones go down to an "
      "8-bit pool of the same shape: begin(prompt) finds cached blocks in either (the 8-bit pool "
      "first), append() gives each new token's slot in the 16-bit pool, publish_full() shares "
      "full blocks and converts those recent_tokens or more behind the head into the 8-bit pool, "
      "where every worker finds them under the same hash. block_table's first older_pages "
      "entries are 8-bit pool pages.")
      .def(py::init([](PyConnection& recent, PyConnection& older,
                       const std::shared_ptr<BlockHasher>& hasher, const BlockHash& root,
                       uint32_t recent_tokens) {
             SharedConnection& r = recent.get();
             SharedConnection& o = older.get();
             if (&r == &o) throw py::value_error("recent and older are one connection");
             PyMixedSequence out{recent.ref, older.ref, hasher, nullptr, nullptr, nullptr};
             out.recent_k = std::make_unique<client::PoolKernels>(*r.conn);
             out.older_k = std::make_unique<client::PoolKernels>(*o.conn);
             out.seq = value_or_raise(client::MixedSequence::create(
                 *r.conn, *out.recent_k, *o.conn, *out.older_k, *hasher, root, recent_tokens));
             return out;
           }),
           py::arg("recent"), py::arg("older"), py::arg("hasher"), py::arg("root"),
           py::arg("recent_tokens"))
      .def(
          "begin",
          [](PyMixedSequence& s, const py::object& prompt) {
            const std::vector<uint32_t> p = token_ids(prompt, "prompt");
            return s.call([&](client::MixedSequence& q) { return q.begin(p); });
          },
          py::arg("prompt"),
          "Starts the sequence; returns how many leading tokens are already cached (in either "
          "pool).")
      .def(
          "append",
          [](PyMixedSequence& s, int64_t token) {
            if (token < 0 || token > int64_t{UINT32_MAX}) {
              throw py::value_error("token is " + std::to_string(token) +
                                    ": token ids are 0..4294967295");
            }
            const auto t = static_cast<uint32_t>(token);
            auto slot = s.call([&](client::MixedSequence& q) { return q.append(t); });
            return py::make_tuple(slot.page, slot.offset);
          },
          py::arg("token"),
          "Appends one token; returns its slot (page, offset) in the 16-bit pool.")
      .def(
          "publish_full",
          [](PyMixedSequence& s) {
            return s.call([](client::MixedSequence& q) { return q.publish_full(); });
          },
          "Publishes the full blocks not yet published, then converts the aged ones; returns how "
          "many blocks it converted.")
      .def(
          "release",
          [](PyMixedSequence& s) { s.call([](client::MixedSequence& q) { return q.release(); }); },
          "Gives every page back; the sequence is empty afterwards.")
      .def(
          "close", [](PyMixedSequence& s) { value_or_raise(s.close()); },
          "Releases the sequence's pages and closes it; idempotent. Later calls raise ValueError.")
      .def_property_readonly(
          "closed", [](const PyMixedSequence& s) { return !s.seq; }, "True after close().")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](PyMixedSequence& s, const py::object&, const py::object&, const py::object&) {
            (void)s.close();
          },
          py::arg("exc_type"), py::arg("exc"), py::arg("tb"))
      .def_property_readonly(
          "tokens", [](const PyMixedSequence& s) { return s.get().tokens(); },
          "Tokens the sequence holds.")
      .def_property_readonly(
          "older_pages", [](const PyMixedSequence& s) { return s.get().older_pages(); },
          "How many leading block_table entries are pages of the 8-bit pool.")
      .def_property_readonly(
          "block_table", [](const PyMixedSequence& s) { return s.get().block_table(); },
          "The sequence's pages, block by block: 8-bit pool pages first, then 16-bit ones.")
      .def_property_readonly(
          "block_hashes", [](const PyMixedSequence& s) { return s.get().block_hashes(); },
          "The hashes of its full blocks, in order (the same in both pools).")
      .def_property_readonly(
          "converted", [](const PyMixedSequence& s) { return s.get().converted(); },
          "Blocks this sequence converted to 8 bits.")
      .def_property_readonly(
          "adopted", [](const PyMixedSequence& s) { return s.get().adopted(); },
          "Blocks another worker had converted first, whose pages it took instead of its own.");
}

}  // namespace kvpool::python

// VllmBlockHasher: vLLM's own block hash (common/vllm_block_hash.h) for Python workers that share
// a pool (pools[].hash_scheme: vllm-sha256-cbor/1) with vLLM engines, or that want the keys a
// vLLM-fed router computes. Digests are 32-byte `bytes` (vLLM's BlockHash); key() turns one into
// the pool's BlockHash.

#include <pybind11/stl.h>

#include <cstring>

#include "client/python/bindings.h"
#include "common/vllm_block_hash.h"

namespace kvpool::python {

namespace {

VllmDigest digest_from(const py::bytes& b, const char* arg) {
  const std::string s = b;
  VllmDigest d{};
  if (s.size() != d.size()) {
    throw py::value_error(std::string(arg) + ": a vLLM block hash is 32 bytes, got " +
                          std::to_string(s.size()));
  }
  std::memcpy(d.data(), s.data(), d.size());
  return d;
}

py::bytes digest_bytes(const VllmDigest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

// vLLM's extra keys as cbor2 encodes them: None, or tuples/lists of str, bytes, int (−2^63 to
// 2^64 − 1), None and tuples. An empty tuple is an empty array, as cbor2 writes it (vLLM passes
// None, not (), for a block without extra keys).
void encode_key(CborWriter& w, const py::handle& v, int depth) {
  if (depth > 16) throw py::value_error("extra_keys: nested more than 16 deep");
  if (v.is_none()) {
    w.null();
  } else if (py::isinstance<py::bool_>(v)) {
    throw py::type_error("extra_keys: bool is not a key vLLM uses");  // before int: bool is one
  } else if (py::isinstance<py::int_>(v)) {
    const py::int_ i = py::reinterpret_borrow<py::int_>(v);
    int overflow = 0;
    const long long s = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow == 0) {
      w.integer(s);
    } else if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
      if (PyErr_Occurred()) {
        PyErr_Clear();
        throw py::value_error("extra_keys: an integer of 2**64 or more");
      }
      w.uint(u);
    } else {
      throw py::value_error("extra_keys: an integer below -2**63");
    }
  } else if (py::isinstance<py::str>(v)) {
    w.text(v.cast<std::string>());
  } else if (py::isinstance<py::bytes>(v) || py::isinstance<py::bytearray>(v)) {
    const std::string b = py::isinstance<py::bytes>(v) ? std::string(v.cast<py::bytes>())
                                                       : std::string(v.cast<py::bytearray>());
    w.bytes(std::span(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
  } else if (py::isinstance<py::tuple>(v) || py::isinstance<py::list>(v)) {
    const py::sequence seq = py::reinterpret_borrow<py::sequence>(v);
    w.array(seq.size());
    for (const py::handle item : seq)
      encode_key(w, item, depth + 1);
  } else {
    throw py::type_error("extra_keys: " + std::string(py::str(v.get_type())) +
                         " is not one of None, tuple, list, str, bytes, bytearray, int");
  }
}

std::vector<std::byte> extra_cbor(const py::object& extra_keys) {
  if (extra_keys.is_none()) return {};
  CborWriter w;
  encode_key(w, extra_keys, 0);
  return {w.encoded().begin(), w.encoded().end()};
}

}  // namespace

void bind_vllm_hashing(py::module_& m) {
  py::class_<VllmBlockHasher, std::shared_ptr<VllmBlockHasher>> vllm(
      m, "VllmBlockHasher",
      "vLLM's block hash (sha256_cbor: SHA-256 of canonical CBOR of (parent, tokens, "
      "extra_keys), chained from NONE_HASH = sha256_cbor(PYTHONHASHSEED)). Digests are 32-byte "
      "bytes, as vLLM's BlockHash; key() is the pool's BlockHash of one, whose low word equals "
      "vLLM's integer event hash. attach(hasher=VllmBlockHasher(...)) for a pool whose "
      "hash_scheme is vllm-sha256-cbor/1. Not thread-safe: one per thread.");
  vllm.def(
          py::init([](const std::string& seed) { return std::make_shared<VllmBlockHasher>(seed); }),
          py::arg("seed"), "seed: the vLLM engines' PYTHONHASHSEED (the same everywhere).")
      .def_property_readonly(
          "none_hash", [](const VllmBlockHasher& h) { return digest_bytes(h.none_hash()); },
          "vLLM's NONE_HASH for this seed: the parent of a sequence's first block.")
      .def(
          "block",
          [](VllmBlockHasher& h, const py::object& parent, const py::object& tokens,
             const py::object& extra_keys) {
            const std::vector<uint32_t> t = token_ids(tokens, "tokens");
            const std::vector<std::byte> extra = extra_cbor(extra_keys);
            if (parent.is_none()) return digest_bytes(h.block(nullptr, t, extra));
            const VllmDigest p = digest_from(parent.cast<py::bytes>(), "parent");
            return digest_bytes(h.block(&p, t, extra));
          },
          py::arg("parent"), py::arg("tokens"), py::arg("extra_keys") = py::none(),
          "The digest of one full block (parent None: a sequence's first block), as vLLM's "
          "hash_block_tokens(sha256_cbor, parent, tokens, extra_keys).")
      .def(
          "chain",
          [](VllmBlockHasher& h, const py::object& tokens, int64_t block,
             const py::object& extra_keys) {
            if (block <= 0 || block > int64_t{1} << 20) {
              throw py::value_error("tokens_per_block is " + std::to_string(block) +
                                    ": a pool's pages hold 1..1048576 tokens");
            }
            const std::vector<uint32_t> t = token_ids(tokens, "tokens");
            const std::vector<std::byte> extra = extra_cbor(extra_keys);
            std::vector<VllmDigest> out(t.size() / static_cast<size_t>(block));
            h.chain(t, static_cast<uint32_t>(block), out, extra);
            py::list digests;
            for (const VllmDigest& d : out)
              digests.append(digest_bytes(d));
            return digests;
          },
          py::arg("tokens"), py::arg("tokens_per_block"), py::arg("extra_keys") = py::none(),
          "The digests of every full block of tokens, chained from NONE_HASH, each block with the "
          "same extra_keys (vLLM puts a cache salt on block 0 only: use block() for that).")
      .def_static(
          "key",
          [](const py::bytes& digest) {
            return VllmBlockHasher::key(digest_from(digest, "digest"));
          },
          py::arg("digest"), "The pool's BlockHash of a vLLM block digest.");
  // The scheme a hello names (a class attribute: "vllm-sha256-cbor/1").
  vllm.attr("scheme") = VllmBlockHasher::scheme().name;
}

}  // namespace kvpool::python

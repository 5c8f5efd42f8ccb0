// BlockHash, Geometry and BlockHasher: Python workers name blocks exactly as C++ and C workers
// do (common/block_hash.h), so a prefix one of them computed is found by all.

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>

#include "client/python/bindings.h"
#include "common/block_hash.h"

namespace kvpool::python {

namespace {

py::bytes hash_bytes(const BlockHash& h) {
  // lo then hi, little-endian: the byte order of kvpool_hash in the C API and on the wire.
  char out[16];
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(h.lo >> (8 * i));
    out[8 + i] = static_cast<char>(h.hi >> (8 * i));
  }
  return {out, sizeof(out)};
}

BlockHash hash_from_bytes(const py::bytes& b) {
  const std::string s = b;
  if (s.size() != 16) {
    throw py::value_error("a block hash is 16 bytes, got " + std::to_string(s.size()));
  }
  BlockHash h;
  for (size_t i = 8; i-- > 0;) {
    h.lo = (h.lo << 8) | static_cast<uint8_t>(s[i]);
    h.hi = (h.hi << 8) | static_cast<uint8_t>(s[8 + i]);
  }
  return h;
}

KvDtype dtype_from(const std::string& name) {
  auto d = parse_dtype(name);
  if (!d) throw py::value_error("dtype '" + name + "' is not one of fp16, bf16, fp8_e4m3, int8");
  return *d;
}

HashAlgorithm algorithm_from(const std::string& name) {
  for (auto a : {HashAlgorithm::sha256, HashAlgorithm::sha512_256, HashAlgorithm::blake2s256,
                 HashAlgorithm::blake2b512}) {
    if (hash_algorithm_name(a) == name) return a;
  }
  throw py::value_error("hash algorithm '" + name +
                        "' is not one of sha256, sha512_256, blake2s256, blake2b512");
}

}  // namespace

void bind_hashing(py::module_& m) {
  py::class_<BlockHash>(m, "BlockHash",
                        "A block's 128-bit name: the hash of its tokens and of every block before "
                        "it, rooted in the model's identity.")
      .def(py::init<>())
      .def(py::init([](uint64_t lo, uint64_t hi) {
             return BlockHash{lo, hi};
           }),
           py::arg("lo"), py::arg("hi"))
      .def_static("from_bytes", &hash_from_bytes, py::arg("data"),
                  "From 16 bytes: lo then hi, little-endian.")
      .def_readwrite("lo", &BlockHash::lo, "The low 64 bits of the 128-bit hash.")
      .def_readwrite("hi", &BlockHash::hi, "The high 64 bits of the 128-bit hash.")
      .def("__bytes__", &hash_bytes)
      .def("hex", [](const BlockHash& h) { return to_hex(h); })
      .def("__eq__", [](const BlockHash& a, const BlockHash& b) { return a == b; })
      .def("__hash__",
           [](const BlockHash& h) { return static_cast<py::ssize_t>(h.lo ^ (h.hi * 31)); })
      .def("__repr__", [](const BlockHash& h) { return "BlockHash(" + to_hex(h) + ")"; })
      .def(py::pickle([](const BlockHash& h) { return py::make_tuple(h.lo, h.hi); },
                      [](const py::tuple& t) {
                        return BlockHash{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()};
                      }));

  py::class_<Geometry>(m, "Geometry", "A model's KV geometry, as a pool serves it.")
      .def(py::init([](uint32_t layers, uint32_t kv_heads, uint32_t head_dim,
                       uint32_t tokens_per_page, const std::string& dtype, const std::string& kind,
                       uint32_t window) {
             const auto k = parse_attention_kind(kind);
             if (!k) {
               throw py::value_error("kind '" + kind + "' is not full, sliding, chunked or latent");
             }
             Geometry g{layers, kv_heads, head_dim, tokens_per_page, dtype_from(dtype), *k, window};
             if (std::string why = validate(g); !why.empty()) throw py::value_error(why);
             return g;
           }),
           py::arg("layers"), py::arg("kv_heads"), py::arg("head_dim"), py::arg("tokens_per_page"),
           py::arg("dtype") = "fp16", py::kw_only(), py::arg("kind") = "full",
           py::arg("window") = 0)
      .def_readonly("layers", &Geometry::layers, "Transformer layers whose K and V a page holds.")
      .def_readonly("kv_heads", &Geometry::kv_heads, "KV heads per layer.")
      .def_readonly("head_dim", &Geometry::head_dim, "Elements per head vector.")
      .def_readonly("tokens_per_page", &Geometry::tokens_per_page,
                    "Tokens one page holds (the block size).")
      .def_property_readonly(
          "dtype", [](const Geometry& g) { return std::string(dtype_name(g.dtype)); },
          "Element type: \"fp16\", \"bf16\", \"fp8_e4m3\" or \"int8\".")
      .def_property_readonly(
          "kind", [](const Geometry& g) { return std::string(attention_kind_name(g.kind)); },
          "Which keys a layer attends to: \"full\", \"sliding\" (the last `window` tokens), "
          "\"chunked\" (the current chunk of `window` tokens), or \"latent\" (an MLA cache: one "
          "vector of head_dim per token and layer, kv_heads 1, no V). Part of the hash root.")
      .def_readonly("window", &Geometry::window,
                    "Tokens of the sliding window or attention chunk; 0 for full attention.")
      .def_property_readonly(
          "page_data_bytes", [](const Geometry& g) { return page_data_bytes(g); },
          "Bytes of K and V data (a latent pool's vectors) in one page (scales excluded).")
      .def("__eq__", [](const Geometry& a, const Geometry& b) { return a == b; })
      .def("__repr__", [](const Geometry& g) {
        return "Geometry(layers=" + std::to_string(g.layers) +
               ", kv_heads=" + std::to_string(g.kv_heads) +
               ", head_dim=" + std::to_string(g.head_dim) +
               ", tokens_per_page=" + std::to_string(g.tokens_per_page) + ", dtype='" +
               std::string(dtype_name(g.dtype)) + "'" +
               (g.kind == AttentionKind::full
                    ? std::string()
                    : ", kind='" + std::string(attention_kind_name(g.kind)) +
                          "', window=" + std::to_string(g.window)) +
               ")";
      });

  py::class_<BlockHasher, std::shared_ptr<BlockHasher>>(
      m, "BlockHasher", "Computes block-hash chains. Not thread-safe: one per thread.")
      .def(py::init([](const std::string& algorithm) {
             return std::make_shared<BlockHasher>(algorithm_from(algorithm));
           }),
           py::arg("algorithm") = "sha256")
      .def(
          "root",
          [](BlockHasher& h, const std::string& model_id, const Geometry& g,
             const std::string& adapter_id, const std::string& salt) {
            return h.root(ModelIdentity{model_id, g, adapter_id, salt});
          },
          py::arg("model_id"), py::arg("geometry"), py::arg("adapter_id") = "",
          py::arg("salt") = "", "The root every chain of this model starts from.")
      .def(
          "block",
          [](BlockHasher& h, const BlockHash& parent, const py::object& tokens,
             const py::bytes& extra) {
            const std::string e = extra;
            const std::vector<uint32_t> t = token_ids(tokens, "tokens");
            return h.block(parent, t, std::as_bytes(std::span(e.data(), e.size())));
          },
          py::arg("parent"), py::arg("tokens"), py::arg("extra") = py::bytes(),
          "The hash of one block given its parent (the root for block 0).")
      .def(
          "chain",
          [](BlockHasher& h, const BlockHash& root, const py::object& tokens, int64_t block) {
            if (block <= 0 || block > int64_t{1} << 20) {
              throw py::value_error("tokens_per_block is " + std::to_string(block) +
                                    ": a pool's pages hold 1..1048576 tokens");
            }
            const auto tokens_per_block = static_cast<uint32_t>(block);
            const std::vector<uint32_t> t = token_ids(tokens, "tokens");
            std::vector<BlockHash> out(t.size() / tokens_per_block);
            h.chain(root, t, tokens_per_block, out);
            return out;
          },
          py::arg("root"), py::arg("tokens"), py::arg("tokens_per_block"),
          "The hashes of every full block of tokens (a trailing partial block is not hashed).");
}

}  // namespace kvpool::python

// PoolView: a typed, strided window on a pool's memory, handed to numpy and torch without a copy.
//
// Connection.view(dtype, shape, strides, offset) checks once that every element the view can
// address lies inside the mapping, then exports it three ways:
//   __dlpack__ / __dlpack_device__   DLPack 0.6 (torch.from_dlpack, and most frameworks), CPU or
//                                    CUDA device memory alike;
//   __array_interface__              numpy (host pools only);
//   __cuda_array_interface__         CuPy, Numba, torch.as_tensor (GPU pools only).
// Each export holds the connection (bindings.h), so the memory outlives every tensor made from
// it. Strides are in elements; the view is never negative-strided.

#include <dlpack/dlpack.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"

namespace kvpool::python {

namespace {

struct ElementType {
  const char* name;
  const char* typestr;  // numpy's array-interface type string; null: numpy has no such type
  uint8_t dl_code;
  uint8_t bits;
};

constexpr ElementType kTypes[] = {
    {"float16", "<f2", kDLFloat, 16}, {"bfloat16", nullptr, kDLBfloat, 16},
    {"float32", "<f4", kDLFloat, 32}, {"int8", "|i1", kDLInt, 8},
    {"uint8", "|u1", kDLUInt, 8},
};

const ElementType& type_of(const std::string& name) {
  for (const ElementType& t : kTypes) {
    if (name == t.name) return t;
  }
  throw py::value_error("dtype '" + name +
                        "' is not one of float16, bfloat16, float32, int8, uint8");
}

struct PoolView {
  ConnectionRef ref;
  std::byte* data = nullptr;
  int device = -1;
  ElementType type;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // elements
};

// What a DLManagedTensor owns: the connection and the shape/stride arrays it points at.
struct DlContext {
  ConnectionRef ref;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor tensor{};
};

void delete_dl(DLManagedTensor* t) {
  delete static_cast<DlContext*>(t->manager_ctx);
}

py::capsule to_dlpack(const PoolView& v) {
  auto* ctx = new DlContext{v.ref, v.shape, v.strides, {}};
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = v.data;
  t.device = v.device < 0 ? DLDevice{kDLCPU, 0} : DLDevice{kDLCUDA, v.device};
  t.ndim = static_cast<int32_t>(ctx->shape.size());
  t.dtype = DLDataType{v.type.dl_code, v.type.bits, 1};
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx;
  ctx->tensor.deleter = &delete_dl;
  // A consumer renames the capsule "used_dltensor" and calls the deleter itself; an unconsumed
  // capsule still named "dltensor" is freed here.
  PyObject* cap = PyCapsule_New(&ctx->tensor, "dltensor", [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      mt->deleter(mt);
    }
  });
  if (cap == nullptr) {
    delete ctx;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

py::dict array_interface(const PoolView& v) {
  py::dict d;
  d["shape"] = py::tuple(py::cast(v.shape));
  std::vector<int64_t> byte_strides;
  for (int64_t s : v.strides)
    byte_strides.push_back(s * (v.type.bits / 8));
  d["strides"] = py::tuple(py::cast(byte_strides));
  d["typestr"] = v.type.typestr;
  d["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(v.data), false);
  d["version"] = 3;
  return d;
}

PoolView make_view(PyConnection& c, const std::string& dtype, const std::vector<int64_t>& shape,
                   const std::vector<int64_t>& strides, uint64_t offset) {
  SharedConnection& s = c.get();
  const client::Connection& k = *s.conn;
  if (k.base() == nullptr) {
    throw py::value_error("this connection did not map the pool's memory (map_memory=False)");
  }
  const ElementType& type = type_of(dtype);
  if (shape.size() != strides.size() || shape.empty()) {
    throw py::value_error("view: shape and strides must be non-empty and of equal length");
  }
  const uint64_t esize = type.bits / 8;
  if (offset % esize != 0)
    throw py::value_error("view: offset is not a multiple of the element size");
  // The last element the view can reach must lie inside the mapping; every product and sum is
  // checked for overflow, so no shape can wrap around into a bound that passes.
  uint64_t last = offset / esize;
  bool empty = false;
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) throw py::value_error("view: negative shape or stride");
    if (shape[i] == 0) empty = true;
    if (shape[i] == 0) continue;
    uint64_t reach = 0;
    overflow |= __builtin_mul_overflow(static_cast<uint64_t>(shape[i] - 1),
                                       static_cast<uint64_t>(strides[i]), &reach);
    overflow |= __builtin_add_overflow(last, reach, &last);
  }
  uint64_t end = 0;
  overflow |= __builtin_mul_overflow(last + 1, esize, &end);
  // The bound is the pool's reservation (segment_bytes for a fixed pool): the view of an elastic
  // pool may cover pages it grows into later, as the base never moves.
  const uint64_t limit = std::max(k.pool().reserved_bytes, k.pool().segment_bytes);
  if (!empty && (overflow || end > limit)) {
    throw py::value_error("view: reaches past the mapping of " + std::to_string(limit) + " bytes" +
                          (overflow ? std::string() : " (to byte " + std::to_string(end) + ")"));
  }
  return PoolView{c.ref, k.base() + offset, k.device(), type, shape, strides};
}

}  // namespace

void bind_memory(py::module_& m) {
  py::class_<PoolView>(m, "PoolView",
                       "A typed window on the pool's memory: torch.from_dlpack(view), "
                       "numpy.asarray(view) (host pools), or __cuda_array_interface__ (GPU pools).")
      .def_property_readonly(
          "shape", [](const PoolView& v) { return py::tuple(py::cast(v.shape)); },
          "The view's shape in elements.")
      .def_property_readonly(
          "strides", [](const PoolView& v) { return py::tuple(py::cast(v.strides)); },
          "in elements")
      .def_property_readonly(
          "dtype", [](const PoolView& v) { return std::string(v.type.name); },
          "The element type's name.")
      .def_property_readonly(
          "device", [](const PoolView& v) { return v.device; },
          "The CUDA device ordinal, or -1 for host memory.")
      .def_property_readonly(
          "data_ptr", [](const PoolView& v) { return reinterpret_cast<uintptr_t>(v.data); },
          "The address of the first element.")
      .def(
          "__dlpack__", [](const PoolView& v, const py::object&) { return to_dlpack(v); },
          py::arg("stream") = py::none())
      .def("__dlpack_device__",
           [](const PoolView& v) {
             return v.device < 0 ? py::make_tuple(static_cast<int>(kDLCPU), 0)
                                 : py::make_tuple(static_cast<int>(kDLCUDA), v.device);
           })
      .def_property_readonly(
          "__array_interface__",
          [](const PoolView& v) {
            if (v.device >= 0) {
              throw py::attribute_error(
                  "a GPU pool's memory is not host memory: use "
                  "torch.from_dlpack(view) or __cuda_array_interface__");
            }
            if (v.type.typestr == nullptr) {
              throw py::attribute_error("numpy has no bfloat16: use torch.from_dlpack(view)");
            }
            return array_interface(v);
          })
      .def_property_readonly("__cuda_array_interface__", [](const PoolView& v) {
        if (v.device < 0)
          throw py::attribute_error("a host pool's memory: use numpy.asarray(view)");
        if (v.type.typestr == nullptr) {
          throw py::attribute_error("bfloat16 has no array-interface type: use DLPack");
        }
        return array_interface(v);
      });

  auto connection = py::reinterpret_borrow<py::class_<PyConnection>>(m.attr("Connection"));
  connection.def(
      "view", &make_view, py::arg("dtype"), py::arg("shape"), py::arg("strides"),
      py::arg("offset") = 0,
      "A view of the pool's memory: dtype (float16, bfloat16, float32, int8, uint8), shape "
      "and strides in elements, starting offset bytes into the mapping (page p starts at "
      "p * pool.page_stride). Refused when any element would lie outside the mapping.");
}

}  // namespace kvpool::python

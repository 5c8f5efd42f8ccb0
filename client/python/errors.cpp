// kvpool.Error: every failure the daemon or the client reports, as one Python exception type
// with the daemon's code (int), its name ("out_of_pages", ...) and message.

#include <Python.h>

#include "client/python/bindings.h"

namespace kvpool::python {

namespace {

// Created once at import and never freed (module state lives as long as the interpreter).
PyObject* error_type = nullptr;

}  // namespace

void raise(const wire::Error& e) {
  throw KvpoolError{e.status.code(), e.message};
}

void bind_errors(py::module_& m) {
  error_type = PyErr_NewExceptionWithDoc(
      "kvpool.Error",
      "A call kvpoold or the client refused or could not complete.\n\n"
      "Attributes: code (int, kvpool's error code), name (e.g. 'out_of_pages'), message.",
      PyExc_RuntimeError, nullptr);
  if (error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_borrow<py::object>(error_type);
  // pybind11 takes a plain function pointer of this exact signature (exception_ptr by value).
  // NOLINTNEXTLINE(performance-unnecessary-value-param)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const KvpoolError& e) {
      const std::string name(errc_name(e.code));
      py::object type = py::reinterpret_borrow<py::object>(error_type);
      py::object instance = type(name + ": " + e.message);
      instance.attr("code") = static_cast<int>(e.code);
      instance.attr("name") = name;
      instance.attr("message") = e.message;
      PyErr_SetObject(error_type, instance.ptr());
    }
  });
  m.def(
      "error_name", [](int code) { return std::string(errc_name(static_cast<Errc>(code))); },
      py::arg("code"), "The name of one of kvpool's error codes.");
}

}  // namespace kvpool::python

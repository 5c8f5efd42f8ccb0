// Arguments every binding checks the same way: token ids, page counts and priorities. Each bad
// value raises ValueError naming the argument, rather than being wrapped or cast silently (a
// token of −1 hashed as 4294967295 names a block no other worker computes).
#include <pybind11/numpy.h>

#include <cstdint>
#include <string>
#include <vector>

#include "client/python/bindings.h"

namespace kvpool::python {

std::vector<uint32_t> token_ids(const py::handle& tokens, const char* arg) {
  const std::string name(arg);
  py::array a;
  try {
    a = py::array::ensure(tokens);
  } catch (const py::error_already_set&) {
    a = py::array();
  }
  if (!a) {
    throw py::value_error(name + " must be a sequence of token ids (ints in 0..4294967295)");
  }
  if (a.ndim() != 1) throw py::value_error(name + " must be a one-dimensional sequence of ints");
  if (a.size() == 0) return {};
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u' && kind != 'b') {
    throw py::value_error(name + " must hold ints (token ids in 0..4294967295), not " +
                          std::string(py::str(a.dtype())));
  }
  std::vector<uint32_t> out(static_cast<size_t>(a.size()));
  auto check = [&](auto v, size_t i) {
    if (v < 0 || static_cast<uint64_t>(v) > UINT32_MAX) {
      throw py::value_error(name + "[" + std::to_string(i) + "] is " + std::to_string(v) +
                            ": token ids are 0..4294967295");
    }
    out[i] = static_cast<uint32_t>(v);
  };
  if (kind == 'u') {
    const auto u = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    for (size_t i = 0; i < out.size(); ++i) {
      const uint64_t v = u.data()[i];
      if (v > UINT32_MAX) {
        throw py::value_error(name + "[" + std::to_string(i) + "] is " + std::to_string(v) +
                              ": token ids are 0..4294967295");
      }
      out[i] = static_cast<uint32_t>(v);
    }
  } else {
    const auto s = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    for (size_t i = 0; i < out.size(); ++i)
      check(s.data()[i], i);
  }
  return out;
}

uint32_t page_count(int64_t n, const char* arg) {
  if (n < 0 || n > int64_t{UINT32_MAX}) {
    throw py::value_error(std::string(arg) + " is " + std::to_string(n) +
                          ": a page count is 0..4294967295");
  }
  return static_cast<uint32_t>(n);
}

Priority priority_of(const py::handle& priority) {
  if (priority.is_none()) return Priority::none;
  static constexpr const char* kNames[] = {"none", "one_off", "conversation", "system"};
  if (py::isinstance<py::str>(priority)) {
    const std::string s = priority.cast<std::string>();
    if (s.empty()) return Priority::none;
    for (uint8_t i = 0; i <= kMaxPriority; ++i) {
      if (s == kNames[i]) return static_cast<Priority>(i);
    }
    throw py::value_error("priority '" + s +
                          "' is not one of none, one_off, conversation, system (or 0..3)");
  }
  if (py::isinstance<py::int_>(priority) && !py::isinstance<py::bool_>(priority)) {
    const auto v = priority.cast<int64_t>();
    if (v < 0 || v > kMaxPriority) {
      throw py::value_error("priority " + std::to_string(v) +
                            " is not 0..3 (none, one_off, conversation, system)");
    }
    return static_cast<Priority>(v);
  }
  throw py::value_error("priority must be a name (none, one_off, conversation, system) or 0..3");
}

}  // namespace kvpool::python

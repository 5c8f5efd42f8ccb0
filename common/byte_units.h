// Byte counts for people: "1.0 GiB", "512.0 KiB", "17 B" (binary units, one decimal). Used in
// error messages and logs, where the exact count is given beside it when it matters.
#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>

namespace kvpool {

inline std::string bytes_text(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace kvpool

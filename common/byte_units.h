// Byte counts for people, in binary units: one scaling (scale_bytes) that the daemon's messages
// (human_bytes: "23.4 GiB", "512 B") and kvpoolctl's tables (their own precision) both print.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>

namespace kvpool {

struct ScaledBytes {
  double value = 0;        // bytes / 1024^k
  const char* unit = "B";  // "B", "KiB", ..., "EiB"
};

// The largest binary unit in which `bytes` is at least 1 (bytes below 1024 stay in B).
inline ScaledBytes scale_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  ScaledBytes s{static_cast<double>(bytes), kUnits[0]};
  for (size_t u = 1; s.value >= 1024 && u < std::size(kUnits); ++u) {
    s.value /= 1024;
    s.unit = kUnits[u];
  }
  return s;
}

// "23.4 GiB", "256.0 MiB", "512 B": one decimal above bytes.
inline std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " B";
  const ScaledBytes s = scale_bytes(bytes);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", s.value, s.unit);
  return buf;
}

}  // namespace kvpool

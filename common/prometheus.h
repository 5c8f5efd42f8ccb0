// Prometheus text exposition (format 0.0.4) of a stats snapshot, shared by `kvpoolctl stats
// --format prom` and kvpoold's metrics endpoint so that both print the same families.
//
// Every family has a HELP and a TYPE line before its samples; label values are escaped (\\, \",
// \n); counters end in _total; latency histograms are `histogram` families with cumulative
// _bucket{le=...} samples in seconds ending with le="+Inf" (= _count), then _sum and _count.
// Histograms are printed for the operations that have been called at least once.
//
// Thread-safety: pure functions. Error policy: none needed (the snapshot was validated).
#pragma once

#include <string>
#include <string_view>

#include "common/stats_layout.h"

namespace kvpool::stats {

// The Content-Type of the text.
inline constexpr std::string_view kPrometheusContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// A label value with \, " and newline escaped.
std::string escape_label(std::string_view value);

// The exposition text for `s`; `pool` restricts the per-pool families to the pool of that name
// ("" = every pool).
std::string prometheus_text(const Snapshot& s, std::string_view pool = {});

}  // namespace kvpool::stats

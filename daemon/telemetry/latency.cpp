#include "daemon/telemetry/latency.h"

#include "common/wire/protocol.h"

namespace kvpool::daemon {

LatencyRecorder::LatencyRecorder(bool enabled) : enabled_(enabled) {
  for (uint16_t op = 0; op < stats::kMaxOps; ++op)
    stats::set_name(ops_[op].name, wire::opcode_name(op));
}

}  // namespace kvpool::daemon

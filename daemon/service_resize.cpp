#include "daemon/service.h"

namespace kvpool::daemon {

wire::Result<wire::Reply> Service::segments(SessionState& s, std::span<const int>* fds) {
  *fds = s.pool->memory->fds();
  wire::PoolInfo info = s.pool->info;
  info.tenant = tenant_names_[s.tenant];
  return wire::Reply(wire::SegmentsReply{std::move(info)});
}

wire::Result<wire::Reply> Service::resize(SessionState& s, const wire::ResizeRequest& r) {
  (void)s;
  (void)r;
  return wire::Error{Status(Errc::invalid_argument), "resize: not yet"};
}

}  // namespace kvpool::daemon

// Service: daemon-side page copies (opcode 12), validated on the event loop and run there when
// small, or handed to the caller as a CopyJob to run off the loop (see service.h, "Copies").
#include <unordered_map>

#include "common/byte_units.h"
#include "daemon/core/check.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

wire::Result<std::unique_ptr<CopyJob>> Service::prepare_copy(SessionState& s, uint32_t request_id,
                                                             const wire::CopyRequest& r) {
  const core::PagePool& pool = s.pool->pages();
  const uint64_t page_bytes = page_data_bytes(s.pool->info().geometry);
  if (r.pairs.size() * page_bytes > wire::kMaxCopyBytes) {
    return wire::Error::of(Errc::invalid_argument,
                           "copy of " + std::to_string(r.pairs.size()) + " pages (" +
                               human_bytes(r.pairs.size() * page_bytes) + ") is above the " +
                               human_bytes(wire::kMaxCopyBytes) + " a request may move",
                           r.pairs.size());
  }
  // Everything is checked before any byte moves: a refused request copies nothing.
  auto job = std::make_unique<CopyJob>();
  job->pool = s.pool;
  job->request_id = request_id;
  std::vector<PageId>& src = job->src;
  std::vector<PageId>& dst = job->dst;
  src.resize(r.pairs.size());
  dst.resize(r.pairs.size());
  // The roles each page named so far plays (1 read, 2 written): sized by the request, not the pool.
  std::unordered_map<PageId, uint8_t> seen;
  seen.reserve(2 * r.pairs.size());
  for (size_t i = 0; i < r.pairs.size(); ++i) {
    const auto item = static_cast<uint32_t>(i);
    const auto [from, to] = r.pairs[i];
    for (const PageId p : {from, to}) {
      if (!pool.valid_page(p)) {
        return wire::Error{Status(Errc::invalid_page, item, p),
                           "copy pair " + std::to_string(i) + ": page " + std::to_string(p) +
                               " is not a page of pool " + s.pool->name()};
      }
      if (pool.held(s.owner, p) == 0) {
        return wire::Error{Status(Errc::not_held, item, p), "copy pair " + std::to_string(i) +
                                                                ": page " + std::to_string(p) +
                                                                " is not held by this session"};
      }
    }
    if (pool.published(to)) {
      return wire::Error{Status(Errc::already_published, item, to),
                         "copy pair " + std::to_string(i) + ": destination page " +
                             std::to_string(to) + " is published; its bytes are shared and fixed"};
    }
    // A page may be read by several pairs but written by one, and never both read and written.
    const auto role = [&seen](PageId p) -> uint8_t {
      const auto it = seen.find(p);
      return it == seen.end() ? 0 : it->second;
    };
    const bool from_written = (role(from) & 2) != 0;
    if (from == to || role(to) != 0 || from_written) {
      return wire::Error{Status(Errc::duplicate_item, item, to),
                         "copy pair " + std::to_string(i) + ": page " +
                             std::to_string(from_written ? from : to) +
                             " is both a source and a destination, or a destination twice"};
    }
    seen[from] |= 1;
    seen[to] |= 2;
    src[i] = from;
    dst[i] = to;
  }
  kernels::CopyPagesArgs& args = job->args;
  args.kv = s.pool->paged_kv();
  args.num_pairs = static_cast<uint32_t>(r.pairs.size());
  args.src = src.data();
  args.dst = dst.data();
  return job;
}

wire::Result<wire::Reply> Service::copy(SessionState& s, const wire::CopyRequest& r, Call& call) {
  auto job = prepare_copy(s, call.request_id, r);
  if (!job.ok()) return job.error();
  job.value()->started_ns = call.started_ns;
  PoolRuntime& pool = *job.value()->pool;
  const uint64_t bytes = job.value()->src.size() * pool.info().page_stride;
  if (call.deferred != nullptr && (bytes > inline_copy_bytes_ || pool.copies_in_flight() > 0)) {
    pool.begin_job();
    *call.deferred = std::move(job.value());
    return wire::Reply(wire::CopyReply{});  // never sent: finish_copy answers
  }
  job.value()->run();
  return copy_reply(*job.value());
}

wire::Result<wire::Reply> Service::copy_reply(const CopyJob& job) const {
  if (!job.error.empty()) {
    log_event(LogLevel::error, "copy_failed",
              {kv("pool", job.pool->name()), kv("error", job.error)});
    return wire::Error::of(Errc::internal, "page copy failed: " + job.error);
  }
  return wire::Reply(wire::CopyReply{job.args.num_pairs});
}

std::unique_ptr<CopyJob> Service::finish_copy(CopyJob& job, std::vector<std::byte>& out) {
  if (job.counted()) job.pool->end_job();
  pools_->drop_group_evictions();
  if (job.finish) {
    // A call whose slow part ran off the loop: its reply is made now.
    pools_->tick();
    auto reply = job.finish();
    // A promotion from the host tier whose chain goes on in the remote tier: its fetch next.
    if (call_job_) return take_call_job(*job.session, job.request_id, job.op, job.started_ns);
    // A remote fetch's promotion: copies like any tier copy's, here or as the next job.
    std::unique_ptr<CopyJob> next;
    if (job.remote_fetch() && job.session->attached &&
        run_tier_copies(*job.session, job.request_id, job.op, job.started_ns, reply, &next)) {
      return next;
    }
    encode_answer(*job.session, job.request_id, job.op, reply, out);
    access_.refresh_held(*job.session);
  } else {
    const auto reply = copy_reply(job);
    if (reply.ok()) {
      wire::encode_reply(job.request_id, reply.value(), out);
    } else {
      wire::encode_error(job.request_id, static_cast<uint16_t>(wire::Opcode::copy), reply.error(),
                         out);
    }
  }
  if (job.started_ns != 0) {
    service_latency_.record(static_cast<uint16_t>(job.op),
                            LatencyRecorder::now_ns() - job.started_ns);
  }
  if (job.session != nullptr && job.session->attached && job.pool->elastic()) {
    pools_->grow_ahead(*job.pool);
  }
  return nullptr;
}

}  // namespace kvpool::daemon

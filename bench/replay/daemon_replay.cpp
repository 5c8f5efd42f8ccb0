#include "bench/replay/daemon_replay.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "bench/ipc/ping_pong.h"
#include "client/connection/connection.h"
#include "common/stats_layout.h"

namespace kvpool::bench {

namespace {

using Clock = std::chrono::steady_clock;

// Latency histogram with 0.1 µs bins up to 2 ms (the last bin takes the rest).
constexpr size_t kBins = 20000;
constexpr double kBinUs = 0.1;

enum Op { kAlloc = 0, kRelease = 1, kLookup = 2, kOps = 3 };

// Written by one worker in shared memory, read by the parent after the workers exit.
struct WorkerShare {
  uint64_t requests = 0;
  uint64_t pages = 0;
  uint64_t hit_pages = 0;
  uint64_t reused_pages = 0;
  uint64_t allocated_pages = 0;
  uint64_t alloc_failures = 0;
  uint64_t page_ops = 0;
  char error[256] = {};
  uint32_t hist[kOps][kBins];
};

void record(WorkerShare& w, Op op, Clock::time_point t0) {
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  const auto bin = std::min<size_t>(static_cast<size_t>(us / kBinUs), kBins - 1);
  ++w.hist[op][bin];
}

void fail(WorkerShare& w, const std::string& what) {
  std::snprintf(w.error, sizeof w.error, "%s", what.c_str());
}

// Runs the requests of one worker; returns false (with w.error set) on a failed call.
bool work(const Trace& trace, const DaemonReplayOptions& o, uint32_t index, WorkerShare& w,
          const std::vector<int>& ring) {
  auto conn = client::Connection::attach(o.sockets[index % o.sockets.size()],
                                         "replay-worker-" + std::to_string(index));
  if (!conn.ok()) {
    fail(w, conn.error().message);
    return false;
  }
  client::Connection& c = *conn.value();
  const uint32_t per_block = kTraceBlockTokens / o.page_tokens;
  const uint32_t n_workers = o.workers;
  std::vector<BlockHash> chain;
  std::vector<PageId> held;
  for (size_t r = index; r < trace.requests.size(); r += n_workers) {
    if (o.ordered) {
      char token = 0;
      if (::read(ring[size_t{index} * 2], &token, 1) != 1) {
        fail(w, "token ring broken");
        return false;
      }
    }
    chain.clear();
    for (const uint64_t id : trace.requests[r].hash_ids) {
      for (uint32_t j = 0; j < per_block; ++j) {
        chain.push_back(trace_page_hash(id, j));
      }
    }
    auto t0 = Clock::now();
    auto hits = c.lookup(chain);
    record(w, kLookup, t0);
    if (!hits.ok()) {
      fail(w, "lookup: " + hits.error().message);
      return false;
    }
    // A sliding or chunked pool may answer kNoPage before its window: no page, nothing held.
    const size_t answered = hits.value().size();
    held.clear();
    for (const PageId p : hits.value()) {
      if (p != kNoPage) held.push_back(p);
    }
    w.hit_pages += held.size();
    w.page_ops += chain.size();
    for (size_t i = answered; i < chain.size(); ++i) {
      t0 = Clock::now();
      auto one = c.lookup(std::span(chain).subspan(i, 1));
      record(w, kLookup, t0);
      if (!one.ok()) {
        fail(w, "lookup: " + one.error().message);
        return false;
      }
      ++w.page_ops;
      if (!one.value().empty()) {
        held.push_back(one.value()[0]);
        ++w.reused_pages;
        continue;
      }
      t0 = Clock::now();
      auto page = c.alloc(1);
      record(w, kAlloc, t0);
      if (!page.ok()) {
        if (page.error().status.code() == Errc::out_of_pages) {
          ++w.alloc_failures;
          continue;
        }
        fail(w, "alloc: " + page.error().message);
        return false;
      }
      const PublishItem item{page.value()[0], chain[i]};
      auto pub = c.publish(std::span(&item, 1));
      if (!pub.ok()) {
        fail(w, "publish: " + pub.error().message);
        return false;
      }
      held.push_back(page.value()[0]);
      ++w.allocated_pages;
      w.page_ops += 2;
    }
    std::reverse(held.begin(), held.end());
    t0 = Clock::now();
    auto rel = c.release(held);
    record(w, kRelease, t0);
    if (!rel.ok()) {
      fail(w, "release: " + rel.error().message);
      return false;
    }
    w.page_ops += held.size();
    w.pages += chain.size();
    ++w.requests;
    if (o.ordered) {
      const char token = 't';
      (void)!::write(ring[((index + 1) % n_workers) * 2 + 1], &token, 1);
    }
  }
  return true;
}

LatencySummary summarize(const std::vector<WorkerShare*>& shares, Op op) {
  std::vector<uint64_t> total(kBins, 0);
  LatencySummary s;
  for (const WorkerShare* w : shares) {
    for (size_t b = 0; b < kBins; ++b)
      total[b] += w->hist[op][b];
  }
  for (const uint64_t v : total)
    s.calls += v;
  if (s.calls == 0) return s;
  auto quantile = [&](double q) {
    const auto target = static_cast<uint64_t>(q * double(s.calls - 1));
    uint64_t seen = 0;
    for (size_t b = 0; b < kBins; ++b) {
      seen += total[b];
      if (seen > target) return (double(b) + 0.5) * kBinUs;
    }
    return double(kBins) * kBinUs;
  };
  s.p50_us = quantile(0.50);
  s.p99_us = quantile(0.99);
  return s;
}

}  // namespace

DaemonReplayResult replay_through_daemon(const Trace& trace, const DaemonReplayOptions& o) {
  if (o.workers == 0) throw std::invalid_argument("need at least one worker");
  if (o.page_tokens == 0 || kTraceBlockTokens % o.page_tokens != 0) {
    throw std::invalid_argument("page tokens must divide 512");
  }
  if (o.sockets.empty()) throw std::invalid_argument("need at least one daemon");
  if (o.workers % o.sockets.size() != 0) {
    throw std::invalid_argument(
        "the workers (" + std::to_string(o.workers) + ") must be a multiple of the daemons (" +
        std::to_string(o.sockets.size()) + "), so that requests go round-robin over the daemons");
  }
  std::vector<std::unique_ptr<client::Connection>> probes;
  for (const std::string& socket : o.sockets) {
    auto c = client::Connection::attach(socket, "replay-probe");
    if (!c.ok()) throw std::runtime_error(socket + ": " + c.error().message);
    auto st = c.value()->stats();
    if (!st.ok()) throw std::runtime_error(socket + ": " + st.error().message);
    if (st.value().in_use != 0 || st.value().cached != 0) {
      throw std::runtime_error("the daemon at " + socket + ": its pool is not empty (" +
                               std::to_string(st.value().cached) + " cached, " +
                               std::to_string(st.value().in_use) +
                               " in use): replay needs a fresh daemon");
    }
    probes.push_back(std::move(c.value()));
  }
  client::Connection* const probe_conn = probes.front().get();
  const auto before = probe_conn->stats();
  if (!before.ok()) throw std::runtime_error(before.error().message);
  // The pool's eviction policy, so that the in-process replay can use the same one.
  std::string policy;
  if (auto snap = probe_conn->snapshot(); snap.ok()) {
    stats::Snapshot s;
    if (stats::decode(snap.value().bytes, snap.value().layout_version, s).empty()) {
      if (const stats::PoolStats* p = s.find_pool(probe_conn->pool().pool_name)) {
        policy = p->policy;
      }
    }
  }
  if (policy.empty()) throw std::runtime_error("the daemon's stats snapshot names no policy");
  const uint32_t per_block = kTraceBlockTokens / o.page_tokens;
  const size_t share_bytes = sizeof(WorkerShare) * o.workers;
  void* mem =
      ::mmap(nullptr, share_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("mmap of the result area failed");
  std::vector<WorkerShare*> shares;
  for (uint32_t w = 0; w < o.workers; ++w) {
    shares.push_back(new (static_cast<WorkerShare*>(mem) + w) WorkerShare());
  }
  std::vector<int> ring(size_t{o.workers} * 2,
                        -1);  // ring[2w] read end of worker w, ring[2w+1] write
  for (uint32_t w = 0; w < o.workers; ++w) {
    if (::pipe(&ring[size_t{w} * 2]) != 0) throw std::runtime_error("pipe failed");
  }

  const auto start = Clock::now();
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (uint32_t w = 0; w < o.workers; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(work(trace, o, w, *shares[w], ring) ? 0 : 1);
    pids.push_back(pid);
  }
  if (o.ordered) (void)!::write(ring[1], "t", 1);
  bool all_ok = true;
  for (const pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    all_ok = all_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (const int fd : ring)
    ::close(fd);

  DaemonReplayResult res;
  res.workers = o.workers;
  res.ordered = o.ordered;
  res.replay.policy = "daemon";
  res.replay.page_tokens = o.page_tokens;
  res.replay.capacity_pages = before.value().total;
  res.replay.policy = policy;
  res.replay.capacity_blocks = before.value().total / per_block;
  res.replay.seconds = seconds;
  std::string errors;
  for (uint32_t w = 0; w < o.workers; ++w) {
    const WorkerShare& s = *shares[w];
    res.replay.requests += s.requests;
    res.replay.pages += s.pages;
    res.replay.hit_pages += s.hit_pages;
    res.replay.reused_pages += s.reused_pages;
    res.replay.allocated_pages += s.allocated_pages;
    res.replay.alloc_failures += s.alloc_failures;
    res.replay.page_ops += s.page_ops;
    if (s.error[0] != '\0') errors += "worker " + std::to_string(w) + ": " + s.error + "; ";
  }
  res.alloc = summarize(shares, kAlloc);
  res.release = summarize(shares, kRelease);
  res.lookup = summarize(shares, kLookup);
  res.daemons = static_cast<uint32_t>(probes.size());
  for (const auto& probe : probes) {
    const auto after = probe->stats();
    if (!after.ok()) continue;
    res.replay.evicted_pages += after.value().counter("evicted");
    res.converted_pages += after.value().counter("converted");
    res.converted_back_pages += after.value().counter("converted_back");
    res.remote_hit_pages += after.value().counter("remote_hits");
    res.remote_stored_pages += after.value().counter("remote_stored");
  }
  ::munmap(mem, share_bytes);
  if (!all_ok) throw std::runtime_error("a replay worker failed: " + errors);

  auto request_bytes = [](const wire::Request& m) {
    std::vector<std::byte> b;
    wire::encode_request(1, m, b);
    return static_cast<uint32_t>(b.size());
  };
  auto reply_bytes = [](const wire::Reply& m) {
    std::vector<std::byte> b;
    wire::encode_reply(1, m, b);
    return static_cast<uint32_t>(b.size());
  };
  const size_t mean_pages =
      res.replay.requests == 0 ? 1 : std::max<size_t>(1, res.replay.pages / res.replay.requests);
  res.alloc.request_bytes = request_bytes(wire::AllocRequest{1});
  res.alloc.reply_bytes = reply_bytes(wire::AllocReply{{0}});
  res.release.request_bytes = request_bytes(wire::ReleaseRequest{std::vector<PageId>(mean_pages)});
  res.release.reply_bytes = reply_bytes(wire::ReleaseReply{});
  res.lookup.request_bytes = request_bytes(wire::LookupRequest{{BlockHash{}}});
  res.lookup.reply_bytes = reply_bytes(wire::LookupReply{{0}, {wire::kTierDevice}});
  PingPong pp("/tmp/kvpool-replay-pingpong-" + std::to_string(::getpid()) + ".sock");
  constexpr size_t kRoundTrips = 20000;
  for (LatencySummary* l : {&res.alloc, &res.release, &res.lookup}) {
    const Percentiles p = pp.measure(l->request_bytes, l->reply_bytes, kRoundTrips);
    l->baseline_p50_us = p.p50;
    l->baseline_p99_us = p.p99;
  }
  return res;
}

}  // namespace kvpool::bench

// CopyWorker: runs daemon-side page copies (and, as another instance, the remote tier's I/O), and
// the host-tier demotions and promotions of calls too large for the loop, on a thread of their own,
// so that a 1 GiB copy never holds the event loop (DESIGN §7: the loop is never blocked).
//
// The event loop submits a CopyJob that the Service validated; the worker thread runs it and
// posts the completion back to the loop's io_context, where the Server answers the request. Jobs
// run one at a time in submission order (a pool's copier is used by one thread at a time: the
// Service defers every copy of a pool while one is in flight). The thread starts with the first
// job and runs at the lowest ordinary priority (nice +19): when the CPUs are busy, the loop and
// the workers it serves are scheduled first and the copy takes what is left; it is never starved
// outright, as SCHED_IDLE would allow on a machine whose CPU workers keep every core busy. With
// nice +10, a copy's 1 GiB memcpy still showed in others' p99 on a 2-vCPU machine (3.4× quiet);
// with +19 it stayed within 1.3× (bench/RESULTS.md). The price: while every CPU is busy with
// ordinary-priority work, a host-memory copy gets a small share of one (about 1.5% against one
// busy nice-0 thread) and its worker waits longer for it; on a GPU pool the thread mostly waits
// for the device.
//
// What keeps a running copy safe: the job's pages stay held by its session until the completion
// ran (the Server reads no more requests from that connection and defers its close), so no page
// it reads or writes can be freed and handed out meanwhile.
//
// Thread-safety: submit() and stop() are called from the event loop; run() on the worker thread;
// completions run on the event loop.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio/io_context.hpp>

#include "daemon/service/copy_job.h"

namespace kvpool::daemon {

class CopyWorker {
 public:
  using Done = std::function<void(std::unique_ptr<CopyJob>)>;

  // The nice value of copies (see above), and of the remote tier's workers: a lookup's fetch is
  // mostly waiting on the network and its reply waits for it (ordinary priority); a batch of
  // writes checksums every page, which no reply waits for (+10).
  static constexpr int kCopyNice = 19;
  static constexpr int kFetchNice = 0;
  static constexpr int kStoreNice = 10;

  explicit CopyWorker(boost::asio::io_context& io, int nice = kCopyNice) : io_(io), nice_(nice) {}
  CopyWorker(const CopyWorker&) = delete;
  CopyWorker& operator=(const CopyWorker&) = delete;
  ~CopyWorker() { stop(); }

  // Runs job->run() on the worker thread, then posts done(job) to the io_context.
  void submit(std::unique_ptr<CopyJob> job, Done done);
  // Drops the jobs not started (their completions never run) and waits for the running one,
  // whose completion is posted but may not run (the loop is stopping). Idempotent.
  void stop();

 private:
  void run();

  boost::asio::io_context& io_;
  int nice_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::pair<std::unique_ptr<CopyJob>, Done>> queue_;  // guarded by mu_
  bool stopping_ = false;                                        // guarded by mu_
  std::thread thread_;  // started by the first submit(); touched by the loop only
};

}  // namespace kvpool::daemon

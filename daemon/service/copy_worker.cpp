#include "daemon/service/copy_worker.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <boost/asio/post.hpp>

namespace kvpool::daemon {

void CopyWorker::submit(std::unique_ptr<CopyJob> job, Done done) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    queue_.emplace_back(std::move(job), std::move(done));
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  wake_.notify_one();
}

void CopyWorker::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void CopyWorker::run() {
  // Linux nice values are per thread: this lowers only the worker (see the header for why +19).
  // Raising one's own nice value needs no privilege; if it fails the copies simply compete on
  // equal terms.
  if (nice_ != 0)
    (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), nice_);
  for (;;) {
    std::unique_ptr<CopyJob> job;
    Done done;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front().first);
      done = std::move(queue_.front().second);
      queue_.pop_front();
    }
    job->run();
    boost::asio::post(
        io_, [done = std::move(done), job = std::move(job)]() mutable { done(std::move(job)); });
  }
}

}  // namespace kvpool::daemon

// CopyJob: the work of one call that runs off the event loop: a validated page copy (opcode
// copy), the host-tier copies of an alloc, lookup or evict whose reply waits for them, or the
// making of an admin resize's segments; and the daemon's own memory work (segments made ahead of
// need, released ones given back), which has no session.
//
// run() may be called on any thread (one job of a pool at a time: while one is in flight every
// further job of its pool queues behind it); everything else belongs to the event loop. Page and
// host-tier copies (no other work) count in the pool's copies_in_flight(): they use the pool's
// copiers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/wire/protocol.h"
#include "daemon/memory/host_tier_store.h"
#include "daemon/pool/pool_runtime.h"
#include "daemon/service/session.h"
#include "kernels/paged_kv.h"

namespace kvpool::daemon {

struct CopyJob {
  // The thread that runs it: the CopyWorker (copies, memory work), or the remote tier's workers
  // (network I/O, which must not hold the copies up: a lookup's fetch, a batch of writes).
  enum class Worker : uint8_t { copy, remote_fetch, remote_store };
  Worker worker = Worker::copy;
  PoolRuntime* pool = nullptr;
  SessionState* session = nullptr;  // a call's job: the caller (alive until it is finished)
  uint32_t request_id = 0;
  wire::Opcode op = wire::Opcode::copy;
  uint64_t started_ns = 0;  // for the service latency histogram (0 = not timed)
  std::vector<PageId> src;
  std::vector<PageId> dst;
  kernels::CopyPagesArgs args;  // points into src and dst
  std::string error;            // set by run(): "" or the copier's error text
  // Host-tier copies (PoolHostTier's step 2).
  std::unique_ptr<TierCopy> tier;
  // Other work off the loop (making or releasing segments).
  std::function<void()> work;
  // On the loop once run: the call's reply (null: a page copy's), or, for the daemon's own
  // background jobs (no session), what completes them.
  std::function<wire::Result<wire::Reply>()> finish;
  std::function<void()> done;

  bool counted() const { return !work; }
  // A lookup's remote fetch: once finished, its promotion's tier copies may follow.
  bool remote_fetch() const { return worker == Worker::remote_fetch; }

  // The page count was taken on the loop (args.kv.num_pages): an elastic pool may resize while
  // this runs, above the pages it copies, which its session holds.
  void run() {
    if (tier) pool->run_tier(*tier);
    if (work) work();
    if (args.num_pairs != 0) error = pool->memory().copy_pages(args, args.kv.num_pages);
  }
};

}  // namespace kvpool::daemon

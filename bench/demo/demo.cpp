// kvpool-demo: several worker processes share one kvpoold pool.
//
// Every request of every worker is a long shared system prompt plus a user part of its own. A
// worker starts each request with SequenceCache::begin() (the cached prefix needs no compute),
// checks that every reused page holds exactly the bytes its publisher wrote, writes stand-in K/V
// (bench/demo/kv_pattern.h) for the tokens it computes, publishes full pages, decodes a few
// tokens and releases the sequence. It prints the hit rate, the pool's pages by state and the
// elapsed time; it exits 0 only if every check held in every worker.

#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/demo/kv_pattern.h"
#include "client/connection/connection.h"
#include "client/worker/sequence_cache.h"
#include "common/main_guard.h"

namespace {

using kvpool::BlockHash;
using kvpool::BlockHasher;
using kvpool::client::Connection;
using kvpool::client::SequenceCache;

struct Options {
  std::string socket;
  uint32_t workers = 4;
  uint32_t requests = 6;
  uint32_t system_tokens = 256;
  uint32_t min_user_tokens = 32;
  uint32_t max_user_tokens = 96;
  uint32_t decode_tokens = 8;
};

struct WorkerReport {
  uint64_t requests = 0;
  uint64_t prompt_tokens = 0;
  uint64_t cached_tokens = 0;
  uint64_t pages_verified = 0;
  uint64_t mismatches = 0;
  uint64_t adopted = 0;
  int failed_call = 0;  // 0 or the line of the call that failed
};

// Stand-in K/V of token `pos` of a sequence.
uint64_t seed_of(const SequenceCache& s, const std::vector<uint32_t>& tokens, uint32_t pos,
                 const BlockHash& root) {
  const uint32_t t = s.tokens_per_page();
  const uint32_t b = pos / t;
  const BlockHash& parent = b == 0 ? root : s.block_hashes()[b - 1];
  const auto block = std::span(tokens).subspan(
      uint64_t{b} * t, std::min<uint64_t>(t, tokens.size() - uint64_t{b} * t));
  return kvpool::demo::token_seed(parent, block, pos % t);
}

WorkerReport run_worker(const Options& o, uint32_t index, const std::vector<uint32_t>& system) {
  WorkerReport rep;
  auto conn = Connection::attach(o.socket, "demo-worker-" + std::to_string(index));
  if (!conn.ok()) {
    std::fprintf(stderr, "worker %u: %s\n", index, conn.error().message.c_str());
    rep.failed_call = __LINE__;
    return rep;
  }
  Connection& c = *conn.value();
  const kvpool::Geometry g = c.pool().geometry;
  BlockHasher hasher;
  const BlockHash root = hasher.root({"kvpool-demo-model", g, "", ""});
  std::mt19937 rng(1234 + index);
  for (uint32_t r = 0; r < o.requests; ++r) {
    std::vector<uint32_t> tokens = system;
    const auto user = static_cast<uint32_t>(o.min_user_tokens +
                                            rng() % (o.max_user_tokens - o.min_user_tokens + 1));
    for (uint32_t i = 0; i < user; ++i)
      tokens.push_back(100000 + index * 10000 + r * 1000 + i);
    SequenceCache seq(c, hasher, root);
    auto cached = seq.begin(tokens);
    if (!cached.ok()) {
      std::fprintf(stderr, "worker %u: begin: %s\n", index, cached.error().message.c_str());
      rep.failed_call = __LINE__;
      return rep;
    }
    // Reused pages: every token's K/V must be exactly what the publisher wrote (a sliding pool's
    // hit may hold no page before its window).
    for (uint32_t pos = 0; pos < cached.value(); ++pos) {
      const auto slot = seq.slot(pos);
      if (slot.page == kvpool::kNoPage) continue;
      if (!kvpool::demo::check_token(g, c.page(slot.page), slot.offset,
                                     seed_of(seq, tokens, pos, root))) {
        ++rep.mismatches;
      }
      if (slot.offset == 0) ++rep.pages_verified;
    }
    // "Prefill" the rest.
    for (uint32_t pos = cached.value(); pos < tokens.size(); ++pos) {
      const auto slot = seq.slot(pos);
      kvpool::demo::write_token(g, c.page(slot.page), slot.offset, seed_of(seq, tokens, pos, root));
    }
    auto adopted = seq.publish_full();
    if (!adopted.ok()) {
      rep.failed_call = __LINE__;
      return rep;
    }
    rep.adopted += adopted.value();
    // "Decode" a few tokens.
    for (uint32_t d = 0; d < o.decode_tokens; ++d) {
      const uint32_t token = 500000 + d;
      auto slot = seq.append(token);
      if (!slot.ok()) {
        rep.failed_call = __LINE__;
        return rep;
      }
      tokens.push_back(token);
      kvpool::demo::write_token(g, c.page(slot.value().page), slot.value().offset,
                                seed_of(seq, tokens, seq.tokens() - 1, root));
    }
    if (!seq.publish_full().ok() || !seq.release().ok()) {
      rep.failed_call = __LINE__;
      return rep;
    }
    ++rep.requests;
    rep.prompt_tokens += tokens.size() - o.decode_tokens;
    rep.cached_tokens += cached.value();
  }
  return rep;
}

int run(int argc, char** argv) {
  CLI::App app{"kvpool-demo: worker processes sharing a system prompt through kvpoold"};
  Options o;
  o.socket = kvpool::client::default_socket_path();
  app.add_option("--socket", o.socket, "kvpoold's socket")->capture_default_str();
  app.add_option("--workers", o.workers, "Worker processes")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--requests", o.requests, "Requests per worker")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  app.add_option("--system-tokens", o.system_tokens, "Tokens of the shared system prompt")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto observer = Connection::attach(o.socket, "demo-observer");
  if (!observer.ok()) {
    std::fprintf(stderr, "kvpool-demo: %s\n", observer.error().message.c_str());
    return 1;
  }
  const auto& info = observer.value()->pool();
  std::printf("kvpool demo: %u workers x %u requests, shared system prompt of %u tokens\n",
              o.workers, o.requests, o.system_tokens);
  std::printf("pool %s: %u pages of %llu bytes (%u tokens each), backend %s, tenant %s\n",
              info.pool_name.c_str(), info.num_pages,
              static_cast<unsigned long long>(info.page_stride), info.geometry.tokens_per_page,
              info.backend.c_str(), info.tenant.c_str());
  std::vector<uint32_t> system(o.system_tokens);
  for (uint32_t i = 0; i < o.system_tokens; ++i)
    system[i] = 1000 + (i * 7919) % 50000;

  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (uint32_t w = 0; w < o.workers; ++w) {
    int fd[2];
    if (::pipe(fd) != 0) return 1;
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fd[0]);
      const WorkerReport rep = run_worker(o, w, system);
      (void)!::write(fd[1], &rep, sizeof rep);
      ::_exit(rep.failed_call == 0 && rep.mismatches == 0 ? 0 : 1);
    }
    ::close(fd[1]);
    pids.push_back(pid);
    pipes.push_back(fd[0]);
  }
  WorkerReport total;
  bool ok = true;
  for (uint32_t w = 0; w < o.workers; ++w) {
    WorkerReport rep;
    const bool got = ::read(pipes[w], &rep, sizeof rep) == static_cast<ssize_t>(sizeof rep);
    ::close(pipes[w]);
    int status = 0;
    ::waitpid(pids[w], &status, 0);
    const bool worker_ok = got && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    ok = ok && worker_ok;
    std::printf(
        "worker %u: %llu requests, %llu prompt tokens, %llu cached (%.1f%%), %llu reused "
        "pages verified, %llu mismatches, %llu pages adopted%s\n",
        w, static_cast<unsigned long long>(rep.requests),
        static_cast<unsigned long long>(rep.prompt_tokens),
        static_cast<unsigned long long>(rep.cached_tokens),
        rep.prompt_tokens ? 100.0 * double(rep.cached_tokens) / double(rep.prompt_tokens) : 0.0,
        static_cast<unsigned long long>(rep.pages_verified),
        static_cast<unsigned long long>(rep.mismatches),
        static_cast<unsigned long long>(rep.adopted), worker_ok ? "" : "  FAILED");
    total.requests += rep.requests;
    total.prompt_tokens += rep.prompt_tokens;
    total.cached_tokens += rep.cached_tokens;
    total.pages_verified += rep.pages_verified;
    total.mismatches += rep.mismatches;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto stats = observer.value()->stats();
  if (!stats.ok()) return 1;
  const auto& s = stats.value();
  std::printf(
      "hit rate: %.1f%% of prompt tokens (%llu of %llu) came from the pool\n",
      total.prompt_tokens ? 100.0 * double(total.cached_tokens) / double(total.prompt_tokens) : 0.0,
      static_cast<unsigned long long>(total.cached_tokens),
      static_cast<unsigned long long>(total.prompt_tokens));
  std::printf("pages: %u free, %u in use, %u cached (of %u); %llu evicted, %llu published\n",
              s.free, s.in_use, s.cached, s.total,
              static_cast<unsigned long long>(s.counter("evicted")),
              static_cast<unsigned long long>(s.counter("published")));
  std::printf("elapsed: %.3f s for %llu requests\n", elapsed,
              static_cast<unsigned long long>(total.requests));
  ok = ok && total.mismatches == 0 && total.requests == uint64_t{o.workers} * o.requests &&
       total.pages_verified > 0;
  std::printf("%s: %llu reused pages checked byte for byte, %llu mismatches\n",
              ok ? "OK" : "FAILED", static_cast<unsigned long long>(total.pages_verified),
              static_cast<unsigned long long>(total.mismatches));
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return kvpool::guarded_main("kvpool-demo", [&] { return run(argc, argv); });
}

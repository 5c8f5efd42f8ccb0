// Micro-benchmarks of the daemon's Service calls (no sockets), each timed around the one call,
// its pages given back outside the timed section:
//   - a hybrid model's lookup: a lookup of a 64-block chain on a plain pool (one group) against
//     lookup_groups on a model of two groups (a sliding window and a full group) that hold the
//     same blocks, each answered whole; the ratio is the cost of the second group;
//   - a static reservation of a 64-page sequence (one reserve) against the dynamic cache's
//     allocs as the sequence grows (64 allocs of one page) and one alloc of 64.
#include <benchmark/benchmark.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/wire/protocol.h"
#include "daemon/config/config.h"
#include "daemon/memory/host_backend.h"
#include "daemon/service/service.h"
#include "daemon/telemetry/log.h"

namespace {

using namespace kvpool;
using namespace kvpool::daemon;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kBlocks = 64;

const char kConfig[] = R"(backend: host
logging: {level: error}
metrics: {latency_histograms: false, stats_segment: false}
pools:
  - name: plain
    capacity: 8MiB
    geometry: {layers: 24, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: bf16}
  - name: m
    capacity: 8MiB
    segment_size: 1MiB
    geometry: {layers: 24, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: bf16}
    groups:
      - {name: local, layers: 12, kind: sliding, window: 128}
      - {name: global, layers: 12}
)";

BlockHash hash_of(uint64_t i) {
  return BlockHash{i * 0x9E3779B97F4A7C15ull + 1, i};
}

struct Bench {
  std::unique_ptr<Service> svc;
  std::vector<std::unique_ptr<SessionState>> sessions;
  std::vector<std::byte> out;
  uint32_t id = 1;

  Bench() {
    auto config = parse_config(kConfig, "group_lookup_bench");
    if (!config.ok()) throw std::runtime_error(config.error().message);
    auto created = Service::create(config.value(), std::make_unique<HostBackend>());
    if (!created.ok()) throw std::runtime_error(created.error().message);
    svc = std::move(created.value());
  }
  wire::Reply call(SessionState& s, const wire::Request& r) {
    out.clear();
    std::span<const int> fds;
    svc->handle(s, id++, r, out, &fds);
    auto h = wire::decode_header(std::span(out).first(wire::kHeaderBytes));
    auto reply = wire::decode_reply(h.value(), std::span(out).subspan(wire::kHeaderBytes));
    if (!reply.ok()) throw std::runtime_error(reply.error().message);
    return reply.value();
  }
  SessionState& open(const std::string& pool, uint64_t link = 0) {
    auto s = svc->open_session(PeerCredentials{::getpid(), ::getuid(), ::getgid()});
    sessions.push_back(std::move(s.value()));
    call(*sessions.back(), wire::HelloRequest{"bench", pool, link});
    return *sessions.back();
  }
  // Publishes the chain in the session's pool and leaves it cached.
  void publish(SessionState& s, const std::vector<BlockHash>& chain) {
    const auto pages = std::get<wire::AllocReply>(call(s, wire::AllocRequest{kBlocks})).pages;
    wire::PublishRequest p;
    for (uint32_t i = 0; i < kBlocks; ++i)
      p.items.push_back({pages[i], chain[i]});
    call(s, p);
    call(s, wire::ReleaseRequest{pages});
  }
};

std::vector<BlockHash> chain_of() {
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < kBlocks; ++i)
    chain.push_back(hash_of(i));
  return chain;
}

void BM_Lookup(benchmark::State& state) {
  Bench b;
  SessionState& s = b.open("plain");
  const std::vector<BlockHash> chain = chain_of();
  b.publish(s, chain);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const wire::Reply r = b.call(s, wire::LookupRequest{chain});
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    b.call(s, wire::ReleaseRequest{std::get<wire::LookupReply>(r).pages});
  }
  state.counters["blocks"] = kBlocks;
}

void BM_LookupGroups(benchmark::State& state) {
  Bench b;
  SessionState& local = b.open("m/local");
  SessionState& global = b.open("m/global", local.id);
  const std::vector<BlockHash> chain = chain_of();
  b.publish(local, chain);
  b.publish(global, chain);
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const wire::Reply r = b.call(local, wire::GroupLookupRequest{chain});
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    const auto& g = std::get<wire::GroupLookupReply>(r);
    if (g.hits() != kBlocks) state.SkipWithError("lookup_groups missed");
    for (size_t k = 0; k < 2; ++k) {
      std::vector<PageId> held;
      for (const PageId p : g.groups[k].pages) {
        if (p != kNoPage) held.push_back(p);
      }
      b.call(k == 0 ? local : global, wire::ReleaseRequest{held});
    }
  }
  state.counters["blocks"] = kBlocks;
}

void BM_Reserve(benchmark::State& state) {
  Bench b;
  SessionState& s = b.open("plain");
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const wire::Reply r = b.call(s, wire::ReserveRequest{kBlocks * 16, {}});
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    b.call(s, wire::UnreserveRequest{std::get<wire::ReserveReply>(r).reservation});
  }
  state.counters["pages"] = kBlocks;
}

// range(0): pages per alloc (1: one per page as a decode fills it).
void BM_Alloc(benchmark::State& state) {
  Bench b;
  SessionState& s = b.open("plain");
  const auto per_call = static_cast<uint32_t>(state.range(0));
  std::vector<PageId> pages;
  for (auto _ : state) {
    pages.clear();
    const auto t0 = Clock::now();
    for (uint32_t n = 0; n < kBlocks; n += per_call) {
      const wire::Reply r = b.call(s, wire::AllocRequest{per_call});
      const auto& got = std::get<wire::AllocReply>(r).pages;
      pages.insert(pages.end(), got.begin(), got.end());
    }
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - t0).count());
    b.call(s, wire::ReleaseRequest{pages});
  }
  state.counters["pages"] = kBlocks;
}

BENCHMARK(BM_Lookup)->UseManualTime();
BENCHMARK(BM_Reserve)->UseManualTime();
BENCHMARK(BM_Alloc)->Arg(1)->Arg(kBlocks)->UseManualTime();
BENCHMARK(BM_LookupGroups)->UseManualTime();

}  // namespace

BENCHMARK_MAIN();

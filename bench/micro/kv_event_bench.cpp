// What KV events cost the daemon's event loop and the wire, with and without token ids: a
// turn of the loop holds 64 publishes of 16 blocks, each another sequence's first blocks (one
// BlockStored of 16 blocks each), the pool's KvEventBatcher collects them as the loop does, and the
// batch is encoded as the publisher sends it (vLLM's array form, 16-byte hashes,
// data_parallel_rank). Counters: blocks/s (blocks encoded per second of batcher + encoder time) and
// bytes_per_block (payload bytes, hashes and token ids included). Arguments: tokens_per_page, token
// ids (1/0).
//   build/release/bench/kvpool_kv_event_bench
#include <benchmark/benchmark.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/telemetry/kv_event_encoder.h"

namespace {

using namespace kvpool;
using namespace kvpool::daemon;

constexpr size_t kBlocksPerPublish = 16;
constexpr size_t kPublishes = 64;  // one batch: 1,024 blocks

void BM_KvEventBatch(benchmark::State& state) {
  const auto tpp = static_cast<uint32_t>(state.range(0));
  const bool with_tokens = state.range(1) != 0;
  KvEventFormat format;
  format.block_size = tpp;
  format.medium = "GPU";
  format.data_parallel_rank = 0;
  format.token_ids = with_tokens;
  // Token ids of a realistic vocabulary (128k): most msgpack as 5-byte uint32.
  std::vector<uint32_t> tokens(kBlocksPerPublish * kPublishes * tpp);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint32_t>((i * 2654435761u) % 128256u);
  std::vector<BlockHash> hashes(kBlocksPerPublish * kPublishes);
  for (size_t i = 0; i < hashes.size(); ++i)
    hashes[i] = BlockHash{0x9e3779b97f4a7c15ull * (i + 1), 0xc2b2ae3d27d4eb4full * (i + 7)};
  KvEventBatcher batcher;
  std::string payload;
  size_t bytes = 0;
  for (auto _ : state) {
    for (size_t b = 0; b < hashes.size(); ++b) {
      BlockChainInfo chain;
      // Each publish is another sequence's first 16 blocks: one BlockStored each.
      if (b % kBlocksPerPublish != 0) chain.parent = hashes[b - 1];
      if (with_tokens) chain.token_ids = std::span(tokens).subspan(b * tpp, tpp);
      batcher.stored(hashes[b], KvTier::pool, chain);
    }
    payload.clear();
    encode_kv_event_batch(1.0, batcher.take(), format, payload);
    bytes = payload.size();
    benchmark::DoNotOptimize(payload.data());
  }
  state.counters["blocks/s"] = benchmark::Counter(
      static_cast<double>(hashes.size()) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
  state.counters["bytes_per_block"] =
      static_cast<double>(bytes) / static_cast<double>(hashes.size());
}
BENCHMARK(BM_KvEventBatch)
    ->ArgNames({"tokens_per_page", "token_ids"})
    ->Args({16, 0})
    ->Args({16, 1})
    ->Args({64, 0})
    ->Args({64, 1});

}  // namespace

BENCHMARK_MAIN();

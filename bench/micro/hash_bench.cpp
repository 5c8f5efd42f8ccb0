// Block hashing cost: ns per token for a chain over 8,192 tokens, per algorithm and block size,
// and for vLLM's scheme (SHA-256 over CBOR, common/vllm_block_hash.h) in the same run. The block
// size sets the fixed per-block cost's share (one digest init/final per block).

#include <benchmark/benchmark.h>

#include <numeric>
#include <vector>

#include "common/block_hash.h"
#include "common/vllm_block_hash.h"

namespace {

using kvpool::BlockHash;
using kvpool::BlockHasher;
using kvpool::HashAlgorithm;

template <HashAlgorithm A>
void BM_HashChain(benchmark::State& state) {
  const auto tokens_per_block = static_cast<uint32_t>(state.range(0));
  constexpr size_t kTokens = 8192;
  std::vector<uint32_t> tokens(kTokens);
  std::iota(tokens.begin(), tokens.end(), 100u);
  std::vector<BlockHash> out(kTokens / tokens_per_block);
  BlockHasher hasher(A);
  const BlockHash root =
      hasher.root({"bench-model", {32, 8, 128, 16, kvpool::KvDtype::bf16}, "", ""});
  for (auto _ : state) {
    benchmark::DoNotOptimize(hasher.chain(root, tokens, tokens_per_block, out));
    benchmark::ClobberMemory();
  }
  state.counters["per_token"] = benchmark::Counter(
      double(kTokens), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(kvpool::hash_algorithm_name(A)));
}
BENCHMARK_TEMPLATE(BM_HashChain, HashAlgorithm::sha256)->Arg(16)->Arg(64)->Arg(256)->Arg(512);
BENCHMARK_TEMPLATE(BM_HashChain, HashAlgorithm::sha512_256)->Arg(16)->Arg(64)->Arg(256)->Arg(512);
BENCHMARK_TEMPLATE(BM_HashChain, HashAlgorithm::blake2s256)->Arg(16)->Arg(64)->Arg(256)->Arg(512);
BENCHMARK_TEMPLATE(BM_HashChain, HashAlgorithm::blake2b512)->Arg(16)->Arg(64)->Arg(256)->Arg(512);

void BM_VllmHashChain(benchmark::State& state) {
  const auto tokens_per_block = static_cast<uint32_t>(state.range(0));
  constexpr size_t kTokens = 8192;
  std::vector<uint32_t> tokens(kTokens);
  std::iota(tokens.begin(), tokens.end(), 100u);  // CBOR: 3-byte integers from 256 on
  std::vector<kvpool::VllmDigest> out(kTokens / tokens_per_block);
  kvpool::VllmBlockHasher hasher("0");
  for (auto _ : state) {
    benchmark::DoNotOptimize(hasher.chain(tokens, tokens_per_block, out));
    benchmark::ClobberMemory();
  }
  state.counters["per_token"] = benchmark::Counter(
      double(kTokens), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel("vllm-sha256-cbor");
}
BENCHMARK(BM_VllmHashChain)->Arg(16)->Arg(64)->Arg(256)->Arg(512);

}  // namespace

BENCHMARK_MAIN();

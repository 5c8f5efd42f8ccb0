// Shared by the mixed-precision integration tests (mixed_precision_test.cpp: full pools;
// mixed_precision_window_test.cpp: sliding and chunked pools): a daemon config with a bf16 and
// an fp8 pool of each kind, the prompt, the K/V every worker writes for a token, a worker's two
// connections and kernels, and a decode of a sequence's next query, mixed when it has older pages.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/mixed_sequence.h"
#include "client/worker/pool_kernels.h"
#include "common/block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing::mixed {

using client::Connection;
using client::MixedSequence;
using client::PoolKernels;

inline constexpr uint32_t kT = 16, kHeads = 2, kDim = 64, kQHeads = 8;
inline constexpr uint32_t kPrompt = 100;  // 6 full blocks and 4 tokens
inline constexpr uint32_t kRecent = 32;   // blocks [0, (100 − 32) / 16) = [0, 4) age

inline constexpr const char* kConfig = R"(
backend: host
pools:
  - name: recent
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16}
    capacity: 32 pages
  - name: older
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp8_e4m3}
    capacity: 32 pages
  - name: other
    geometry: {layers: 2, kv_heads: 2, head_dim: 128, tokens_per_page: 16, dtype: fp8_e4m3}
    capacity: 4 pages
  - name: chunk
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16,
               kind: chunked, window: 64}
    capacity: 32 pages
  - name: chunk8
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp8_e4m3,
               kind: chunked, window: 64}
    capacity: 32 pages
  - name: slide
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: bf16,
               kind: sliding, window: 64}
    capacity: 32 pages
  - name: slide8
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp8_e4m3,
               kind: sliding, window: 64}
    capacity: 32 pages
)";

// The prompt every worker of a test shares: n tokens.
inline std::vector<uint32_t> prompt(uint32_t n = kPrompt) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i)
    p[i] = 1000 + 7 * i;
  return p;
}

// Token t's K and V rows (every head), the same in every worker: [kHeads][kDim] each.
inline void kv_of(uint32_t t, std::vector<float>& k, std::vector<float>& v) {
  k.resize(size_t{kHeads} * kDim);
  v.resize(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = std::sin(0.37f * float(t) + 0.11f * float(i));
    v[i] = std::cos(0.23f * float(t) - 0.07f * float(i));
  }
}

// Writes tokens [from, to) of the sequence into its recent pages, every layer.
inline std::string write_tokens(PoolKernels& k, const MixedSequence& s, uint32_t from,
                                uint32_t to) {
  std::vector<float> kr, vr, ks, vs;
  std::vector<int64_t> slots;
  for (uint32_t t = from; t < to; ++t) {
    kv_of(t, kr, vr);
    ks.insert(ks.end(), kr.begin(), kr.end());
    vs.insert(vs.end(), vr.begin(), vr.end());
    slots.push_back(int64_t{s.block_table()[t / kT]} * kT + t % kT);
  }
  for (uint32_t layer = 0; layer < 2; ++layer) {
    kernels::AppendArgs a;
    a.layer = layer;
    a.num_tokens = to - from;
    a.k = ks.data();
    a.v = vs.data();
    a.slots = slots.data();
    if (std::string e = k.append_kv(a); !e.empty()) return e;
  }
  return {};
}

// Layer 1's decode of the sequence's next query: mixed when it has older pages.
inline std::string decode(PoolKernels& recent, PoolKernels& older, const MixedSequence& s,
                          std::vector<float>& out) {
  std::vector<float> q(size_t{kQHeads} * kDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::cos(0.05f * float(i));
  out.assign(q.size(), 0.0f);
  const uint32_t ctx = s.tokens();
  const uint32_t older_pages = s.older_pages();
  kernels::DecodeArgs a;
  a.layer = 1;
  a.num_seqs = 1;
  a.num_q_heads = kQHeads;
  a.q = q.data();
  a.out = out.data();
  a.block_tables = s.block_table().data();
  a.block_table_stride = static_cast<uint32_t>(s.block_table().size());
  a.context_lens = &ctx;
  a.scale = 0.125f;
  if (older_pages == 0) return recent.decode(a, ctx);
  return recent.decode_mixed(a, older, &older_pages, ctx);
}

inline bool save(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return bool(f);
}

inline std::vector<float> load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> v(size_t{kQHeads} * kDim);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  return v;
}

// The chain's root: the recent pool's model (both pools name blocks by it).
inline BlockHash root_of(BlockHasher& hasher) {
  Geometry g{2, kHeads, kDim, kT, KvDtype::bf16};
  return hasher.root({"mixed-test", g, "", ""});
}

// A worker's two connections, kernels and hasher.
struct Worker {
  explicit Worker(const Daemon& d, const std::string& name, const char* recent_pool = "recent",
                  const char* older_pool = "older")
      : recent(attach(d, name, recent_pool)), older(attach(d, name, older_pool)) {}
  bool ok() const { return recent && older; }
  std::unique_ptr<MixedSequence> sequence() {
    rk = std::make_unique<PoolKernels>(*recent);
    ok_ = std::make_unique<PoolKernels>(*older);
    auto s = MixedSequence::create(*recent, *rk, *older, *ok_, hasher, root_of(hasher), kRecent);
    return s.ok() ? std::move(s.value()) : nullptr;
  }
  std::unique_ptr<Connection> recent, older;
  std::unique_ptr<PoolKernels> rk, ok_;
  BlockHasher hasher;
};

// The hashes of p's full blocks, as MixedSequence names them (BlockHasher::chain from root_of).
inline std::vector<BlockHash> chain_of(const std::vector<uint32_t>& p) {
  BlockHasher hasher;
  std::vector<BlockHash> chain(p.size() / kT);
  hasher.chain(root_of(hasher), p, kT, chain);
  return chain;
}

inline uint32_t in_use(Connection& c) {
  auto st = c.stats();
  return st.ok() ? st.value().in_use : UINT32_MAX;
}

// Pages this connection's session holds.
inline uint32_t held(Connection& c) {
  auto st = c.stats();
  return st.ok() ? st.value().session_held_pages : UINT32_MAX;
}

// Two workers' mixed decodes (saved in files `first` and `second`) are the same bits, and within
// fp8's error of the all-bf16 decode saved in `bf16`, but not equal to it.
inline void expect_same_mixed_decode(const std::string& first, const std::string& second,
                                     const std::string& bf16) {
  const std::vector<float> a = load(first), b = load(second), ref = load(bf16);
  EXPECT_EQ(a, b) << "two workers reading the same mixed pages decode differently";
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, double{std::fabs(a[i] - ref[i])});
    norm = std::max(norm, double{std::fabs(ref[i])});
  }
  EXPECT_GT(err, 0.0) << "the aged blocks were not read in fp8";
  EXPECT_LT(err, 0.05 * norm) << "fp8 blocks far from their bf16 source";
}

}  // namespace kvpool::testing::mixed

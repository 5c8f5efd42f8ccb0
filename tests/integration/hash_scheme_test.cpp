// hello's hash scheme through a real kvpoold: a worker that names blocks with another algorithm,
// or with a faulty implementation of the daemon's scheme, is refused at attach with an error
// naming both schemes (instead of missing every block silently); the library's default and a
// worker that says nothing attach; a refused hello leaves no session behind. A pool whose
// hash_scheme is vLLM's takes workers hashing as vLLM does and refuses kvpool's own scheme, while
// kvpoolctl (which hashes nothing) inspects it.
#include <gtest/gtest.h>

#include <string>

#include "client/connection/connection.h"
#include "common/block_hash.h"
#include "common/vllm_block_hash.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/hardening_util.h"
#ifdef KVPOOLCTL_BIN  // built with the benchmarks (KVPOOL_BUILD_BENCH)
#include "tests/integration/ctl_helpers.h"
#endif

namespace kvpool::testing {
namespace {

using client::Connection;

TEST(HashScheme, AWorkerHashingOtherwiseIsRefusedNamingBothSchemes) {
  Daemon d(kHardeningPool);
  ASSERT_TRUE(d.start()) << d.log();
  auto ours = Connection::attach(d.socket(), "sha256-worker", "", Connection::Memory::none);
  ASSERT_TRUE(ours.ok()) << ours.error().message;

  BlockHasher blake(HashAlgorithm::blake2s256);
  auto other = Connection::attach(d.socket(), "blake-worker", "", Connection::Memory::none, 0,
                                  blake.scheme());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().status.code(), Errc::invalid_argument);
  const std::string& m = other.error().message;
  EXPECT_NE(m.find("this worker hashes blocks with kvpool-blake2s256/1"), std::string::npos) << m;
  EXPECT_NE(m.find("pool default's scheme is kvpool-sha256/1 (check "
                   "2177765eb5319c61ee270a6eb3074e5d"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("would never match"), std::string::npos) << m;

  // The right name with another check: an implementation that differs from the specification.
  HashScheme faulty = default_hash_scheme();
  faulty.check.hi ^= 1;
  auto wrong =
      Connection::attach(d.socket(), "faulty-worker", "", Connection::Memory::none, 0, faulty);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("differs from the specification"), std::string::npos)
      << wrong.error().message;

  // A worker that says nothing (a client of an older protocol's shape) is not checked.
  auto quiet =
      Connection::attach(d.socket(), "quiet-worker", "", Connection::Memory::none, 0, HashScheme{});
  ASSERT_TRUE(quiet.ok()) << quiet.error().message;
  auto sessions = ours.value()->sessions();
  ASSERT_TRUE(sessions.ok());
  EXPECT_EQ(sessions.value().size(), 2u);  // the refused ones left nothing
}

TEST(HashScheme, APoolOfVllmsSchemeTakesVllmHashersOnly) {
  Daemon d(R"(
pools:
  - name: chat
    hash_scheme: vllm-sha256-cbor/1
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
  - name: plain
    geometry: {layers: 2, kv_heads: 2, head_dim: 64, tokens_per_page: 16, dtype: fp16}
    capacity: 64 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  const HashScheme& vllm = VllmBlockHasher::scheme();
  auto engine =
      Connection::attach(d.socket(), "vllm-engine", "chat", Connection::Memory::none, 0, vllm);
  ASSERT_TRUE(engine.ok()) << engine.error().message;

  // kvpool's default scheme on the vLLM pool, and vLLM's on the kvpool pool: refused, naming
  // both schemes and the key that chose the pool's.
  auto ours = Connection::attach(d.socket(), "kvpool-worker", "chat", Connection::Memory::none);
  ASSERT_FALSE(ours.ok());
  const std::string& m = ours.error().message;
  EXPECT_NE(m.find("this worker hashes blocks with kvpool-sha256/1"), std::string::npos) << m;
  EXPECT_NE(m.find("pool chat's scheme is vllm-sha256-cbor/1 (check " + to_hex(vllm.check) +
                   ", pools[].hash_scheme"),
            std::string::npos)
      << m;
  auto stray =
      Connection::attach(d.socket(), "vllm-engine", "plain", Connection::Memory::none, 0, vllm);
  ASSERT_FALSE(stray.ok());
  EXPECT_NE(stray.error().message.find("pool plain's scheme is kvpool-sha256/1"), std::string::npos)
      << stray.error().message;

  // A block the engine publishes under its own key is found by that key.
  VllmBlockHasher hasher("0");
  std::vector<uint32_t> tokens(16);
  for (uint32_t i = 0; i < tokens.size(); ++i)
    tokens[i] = 1000 + i;
  const BlockHash key = VllmBlockHasher::key(hasher.block(nullptr, tokens));
  auto page = engine.value()->alloc(1);
  ASSERT_TRUE(page.ok());
  const PublishItem item{page.value()[0], key};
  ASSERT_TRUE(engine.value()->publish(std::span(&item, 1)).ok());
  ASSERT_TRUE(engine.value()->release(page.value()).ok());
  auto hit = engine.value()->lookup(std::span(&key, 1));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit.value().size(), 1u);

#ifdef KVPOOLCTL_BIN
  // kvpoolctl names no scheme: it inspects the vLLM pool as any other.
  const nlohmann::json listed = ctl_json(d, "--pool chat prefixes");
  ASSERT_EQ(listed["prefixes"].size(), 1u) << listed;
  EXPECT_EQ(listed["prefixes"][0]["hash"], to_hex(key));
#endif
}

}  // namespace
}  // namespace kvpool::testing

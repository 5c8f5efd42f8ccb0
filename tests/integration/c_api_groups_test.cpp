// The C API's hybrid models and static reservations through a real kvpoold: a two-group model
// (a sliding group of window 8 tokens over 4-token pages, and a full group) attached as a C
// worker would (kvpool_attach, then kvpool_attach_ex linked to it), one kvpool_lookup_groups
// answering for both groups, and a reservation seeded from the full group's hit; a table too
// small, NULL seeds and an unknown hash scheme are refused before anything is sent or held. A C
// worker hashing as vLLM does (kvpool_vllm_*) attaches to a pool of vLLM's scheme.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "client/capi/kvpool.h"
#include "common/status.h"
#include "common/vllm_block_hash.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {
namespace {

constexpr char kModel[] = R"(backend: host
pools:
  - name: m
    capacity: 256KiB
    segment_size: 16KiB
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 4, dtype: fp16}
    groups:
      - {name: local, kind: sliding, window: 8}
      - {name: global}
)";

uint32_t held(kvpool_conn* c) {
  kvpool_stats s{};
  EXPECT_EQ(kvpool_get_stats(c, &s), KVPOOL_OK) << kvpool_last_error(c);
  return s.session_held_pages;
}

TEST(CApiGroups, AModelsGroupsLookUpTogetherAndReserveFromTheHit) {
  Daemon d(kModel);
  ASSERT_TRUE(d.start()) << d.log();
  char err[256] = {};
  kvpool_conn* local = nullptr;
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c-model", "m", &local, err, sizeof err), KVPOOL_OK)
      << err;
  EXPECT_STREQ(kvpool_model_name(local), "m");
  ASSERT_EQ(kvpool_num_groups(local), 2u);
  EXPECT_EQ(kvpool_group(local), 0u);
  EXPECT_STREQ(kvpool_group_name(local, 0), "local");
  EXPECT_STREQ(kvpool_group_name(local, 1), "global");
  EXPECT_EQ(kvpool_group_name(local, 2), nullptr);

  kvpool_conn* none = nullptr;
  const kvpool_attach_options bad{local, 7};
  EXPECT_EQ(
      kvpool_attach_ex(d.socket().c_str(), "c-model", "m/global", &bad, &none, err, sizeof err),
      static_cast<int>(Errc::invalid_argument));
  EXPECT_EQ(none, nullptr);
  EXPECT_NE(std::string(err).find("hash_scheme 7 is not"), std::string::npos) << err;
  kvpool_conn* global = nullptr;
  const kvpool_attach_options linked{local, KVPOOL_HASH_SCHEME_KVPOOL};
  ASSERT_EQ(kvpool_attach_ex(d.socket().c_str(), "c-model", "m/global", &linked, &global, err,
                             sizeof err),
            KVPOOL_OK)
      << err;
  EXPECT_EQ(kvpool_group(global), 1u);
  EXPECT_NE(kvpool_session_id(global), kvpool_session_id(local));

  // Six blocks of a chain of eight cached in both groups.
  std::vector<kvpool_hash> chain(8);
  for (uint64_t i = 0; i < chain.size(); ++i)
    chain[i] = kvpool_hash{0xC0DE0000 + i, i + 1};
  for (kvpool_conn* c : {local, global}) {
    kvpool_page_id pages[6];
    ASSERT_EQ(kvpool_alloc(c, 6, pages), KVPOOL_OK) << kvpool_last_error(c);
    kvpool_publish_item items[6];
    kvpool_publish_result results[6];
    for (size_t i = 0; i < 6; ++i)
      items[i] = {pages[i], chain[i]};
    ASSERT_EQ(kvpool_publish(c, items, 6, results), KVPOOL_OK) << kvpool_last_error(c);
    ASSERT_EQ(kvpool_release(c, pages, 6), KVPOOL_OK) << kvpool_last_error(c);
  }

  // One lookup on either session: the six cached blocks; the sliding group's part only the
  // window's. Group g's entries start at g · 8; those past the hit stay as they were.
  constexpr kvpool_page_id kUntouched = 0xABCD;
  std::vector<kvpool_page_id> found(2 * chain.size(), kUntouched);
  uint32_t hits = 0;
  ASSERT_EQ(kvpool_lookup_groups(global, chain.data(), chain.size(), found.data(), &hits),
            KVPOOL_OK)
      << kvpool_last_error(global);
  ASSERT_EQ(hits, 6u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(found[i], KVPOOL_NO_PAGE) << "local block " << i;
  for (size_t i : {4u, 5u, 8u, 9u, 10u, 11u, 12u, 13u})
    EXPECT_NE(found[i], KVPOOL_NO_PAGE) << "entry " << i;
  for (size_t i : {6u, 7u, 14u, 15u})
    EXPECT_EQ(found[i], kUntouched) << "entry " << i;
  int changed = -1;
  ASSERT_EQ(kvpool_sync_pool(local, &changed), KVPOOL_OK) << kvpool_last_error(local);
  EXPECT_EQ(changed, 0);  // nothing grew
  EXPECT_EQ(held(local), 2u);
  EXPECT_EQ(held(global), 6u);

  // A reservation of 40 tokens (10 pages) seeded with the full group's 6: a table of 9 is
  // refused before anything is reserved.
  const kvpool_page_id* seeds = found.data() + 8;
  uint64_t reservation = 0;
  std::vector<kvpool_page_id> table(10, 0);
  size_t written = 99;
  EXPECT_EQ(kvpool_reserve(global, 40, seeds, 6, &reservation, table.data(), 9, &written),
            static_cast<int>(Errc::invalid_argument));
  EXPECT_NE(std::string(kvpool_last_error(global)).find("room for 9 pages"), std::string::npos)
      << kvpool_last_error(global);
  EXPECT_EQ(written, 0u);
  EXPECT_EQ(kvpool_reserve(global, 40, nullptr, 6, &reservation, table.data(), 10, &written),
            static_cast<int>(Errc::invalid_argument));
  EXPECT_EQ(held(global), 6u);
  ASSERT_EQ(kvpool_reserve(global, 40, seeds, 6, &reservation, table.data(), 10, &written),
            KVPOOL_OK)
      << kvpool_last_error(global);
  ASSERT_EQ(written, 10u);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_EQ(table[i], seeds[i]) << i;
  // The lookup's own references go; the reservation's stay, and its pages cannot be released.
  ASSERT_EQ(kvpool_release(global, seeds, 6), KVPOOL_OK) << kvpool_last_error(global);
  EXPECT_EQ(held(global), 10u);
  EXPECT_NE(kvpool_release(global, table.data(), 1), KVPOOL_OK);
  ASSERT_EQ(kvpool_unreserve(global, reservation), KVPOOL_OK) << kvpool_last_error(global);
  EXPECT_EQ(held(global), 0u);
  EXPECT_NE(kvpool_unreserve(global, reservation), KVPOOL_OK);  // already given back

  std::vector<kvpool_page_id> window;
  for (size_t i = 4; i < 6; ++i)
    window.push_back(found[i]);
  ASSERT_EQ(kvpool_release(local, window.data(), window.size()), KVPOOL_OK);
  EXPECT_EQ(held(local), 0u);
  kvpool_detach(global);
  kvpool_detach(local);
}

TEST(CApiGroups, ACWorkerHashingAsVllmAttachesToAPoolOfVllmsScheme) {
  Daemon d(R"(backend: host
pools:
  - name: chat
    hash_scheme: vllm-sha256-cbor/1
    geometry: {layers: 1, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}
    capacity: 16 pages
)");
  ASSERT_TRUE(d.start()) << d.log();
  char err[512] = {};
  kvpool_conn* refused = nullptr;
  EXPECT_EQ(kvpool_attach(d.socket().c_str(), "c-kvpool", "chat", &refused, err, sizeof err),
            static_cast<int>(Errc::invalid_argument));
  EXPECT_NE(std::string(err).find("pool chat's scheme is vllm-sha256-cbor/1"), std::string::npos)
      << err;
  kvpool_conn* c = nullptr;
  const kvpool_attach_options vllm{nullptr, KVPOOL_HASH_SCHEME_VLLM};
  ASSERT_EQ(kvpool_attach_ex(d.socket().c_str(), "c-vllm", "chat", &vllm, &c, err, sizeof err),
            KVPOOL_OK)
      << err;

  // Block 0 of tokens 0..15 under seed "0": the documented vector, and the C++ hasher's key.
  uint8_t none[32];
  ASSERT_EQ(kvpool_vllm_none_hash("0", none), KVPOOL_OK);
  uint32_t tokens[16];
  for (uint32_t i = 0; i < 16; ++i)
    tokens[i] = i;
  uint8_t digest[32];
  ASSERT_EQ(kvpool_vllm_hash_block(none, tokens, 16, nullptr, 0, digest), KVPOOL_OK);
  EXPECT_EQ(digest[0], 0xd8);
  EXPECT_EQ(digest[31], 0x9c);
  kvpool_hash key{};
  kvpool_vllm_key(digest, &key);
  EXPECT_EQ(key.lo, 12687895063098490012ull);  // vLLM's integer hash of that block
  EXPECT_EQ((BlockHash{key.lo, key.hi}), VllmBlockHasher::scheme().check);
  EXPECT_NE(kvpool_vllm_hash_block(none, tokens, 16, nullptr, 3, digest), KVPOOL_OK);
  EXPECT_NE(std::string(kvpool_hash_last_error()).find("extra_cbor is NULL but extra_len is 3"),
            std::string::npos)
      << kvpool_hash_last_error();

  kvpool_page_id page = 0;
  ASSERT_EQ(kvpool_alloc(c, 1, &page), KVPOOL_OK);
  const kvpool_publish_item item{page, key};
  kvpool_publish_result result{};
  ASSERT_EQ(kvpool_publish(c, &item, 1, &result), KVPOOL_OK) << kvpool_last_error(c);
  kvpool_page_id found = 0;
  uint32_t hits = 0;
  ASSERT_EQ(kvpool_lookup(c, &key, 1, &found, &hits), KVPOOL_OK);
  EXPECT_EQ(hits, 1u);
  EXPECT_EQ(found, page);
  kvpool_detach(c);
}

}  // namespace
}  // namespace kvpool::testing

// Integration: elastic layer_major pools (kernels/paged_kv.h, "segmented"). A real kvpoold serves
// a layer_major pool with max_capacity; each segment is a layer_major pool of its own pages and
// segments are a whole number of plane blocks apart. The geometry here makes a block (3 KiB) that
// does not divide the 2 MiB granule, so segments are 6 MiB (their least common multiple) holding
// 341 pages of 18 KiB with two blocks of slack: an address computed as if the pool were one
// plane per layer, or without the slack, lands on other bytes.
//
// A worker writes KV with the append kernel into pages on both sides of a segment boundary, in a
// pool that grew for them; another process, attached before the growth, finds every element at
// the segmented offsets computed here independently, and its decode over those pages equals a
// decode over a private unsegmented copy of the same KV. A shrink moves cached tail pages below
// with every layer's rows, and a hybrid model's groups may be layer_major.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "client/capi/kvpool.h"
#include "client/connection/connection.h"
#include "client/connection/model_connection.h"
#include "client/worker/pool_kernels.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"
#include "tests/integration/daemon_harness.h"
#include "tests/integration/test_attach.h"

namespace kvpool::testing {
namespace {

using client::Connection;

constexpr uint32_t kLayers = 3, kHeads = 2, kDim = 48, kT = 16;
constexpr uint64_t kBlock = uint64_t{kT} * kHeads * kDim * 2;  // one page of one plane: 3 KiB
constexpr uint64_t kSegment = 6ull << 20;                      // lcm(2 MiB, 3 KiB)
constexpr uint32_t kPerSegment = static_cast<uint32_t>(kSegment / (2 * kLayers * kBlock));  // 341

// segment_size 2MiB on fake-device (2 MiB granules: rounded up to 6 MiB), 6MiB on host (4 KiB
// granules, so 6 MiB is already a multiple of both).
std::string config(const std::string& backend, uint32_t segments, uint32_t max_segments) {
  return "backend: " + backend +
         "\npools:\n  - name: default\n    layout: layer_major\n"
         "    geometry: {layers: 3, kv_heads: 2, head_dim: 48, tokens_per_page: 16, dtype: fp16}\n"
         "    capacity: " +
         std::to_string(segments * kPerSegment) +
         " pages\n    max_capacity: " + std::to_string(max_segments * kPerSegment) +
         " pages\n    segment_size: " + (backend == "host" ? "6MiB" : "2MiB") +
         "\n    grow_ahead: false\n";
}

BlockHash block(uint32_t i) {
  return BlockHash{0x5E6'0000 + i, 7};
}

// An integer in [−1000, 1039), exact in fp16, mixing every coordinate (and the page's tag).
float value(uint32_t tag, uint32_t t, uint32_t l, uint32_t h, uint32_t d, uint32_t is_v) {
  const uint32_t mix = tag * 7919 + t * 131 + l * 37 + h * 17 + d * 3 + is_v * 1001;
  return static_cast<float>(mix % 2039) - 1000.0f;
}

// The byte offset of an element, from this file's own reading of the segmented layout.
uint64_t offset(PageId p, uint32_t l, uint32_t h, uint32_t t, uint32_t d, uint32_t is_v) {
  const uint64_t plane = uint64_t{kPerSegment} * kBlock;
  return uint64_t{p / kPerSegment} * kSegment + (2 * l + is_v) * plane +
         (p % kPerSegment) * kBlock + (uint64_t{t} * kHeads + h) * kDim * 2 + uint64_t{d} * 2;
}

// Appends all kT tokens of page pages[i] (tag i) in every layer through `append`.
template <typename Append>
std::string fill(const std::vector<PageId>& pages, Append&& append) {
  const auto n = static_cast<uint32_t>(pages.size() * kT);
  std::vector<int64_t> slots(n);
  for (uint32_t i = 0; i < n; ++i)
    slots[i] = int64_t{pages[i / kT]} * kT + i % kT;
  for (uint32_t l = 0; l < kLayers; ++l) {
    std::vector<float> k(size_t{n} * kHeads * kDim), v(k.size());
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t h = 0; h < kHeads; ++h) {
        for (uint32_t d = 0; d < kDim; ++d) {
          k[(i * kHeads + h) * kDim + d] = value(i / kT, i % kT, l, h, d, 0);
          v[(i * kHeads + h) * kDim + d] = value(i / kT, i % kT, l, h, d, 1);
        }
      }
    }
    kernels::AppendArgs a;
    a.layer = l;
    a.num_tokens = n;
    a.k = k.data();
    a.v = v.data();
    a.slots = slots.data();
    if (std::string e = append(a); !e.empty()) return e;
  }
  return {};
}

uint64_t mismatches(const Connection& c, const std::vector<PageId>& pages) {
  uint64_t bad = 0;
  for (uint32_t i = 0; i < pages.size(); ++i) {
    for (uint32_t t = 0; t < kT; ++t) {
      for (uint32_t l = 0; l < kLayers; ++l) {
        for (uint32_t h = 0; h < kHeads; ++h) {
          for (uint32_t d = 0; d < kDim; ++d) {
            for (uint32_t is_v = 0; is_v < 2; ++is_v) {
              uint16_t bits = 0;
              std::memcpy(&bits, c.base() + offset(pages[i], l, h, t, d, is_v), 2);
              bad += kernels::fp16_to_f32(bits) != value(i, t, l, h, d, is_v);
            }
          }
        }
      }
    }
  }
  return bad;
}

// Decode of one sequence over `pages` at every layer, 4 query heads.
std::vector<float> decode(const std::vector<PageId>& pages,
                          const std::function<std::string(const kernels::DecodeArgs&)>& run) {
  const auto ctx = static_cast<uint32_t>(pages.size() * kT);
  std::vector<float> q(4 * kDim), out(kLayers * 4 * kDim);
  for (size_t i = 0; i < q.size(); ++i)
    q[i] = std::sin(static_cast<float>(i)) * 0.01f;
  for (uint32_t l = 0; l < kLayers; ++l) {
    kernels::DecodeArgs a;
    a.layer = l;
    a.num_seqs = 1;
    a.num_q_heads = 4;
    a.q = q.data();
    a.out = out.data() + size_t{l} * 4 * kDim;
    a.block_tables = pages.data();
    a.block_table_stride = static_cast<uint32_t>(pages.size());
    a.context_lens = &ctx;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
    if (std::string e = run(a); !e.empty()) {
      ADD_FAILURE() << e;
      return {};
    }
  }
  return out;
}

class ElasticLayerMajor : public ::testing::TestWithParam<const char*> {};

TEST_P(ElasticLayerMajor, GrowsInWholeSegmentsAndWorkersReadKvAtTheSegmentedOffsets) {
  Daemon d(config(GetParam(), 1, 3));
  ASSERT_TRUE(d.start()) << d.log();
  auto reader = attach(d, "reader");
  ASSERT_TRUE(reader);
  const wire::PoolInfo& info = reader->pool();
  ASSERT_EQ(info.segment_pages, kPerSegment);
  ASSERT_EQ(info.segment_stride, kSegment);
  ASSERT_EQ(info.num_pages, kPerSegment);
  ASSERT_EQ(info.max_pages, 3 * kPerSegment);
  EXPECT_EQ(reader->layer_stride(), 2 * kPerSegment * kBlock);

  // Another process takes every page and 20 more (the pool grows one segment), then writes the
  // last 6 pages of segment 0 and the first 6 of segment 1.
  Pipe written, done;
  const pid_t writer = spawn_worker([&] {
    auto c = attach(d, "writer");
    if (!c) return 1;
    auto all = c->alloc(kPerSegment + 20);
    if (!all.ok() || c->pool().num_pages != 2 * kPerSegment) return 2;
    std::vector<PageId> sorted = all.value();
    std::sort(sorted.begin(), sorted.end());
    std::vector<PageId> pages(sorted.begin() + kPerSegment - 6, sorted.begin() + kPerSegment + 6);
    if (!fill(pages, [&](const kernels::AppendArgs& a) {
           return client::PoolKernels(*c).append_kv(a);
         }).empty()) {
      return 3;
    }
    std::vector<PublishItem> items;
    for (uint32_t i = 0; i < pages.size(); ++i)
      items.push_back({pages[i], block(i)});
    if (!c->publish(items).ok()) return 4;
    written.signal();
    return done.wait() ? 0 : 5;
  });
  ASSERT_TRUE(written.wait());
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < 12; ++i)
    chain.push_back(block(i));
  auto hits = reader->lookup(chain);
  ASSERT_TRUE(hits.ok()) << hits.error().message;
  ASSERT_EQ(hits.value().size(), 12u);
  EXPECT_EQ(reader->pool().num_pages, 2 * kPerSegment);
  const std::vector<PageId>& pages = hits.value();
  EXPECT_EQ(pages[5], kPerSegment - 1);
  EXPECT_EQ(pages[6], kPerSegment);
  EXPECT_EQ(mismatches(*reader, pages), 0u);

  // Block indices: page p of layer l's K plane at base + l · layer_stride + index · block, as
  // the C API tells them too.
  kvpool_conn* cc = nullptr;
  char err[256] = {};
  ASSERT_EQ(kvpool_attach(d.socket().c_str(), "c", nullptr, &cc, err, sizeof err), KVPOOL_OK)
      << err;
  kvpool_pool_info ci{};
  kvpool_get_pool_info(cc, &ci);
  EXPECT_EQ(ci.segment_pages, kPerSegment);
  EXPECT_EQ(ci.segment_stride, kSegment);
  EXPECT_EQ(ci.layer_stride, reader->layer_stride());
  for (const PageId p : {PageId{0}, kPerSegment - 1, kPerSegment, kPerSegment + 5}) {
    const uint64_t index = kernels::block_index(client::PoolKernels(*reader).paged_kv(), p);
    EXPECT_EQ(index, kvpool_block_index(cc, p)) << p;
    EXPECT_EQ(2 * reader->layer_stride() + index * kBlock, offset(p, 2, 0, 0, 0, 0)) << p;
  }
  kvpool_detach(cc);

  // The reader's decode over the pool equals one over a private, unsegmented copy.
  const std::vector<float> pooled = decode(pages, [&](const kernels::DecodeArgs& a) {
    return client::PoolKernels(*reader).decode(a, a.context_lens[0]);
  });
  const uint32_t local_pages = 12;
  std::vector<uint16_t> local(size_t{2} * kLayers * local_pages * kBlock / 2);
  kernels::PagedKv kv = client::PoolKernels(*reader).paged_kv();
  kv.base = local.data();
  kv.num_pages = local_pages;
  kv.segment_pages = 0;
  kv.segment_stride = 0;
  std::vector<PageId> dense(12);
  for (uint32_t i = 0; i < 12; ++i)
    dense[i] = i;
  ASSERT_EQ(fill(dense,
                 [&](kernels::AppendArgs a) {
                   a.kv = kv;
                   return kernels::cpu::append_kv(a, local_pages);
                 }),
            "");
  const std::vector<float> reference = decode(dense, [&](kernels::DecodeArgs a) {
    a.kv = kv;
    return kernels::cpu::decode(a, local_pages);
  });
  ASSERT_EQ(pooled.size(), reference.size());
  ASSERT_FALSE(pooled.empty());
  for (size_t i = 0; i < pooled.size(); ++i)
    EXPECT_EQ(pooled[i], reference[i]) << i;
  done.signal();
  EXPECT_EQ(wait_worker(writer), 0);
}

TEST_P(ElasticLayerMajor, AShrinkMovesCachedTailPagesWithEveryLayer) {
  Daemon d(config(GetParam(), 2, 2));
  ASSERT_TRUE(d.start()) << d.log();
  auto c = attach(d, "w");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->pool().num_pages, 2 * kPerSegment);
  // Hold segment 0 but for 8 pages; write and publish 4 pages of segment 1, then release them.
  auto all = c->alloc(2 * kPerSegment);
  ASSERT_TRUE(all.ok()) << all.error().message;
  std::vector<PageId> sorted = all.value();
  std::sort(sorted.begin(), sorted.end());
  const std::vector<PageId> tail(sorted.end() - 4, sorted.end());
  ASSERT_EQ(
      fill(tail,
           [&](const kernels::AppendArgs& a) { return client::PoolKernels(*c).append_kv(a); }),
      "");
  std::vector<PublishItem> items;
  for (uint32_t i = 0; i < tail.size(); ++i)
    items.push_back({tail[i], block(i)});
  ASSERT_TRUE(c->publish(items).ok());
  std::vector<PageId> give(sorted.begin() + kPerSegment - 8, sorted.end());
  ASSERT_TRUE(c->release(give).ok());

  auto r = c->resize(kPerSegment);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(c->pool().num_pages, kPerSegment);
  std::vector<BlockHash> chain;
  for (uint32_t i = 0; i < 4; ++i)
    chain.push_back(block(i));
  auto hits = c->lookup(chain);
  ASSERT_TRUE(hits.ok()) << hits.error().message;
  ASSERT_EQ(hits.value().size(), 4u);
  for (const PageId p : hits.value())
    EXPECT_LT(p, kPerSegment);
  EXPECT_EQ(mismatches(*c, hits.value()), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, ElasticLayerMajor, ::testing::Values("fake-device", "host"));

TEST(ElasticLayerMajorConfig, AHybridModelsGroupsMayBeLayerMajor) {
  Daemon d(
      "backend: host\npools:\n  - name: m\n    layout: layer_major\n    capacity: 4MiB\n"
      "    segment_size: 64KiB\n    grow_ahead: false\n"
      "    geometry: {layers: 4, kv_heads: 1, head_dim: 8, tokens_per_page: 16, dtype: fp16}\n"
      "    groups:\n      - {name: local, layers: 2, kind: sliding, window: 64}\n"
      "      - {name: global}\n");
  ASSERT_TRUE(d.start()) << d.log();
  auto m = client::ModelConnection::attach(d.socket(), "w", "m");
  ASSERT_TRUE(m.ok()) << m.error().message;
  for (size_t g = 0; g < 2; ++g) {
    Connection& c = m.value()->group(g);
    EXPECT_EQ(c.layout(), KvLayout::layer_major);
    EXPECT_NE(c.pool().segment_pages, 0u) << g;
    // The group grows past its first segment and its pages take KV at their segmented offsets.
    const uint32_t first = c.pool().num_pages;
    auto pages = c.alloc(first + 1);
    ASSERT_TRUE(pages.ok()) << pages.error().message;
    EXPECT_GT(c.pool().num_pages, first);
    std::vector<int64_t> slots{int64_t{first} * 16};  // page `first`: the new segment's first
    std::vector<float> k(8, 3.0f), v(8, -5.0f);
    const uint32_t layers = c.pool().geometry.layers;
    for (uint32_t l = 0; l < layers; ++l) {
      kernels::AppendArgs a;
      a.layer = l;
      a.num_tokens = 1;
      a.k = k.data();
      a.v = v.data();
      a.slots = slots.data();
      ASSERT_EQ(client::PoolKernels(c).append_kv(a), "");
    }
    const uint64_t seg_base = uint64_t{first / c.pool().segment_pages} * c.pool().segment_stride;
    const uint64_t plane = uint64_t{c.pool().segment_pages} * 16 * 8 * 2;
    for (uint32_t l = 0; l < layers; ++l) {
      uint16_t kb = 0, vb = 0;
      std::memcpy(&kb, c.base() + seg_base + 2 * l * plane, 2);
      std::memcpy(&vb, c.base() + seg_base + (2 * l + 1) * plane, 2);
      EXPECT_EQ(kernels::fp16_to_f32(kb), 3.0f) << "group " << g << " layer " << l;
      EXPECT_EQ(kernels::fp16_to_f32(vb), -5.0f) << "group " << g << " layer " << l;
    }
    ASSERT_TRUE(c.release(pages.value()).ok());
  }
}

}  // namespace
}  // namespace kvpool::testing

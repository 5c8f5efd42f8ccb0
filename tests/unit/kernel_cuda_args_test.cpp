// The CUDA kernels' host-side argument checks, which run before any CUDA call and so need no GPU:
// a misaligned pool is refused with an error naming the requirement, never launched.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/kernels_cuda.h"

namespace kvpool::kernels {
namespace {

// An address that is never dereferenced: the checks refuse it before any launch.
void* misaligned() {
  return reinterpret_cast<void*>(uintptr_t{0x10008});
}

PagedKv pool(KvDtype dtype, void* base, uint64_t stride) {
  const Geometry g{2, 2, 128, 16, dtype};
  return PagedKv{base, stride, nullptr, g, KvLayout::page_major, 8};
}

TEST(CudaKernelArgs, AppendIntoA16BitPoolNeeds16ByteAlignment) {
  const float k = 0;
  const int64_t slot = 0;
  const uint64_t stride = page_data_bytes(Geometry{2, 2, 128, 16, KvDtype::bf16});
  AppendArgs a{pool(KvDtype::bf16, misaligned(), stride), 0, 1, &k, &k, &slot};
  EXPECT_NE(cuda::append_kv(a, nullptr).find("multiples of 16 bytes"), std::string::npos);
  a.kv = pool(KvDtype::fp16, reinterpret_cast<void*>(uintptr_t{0x10000}), stride + 8);
  EXPECT_NE(cuda::append_kv(a, nullptr).find("multiples of 16 bytes"), std::string::npos);
}

TEST(CudaKernelArgs, DecodeAndExtendNeed16ByteAlignment) {
  const uint64_t stride = page_data_bytes(Geometry{2, 2, 128, 16, KvDtype::bf16});
  const float q = 0;
  float out = 0;
  const PageId table = 0;
  const uint32_t len = 1;
  const uint32_t offsets[2] = {0, 1};
  DecodeArgs d;
  d.kv = pool(KvDtype::bf16, misaligned(), stride);
  d.num_seqs = 1;
  d.num_q_heads = 2;
  d.q = &q;
  d.out = &out;
  d.block_tables = &table;
  d.block_table_stride = 1;
  d.context_lens = &len;
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("multiples of 16 bytes"),
            std::string::npos);
  ExtendArgs e{d.kv, 0, 1, 2, &q, &out, offsets, &table, 1, &len, 1.0f, {}, 0, {}};
  EXPECT_NE(cuda::extend(e, 1, nullptr).find("multiples of 16 bytes"), std::string::npos);
}

// The CUDA kernels take masks, wide groups and latent pools; a bad window, a value width a K/V
// pool would ignore, and a latent vector or value width past what latent.cu holds are refused
// before any launch.
TEST(CudaKernelArgs, BadMaskFieldsAndLatentShapesAreRefused) {
  const uint64_t stride = page_data_bytes(Geometry{2, 2, 128, 16, KvDtype::bf16});
  const float q = 0;
  float out = 0;
  const PageId table = 0;
  const uint32_t len = 1;
  const uint32_t offsets[2] = {0, 1};
  DecodeArgs d;
  d.kv = pool(KvDtype::bf16, reinterpret_cast<void*>(uintptr_t{0x10000}), stride);
  d.num_seqs = 1;
  d.num_q_heads = 2;
  d.q = &q;
  d.out = &out;
  d.block_tables = &table;
  d.block_table_stride = 1;
  d.context_lens = &len;
  d.mask.window_left = -2;
  EXPECT_EQ(cuda::decode(d, 1, 132, nullptr, 0, nullptr), "decode: mask.window_left is below -1");
  ExtendArgs e{d.kv, 0, 1, 2, &q, &out, offsets, &table, 1, &len, 1.0f, {}, 0, {}};
  e.mask.window_left = -5;
  EXPECT_EQ(cuda::extend(e, 1, nullptr), "extend: mask.window_left is below -1");
  d.mask.window_left = -1;
  d.value_dim = 64;
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("value_dim 64"), std::string::npos);
  d.value_dim = 0;
  d.kv.geometry = Geometry{2, 1, 640, 64, KvDtype::bf16, AttentionKind::latent, 0};
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("exceeds the 576"),
            std::string::npos);
  d.kv.geometry.head_dim = 576;
  d.value_dim = 600;
  EXPECT_EQ(cuda::decode(d, 1, 132, nullptr, 0, nullptr),
            "decode: value_dim 600 exceeds the latent vector's head_dim 576");
  EXPECT_EQ(cuda::decode_workspace_bytes(d, 1 << 16, 132), 0u);  // latent decode splits nothing
  d.value_dim = 512;
  d.kv.base = reinterpret_cast<void*>(uintptr_t{0x10001});  // not 2-byte aligned for bf16
  d.kv.page_stride = page_data_bytes(d.kv.geometry);
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("must be aligned"),
            std::string::npos);
  d.kv.base = reinterpret_cast<void*>(uintptr_t{0x10000});
  d.kv.page_stride = 64;  // pages would overlap
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("kv.page_stride 64"),
            std::string::npos);
  e.mask.window_left = -1;
  e.kv.geometry = d.kv.geometry;
  e.kv.geometry.dtype = KvDtype::int8;  // no scales
  EXPECT_EQ(cuda::extend(e, 1, nullptr), "extend: an 8-bit pool needs its scales");
}

// A mixed-precision decode checks its older pool (shape, scales, the older_pages array) and needs
// a workspace entry per chunk and pool even for one chunk, and a mixed extend checks the same; so
// do a latent pool's mixed calls, whose kernel reads any pair of dtypes; a conversion between
// pools of different shapes, or within one pool, is refused too.
TEST(CudaKernelArgs, MixedPrecisionIsCheckedAndConversionsAreChecked) {
  const uint64_t stride = page_data_bytes(Geometry{2, 2, 128, 16, KvDtype::bf16});
  auto* base = reinterpret_cast<void*>(uintptr_t{0x10000});
  auto* older_base = reinterpret_cast<void*>(uintptr_t{0x20000});
  const float q = 0;
  float out = 0;
  const PageId table = 0;
  const uint32_t len = 1;
  const uint32_t older = 1;
  const uint32_t offsets[2] = {0, 1};
  DecodeArgs d;
  d.kv = pool(KvDtype::bf16, base, stride);
  d.num_seqs = 1;
  d.num_q_heads = 2;
  d.q = &q;
  d.out = &out;
  d.block_tables = &table;
  d.block_table_stride = 1;
  d.context_lens = &len;
  d.mixed = MixedPrecision{pool(KvDtype::fp8_e4m3, older_base, stride / 2), &older, 8};
  EXPECT_EQ(cuda::decode(d, 1, 132, nullptr, 0, nullptr),
            "decode: mixed.older is an 8-bit pool without its scales");
  alignas(16) float scales[4] = {};
  d.mixed.older.scales = scales;
  d.mixed.older.geometry.head_dim = 64;
  EXPECT_NE(cuda::decode(d, 1, 132, nullptr, 0, nullptr).find("not of the pool's shape"),
            std::string::npos);
  d.mixed.older.geometry.head_dim = 128;
  d.mixed.older_pages = nullptr;
  EXPECT_EQ(cuda::decode(d, 1, 132, nullptr, 0, nullptr), "decode: mixed.older_pages is null");
  d.mixed.older_pages = &older;
  // One chunk, two pools: two states per row (2 rows of 128 floats and an (m, l) pair each).
  const size_t ws = cuda::decode_workspace_bytes(d, 1, 132);
  EXPECT_EQ(ws, 2u * 2 * (128 * sizeof(float) + 2 * sizeof(float)));
  EXPECT_EQ(cuda::decode(d, 1, 132, nullptr, 0, nullptr),
            "decode: workspace of 0 bytes, " + std::to_string(ws) + " needed");
  // A latent pool's mixed decode checks its older pool the same way, and that pool's layout.
  DecodeArgs latent = d;
  latent.kv.geometry = Geometry{2, 1, 576, 64, KvDtype::bf16, AttentionKind::latent, 0};
  latent.kv.page_stride = page_data_bytes(latent.kv.geometry);
  latent.mixed.older.geometry = latent.kv.geometry;
  latent.mixed.older.geometry.dtype = KvDtype::fp8_e4m3;
  latent.mixed.older.page_stride = page_data_bytes(latent.mixed.older.geometry);
  latent.mixed.older.scales = nullptr;
  EXPECT_EQ(cuda::decode(latent, 1, 132, nullptr, 0, nullptr),
            "decode (mixed.older): an 8-bit pool needs its scales");
  latent.mixed.older.scales = scales;
  latent.mixed.older.page_stride = 64;
  EXPECT_NE(cuda::decode(latent, 1, 132, nullptr, 0, nullptr)
                .find("decode (mixed.older): kv.page_stride 64 is below the page's data bytes"),
            std::string::npos);
  latent.mixed.older.page_stride = page_data_bytes(latent.mixed.older.geometry);
  latent.mixed.older.geometry.tokens_per_page = 16;
  EXPECT_NE(cuda::decode(latent, 1, 132, nullptr, 0, nullptr).find("not of the pool's shape"),
            std::string::npos);
  latent.mixed.older.geometry.tokens_per_page = 64;
  latent.mixed.older_pages = nullptr;
  EXPECT_EQ(cuda::decode(latent, 1, 132, nullptr, 0, nullptr), "decode: mixed.older_pages is null");
  EXPECT_EQ(cuda::decode_workspace_bytes(latent, 1000, 132), 0u);  // latent.cu splits nothing
  // A mixed extend checks its older pool as the decode does, and takes a 16-bit pool over an
  // 8-bit one only, but for a latent pool, whose keys are loaded one by one in either dtype.
  d.mixed.older.scales = nullptr;
  ExtendArgs e{d.kv, 0, 1, 2, &q, &out, offsets, &table, 1, &len, 1.0f, {}, 0, {}};
  e.mixed = d.mixed;
  EXPECT_EQ(cuda::extend(e, 1, nullptr), "extend: mixed.older is an 8-bit pool without its scales");
  e.mixed.older.scales = scales;
  e.mixed.older.geometry.head_dim = 64;
  EXPECT_NE(cuda::extend(e, 1, nullptr).find("not of the pool's shape"), std::string::npos);
  e.mixed.older.geometry.head_dim = 128;
  e.mixed.older_pages = nullptr;
  EXPECT_EQ(cuda::extend(e, 1, nullptr), "extend: mixed.older_pages is null");
  e.mixed.older_pages = &older;
  e.mixed.older.geometry.dtype = KvDtype::fp16;
  EXPECT_NE(cuda::extend(e, 1, nullptr).find("a 16-bit pool (bf16, fp16) and an 8-bit older pool"),
            std::string::npos);
  ExtendArgs latent_extend = e;
  latent_extend.kv = latent.kv;
  latent_extend.mixed = latent.mixed;
  latent_extend.mixed.older.layout = KvLayout::layer_major;
  latent_extend.mixed.older.num_pages = 0;
  latent_extend.mixed.older_pages = &older;
  EXPECT_EQ(cuda::extend(latent_extend, 1, nullptr),
            "extend (mixed.older): a layer_major pool needs kv.num_pages");
  latent_extend.mixed.older.num_pages = 8;
  latent_extend.mixed.older.geometry.head_dim = 512;
  EXPECT_NE(cuda::extend(latent_extend, 1, nullptr).find("not of the pool's shape"),
            std::string::npos);
  latent_extend.mixed.older.geometry.head_dim = 576;
  latent_extend.mixed.older_pages = nullptr;
  EXPECT_EQ(cuda::extend(latent_extend, 1, nullptr), "extend: mixed.older_pages is null");

  ConvertPagesArgs c{d.kv, d.mixed.older, 1, &table, &table};
  c.dst.geometry.head_dim = 64;
  EXPECT_NE(cuda::convert_pages(c, nullptr).find("differ in shape"), std::string::npos);
  c.dst = d.kv;
  EXPECT_EQ(cuda::convert_pages(c, nullptr), "convert_pages: src and dst are one pool");
  c.dst = d.mixed.older;
  EXPECT_EQ(cuda::convert_pages(c, nullptr), "convert_pages: an 8-bit pool needs its scales");
}

}  // namespace
}  // namespace kvpool::kernels

// kvpool-kernel-bench: CPU paged-attention decode bandwidth (KV bytes read / time) next to the
// bandwidth of a 2 GiB memcpy measured at the start of the same run, for each KV dtype and each
// instruction set of the CPU kernels (kernels_cpu.h, Isa: the portable baseline loops and the
// AVX2 ones, where the CPU has AVX2). The last column, the decode threads' CPU time per (token,
// KV head), measures the kernel's cost independently of other load on the machine; the memcpy is
// measured again at the end to show whether the machine stayed quiet.
//
// Geometry of the GPU table: 8 KV heads, head dim 128, 16 tokens per page, one layer, and
// 4 query heads per KV head (32 query heads); --groups sets other query groups (1: MHA, 16:
// Qwen3-235B, 71: Falcon-7B's MQA group) over the same KV bytes; the pages of each sequence are
// scattered over the pool (a random permutation), as in a real pool. --layouts also runs the pool
// layer_major (common/geometry.h), where a head's rows of a page are kv_heads · head_dim elements
// apart instead of contiguous. --mla-heads runs DeepSeek-V3's latent (MLA) cache instead: one
// 576-value vector per token (512 latent + 64 rotary), 64 tokens per page as FlashMLA pages it,
// value_dim 512, with that many query heads (16: one GPU of a TP-8 deployment; 128: all).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"

namespace {

using namespace kvpool;
using Clock = std::chrono::steady_clock;

template <typename Fn>
double best_seconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// CPU time of this process (all threads), in seconds.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvpool-kernel-bench: CPU decode bandwidth next to memcpy bandwidth"};
  unsigned threads = std::thread::hardware_concurrency();
  int reps = 5;
  std::string contexts = "4096,16384,65536";
  std::string batches = "1,8";
  std::string dtypes = "bf16,fp16,fp8_e4m3,int8";
  std::string isas = "baseline,automatic";
  std::string layouts = "page_major";
  std::string groups = "4";
  std::string mla_heads;
  app.add_option("--threads", threads, "Decode threads")->capture_default_str();
  app.add_option("--reps", reps, "Repetitions per point (best is reported)")->capture_default_str();
  app.add_option("--contexts", contexts, "Context lengths")->capture_default_str();
  app.add_option("--batches", batches, "Batch sizes")->capture_default_str();
  app.add_option("--dtypes", dtypes, "KV dtypes")->capture_default_str();
  app.add_option("--isas", isas, "Instruction sets: baseline, avx2, automatic (the best one)")
      ->capture_default_str();
  app.add_option("--layouts", layouts, "Pool layouts: page_major, layer_major")
      ->capture_default_str();
  app.add_option("--groups", groups, "Query heads per KV head (the pool has 8 KV heads)")
      ->capture_default_str();
  app.add_option("--mla-heads", mla_heads,
                 "Query heads over a latent (MLA) pool instead of the GQA pool, e.g. 16,128");
  CLI11_PARSE(app, argc, argv);
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t comma = s.find(',', pos);
      out.push_back(s.substr(pos, comma - pos));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    return out;
  };
  auto parse = [&](const std::string& s) {
    std::vector<uint32_t> out;
    for (const std::string& x : split(s))
      out.push_back(static_cast<uint32_t>(std::stoul(x)));
    return out;
  };
  std::vector<KvDtype> dtype_list;
  for (const std::string& x : split(dtypes)) {
    const std::optional<KvDtype> d = parse_dtype(x);
    if (!d) {
      std::fprintf(stderr, "unknown dtype '%s'\n", x.c_str());
      return 2;
    }
    dtype_list.push_back(*d);
  }
  std::vector<KvLayout> layout_list;
  for (const std::string& x : split(layouts)) {
    const std::optional<KvLayout> l = parse_layout(x);
    if (!l) {
      std::fprintf(stderr, "unknown layout '%s'\n", x.c_str());
      return 2;
    }
    layout_list.push_back(*l);
  }
  // automatic is reported as the instruction set it resolves to for head dim 128.
  std::vector<kernels::cpu::Isa> isa_list;
  for (const std::string& x : split(isas)) {
    kernels::cpu::Isa isa = kernels::cpu::Isa::automatic;
    if (x == "baseline") {
      isa = kernels::cpu::Isa::baseline;
    } else if (x == "avx2") {
      isa = kernels::cpu::Isa::avx2;
    } else if (x != "automatic") {
      std::fprintf(stderr, "unknown isa '%s'\n", x.c_str());
      return 2;
    }
    if (isa == kernels::cpu::Isa::automatic) {
      isa = kernels::cpu::isa_supported(kernels::cpu::Isa::avx2) ? kernels::cpu::Isa::avx2
                                                                 : kernels::cpu::Isa::baseline;
    }
    if (!kernels::cpu::isa_supported(isa)) {
      std::fprintf(stderr, "isa %s: not supported by this CPU, skipped\n", x.c_str());
      continue;
    }
    if (std::find(isa_list.begin(), isa_list.end(), isa) == isa_list.end()) isa_list.push_back(isa);
  }

  // The baseline: memcpy of a 2 GiB buffer (far beyond the caches), pre-faulted, best of reps.
  // It is measured again at the end: on a shared machine a large difference means the run was
  // disturbed, and the ratios (against the first) are not to be trusted.
  constexpr size_t kCopyBytes = size_t{2} << 30;
  auto memcpy_bandwidth = [&] {
    std::vector<std::byte> src(kCopyBytes, std::byte{1}), dst(kCopyBytes, std::byte{2});
    const double s = best_seconds(reps, [&] { std::memcpy(dst.data(), src.data(), kCopyBytes); });
    return double(kCopyBytes) / s / 1e9;
  };
  const double memcpy_gbs = memcpy_bandwidth();
  std::printf("threads %u; decode bandwidth = KV bytes read / time; memcpy of 2 GiB: %.2f GB/s\n",
              threads, memcpy_gbs);
  // cpu ns: CPU time of all decode threads per (token, KV head), the least of the reps: what the
  // kernel costs, whatever else the machine runs.
  std::printf("%-9s %-11s %-8s %5s %5s %7s %9s %10s %9s %8s %9s\n", "dtype", "layout", "isa",
              "group", "batch", "context", "KV MB", "time ms", "GB/s", "of memcpy", "cpu ns");
  // The pools the run measures: the GQA pool once per query group, or the latent pool once per
  // query head count.
  struct Shape {
    Geometry g;
    uint32_t q_heads;
    uint32_t value_dim;
    uint32_t group;  // the column: query heads per cached head
  };
  std::mt19937 rng(1);
  for (const KvDtype dt : dtype_list) {
    std::vector<Shape> shapes;
    if (mla_heads.empty()) {
      for (const uint32_t group : parse(groups))
        shapes.push_back({Geometry{1, 8, 128, 16, dt}, 8 * group, 0, group});
    } else {
      for (const uint32_t heads : parse(mla_heads)) {
        shapes.push_back(
            {Geometry{1, 1, 576, 64, dt, AttentionKind::latent, 0}, heads, 512, heads});
      }
    }
    for (const Shape& shape : shapes) {
      const Geometry& g = shape.g;
      const uint64_t stride = page_data_bytes(g);
      const uint32_t t_page = g.tokens_per_page;
      for (const uint32_t batch : parse(batches)) {
        for (const uint32_t ctx : parse(contexts)) {
          const uint32_t blocks = (ctx + t_page - 1) / t_page;
          const uint32_t pages = batch * blocks;
          std::vector<std::byte> pool(uint64_t(pages) * stride, std::byte{0x3c});
          std::vector<float> scales(page_scale_bytes(g) / sizeof(float) * pages, 0.01f);
          std::vector<PageId> table(pages);
          std::iota(table.begin(), table.end(), 0u);
          std::shuffle(table.begin(), table.end(), rng);
          std::vector<uint32_t> lens(batch, ctx);
          std::vector<float> q(size_t(batch) * shape.q_heads * g.head_dim, 0.01f);
          std::vector<float> out(size_t(batch) * shape.q_heads * g.head_dim);
          kernels::DecodeArgs a;
          a.kv = kernels::PagedKv{pool.data(), stride, scales.empty() ? nullptr : scales.data(), g};
          a.num_seqs = batch;
          a.num_q_heads = shape.q_heads;
          a.q = q.data();
          a.out = out.data();
          a.block_tables = table.data();
          a.block_table_stride = blocks;
          a.context_lens = lens.data();
          a.scale = 0.088f;
          a.value_dim = shape.value_dim;
          for (const KvLayout layout : layout_list) {
            a.kv.layout = layout;
            a.kv.num_pages = pages;
            for (const kernels::cpu::Isa isa : isa_list) {
              std::string err;
              double cpu = 1e30;
              const double t = best_seconds(reps, [&] {
                const double c0 = process_cpu_seconds();
                err = kernels::cpu::decode(a, pages, threads, isa);
                cpu = std::min(cpu, process_cpu_seconds() - c0);
              });
              if (!err.empty()) {
                std::fprintf(stderr, "decode: %s\n", err.c_str());
                return 1;
              }
              const double bytes = double(batch) * ctx * double(kv_bytes_per_token(g));
              const double gbs = bytes / t / 1e9;
              std::printf("%-9s %-11s %-8s %5u %5u %7u %9.1f %10.3f %9.2f %7.0f%% %9.1f\n",
                          std::string(dtype_name(dt)).c_str(),
                          std::string(layout_name(layout)).c_str(),
                          std::string(kernels::cpu::isa_name(isa)).c_str(), shape.group, batch, ctx,
                          bytes / 1e6, t * 1e3, gbs, 100.0 * gbs / memcpy_gbs,
                          cpu * 1e9 / (double(batch) * ctx * g.kv_heads));
            }
          }
        }
      }
    }
  }
  std::printf("memcpy of 2 GiB at the end: %.2f GB/s\n", memcpy_bandwidth());
  return 0;
}

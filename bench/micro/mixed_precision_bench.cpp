// kvpool-mixed-precision-bench: what mixed precision (a sequence's pages older than recent_tokens
// from its head in 8 bits, the recent ones in bf16; kernels/paged_kv.h, MixedPrecision) buys and
// costs, each figure next to its all-bf16 and all-8-bit baselines measured in the same run:
//
//   capacity   tokens per GiB of pool at one context length for a model geometry (default
//              Llama-3.1-8B: 32 layers, 8 KV heads, head_dim 128, 16 tokens per page), counting
//              whole pages and the 8-bit pages' scales, for each recent_tokens;
//   decode     CPU decode of one layer over a batch of sequences at that context (pages scattered
//              over the pools): time, KV bytes read per second, and the mixed call's time and
//              bandwidth as fractions of the all-bf16 one's;
//   convert    convert_pages of whole pages bf16 → fp8 / int8 (all layers of the geometry): µs
//              per page and GB/s of bf16 read, on one thread and on all;
//   accuracy   the decode output's relative error ‖out − ref‖ / ‖ref‖ per (sequence, query head)
//              against an fp64 attention over the fp32 source K/V, mean and max, for all-bf16,
//              all-8-bit (filled by append_kv, as an 8-bit pool is) and mixed (bf16 appended,
//              older pages converted by convert_pages). Keys have a few large channels (real keys
//              do: a channel scale drawn from a log-normal, every 16th channel × 8); queries are
//              scaled so that scores have a standard deviation of about --score-std.
//
// Older pages are the full pages whose last token is at least recent_tokens behind the head:
// floor((context − recent_tokens) / T) of them; the rest, the partial last page included, stay
// bf16.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"

namespace {

using namespace kvpool;
using namespace kvpool::kernels;
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

void check(const std::string& e, const char* what) {
  if (!e.empty()) {
    std::fprintf(stderr, "%s: %s\n", what, e.c_str());
    std::exit(1);
  }
}

// A page_major pool in host memory, pages handed out from a random permutation.
struct Pool {
  Pool(const Geometry& geometry, uint32_t pages, uint64_t seed)
      : g(geometry), num_pages(pages), data(page_data_bytes(geometry) * pages + 64) {
    if (dtype_is_quantized(g.dtype)) scales.assign(page_scale_bytes(g) / 4 * pages, 0.0f);
    free.resize(pages);
    std::iota(free.begin(), free.end(), 0u);
    std::mt19937_64 rng(seed);
    std::shuffle(free.begin(), free.end(), rng);
  }
  PagedKv kv() {
    PagedKv kv;
    kv.base = data.data();
    kv.page_stride = page_data_bytes(g);
    kv.scales = scales.empty() ? nullptr : scales.data();
    kv.geometry = g;
    return kv;
  }
  std::vector<PageId> take(uint32_t n) {
    std::vector<PageId> out(free.end() - n, free.end());
    free.resize(free.size() - n);
    return out;
  }
  Geometry g;
  uint32_t num_pages;
  std::vector<std::byte> data;
  std::vector<float> scales;
  std::vector<PageId> free;
};

// Older pages of a sequence of `ctx` tokens that keeps its last `recent` tokens in full precision.
uint32_t older_pages(uint32_t ctx, uint32_t recent, uint32_t t_page) {
  return ctx > recent ? (ctx - recent) / t_page : 0;
}

// One configuration's pools and block tables: sequences of ctx tokens whose leading `older`
// pages are in `low` (converted from bf16 pages written by append_kv), the rest in `high`; or
// every page in `low` written by append_kv directly (all_low).
struct Batch {
  std::vector<PageId> tables;
  std::vector<uint32_t> older;
  uint32_t stride = 0;
};

Batch fill(Pool& high, Pool& low, uint32_t seqs, uint32_t ctx, uint32_t recent, bool all_low,
           const std::vector<std::vector<float>>& k, const std::vector<std::vector<float>>& v) {
  const Geometry& g = high.g;
  const uint32_t t = g.tokens_per_page;
  Batch b;
  b.stride = (ctx + t - 1) / t;
  b.tables.resize(size_t{seqs} * b.stride);
  for (uint32_t s = 0; s < seqs; ++s) {
    Pool& target = all_low ? low : high;
    const std::vector<PageId> pages = target.take(b.stride);
    std::vector<int64_t> slots(ctx);
    for (uint32_t i = 0; i < ctx; ++i)
      slots[i] = int64_t{pages[i / t]} * t + i % t;
    AppendArgs a{target.kv(), 0, ctx, k[s].data(), v[s].data(), slots.data()};
    check(cpu::append_kv(a, target.num_pages), "append_kv");
    std::copy(pages.begin(), pages.end(), b.tables.begin() + size_t{s} * b.stride);
    const uint32_t o = all_low ? b.stride : older_pages(ctx, recent, t);
    b.older.push_back(o);
    if (all_low || o == 0) continue;
    const std::vector<PageId> dst = low.take(o);
    ConvertPagesArgs c{high.kv(), low.kv(), o, pages.data(), dst.data()};
    check(cpu::convert_pages(c, high.num_pages, low.num_pages), "convert_pages");
    std::copy(dst.begin(), dst.end(), b.tables.begin() + size_t{s} * b.stride);
  }
  return b;
}

DecodeArgs decode_args(Pool& high, Pool& low, const Batch& b, uint32_t seqs, uint32_t hq,
                       const std::vector<uint32_t>& lens, const float* q, float* out, bool all_low,
                       float scale) {
  DecodeArgs a;
  a.kv = high.kv();
  a.num_seqs = seqs;
  a.num_q_heads = hq;
  a.q = q;
  a.out = out;
  a.block_tables = b.tables.data();
  a.block_table_stride = b.stride;
  a.context_lens = lens.data();
  a.scale = scale;
  if (all_low) {
    a.kv = low.kv();
  } else if (std::any_of(b.older.begin(), b.older.end(), [](uint32_t o) { return o != 0; })) {
    a.mixed = MixedPrecision{low.kv(), b.older.data(), low.num_pages};
  }
  return a;
}

// fp64 attention of every (sequence, query head) over the fp32 source rows.
std::vector<double> reference(const std::vector<std::vector<float>>& k,
                              const std::vector<std::vector<float>>& v, const std::vector<float>& q,
                              uint32_t seqs, uint32_t ctx, uint32_t hq, uint32_t kvh, uint32_t d,
                              float scale) {
  std::vector<double> out(size_t{seqs} * hq * d, 0.0);
  std::vector<double> s(ctx);
  for (uint32_t sq = 0; sq < seqs; ++sq) {
    for (uint32_t h = 0; h < hq; ++h) {
      const uint32_t kh = h / (hq / kvh);
      const float* qr = q.data() + (size_t{sq} * hq + h) * d;
      double m = -1e300;
      for (uint32_t j = 0; j < ctx; ++j) {
        const float* kr = k[sq].data() + (size_t{j} * kvh + kh) * d;
        double a = 0.0;
        for (uint32_t x = 0; x < d; ++x)
          a += double{qr[x]} * kr[x];
        s[j] = a * scale;
        m = std::max(m, s[j]);
      }
      double l = 0.0;
      double* o = out.data() + (size_t{sq} * hq + h) * d;
      for (uint32_t j = 0; j < ctx; ++j) {
        const double p = std::exp(s[j] - m);
        l += p;
        const float* vr = v[sq].data() + (size_t{j} * kvh + kh) * d;
        for (uint32_t x = 0; x < d; ++x)
          o[x] += p * vr[x];
      }
      for (uint32_t x = 0; x < d; ++x)
        o[x] /= l;
    }
  }
  return out;
}

struct Error {
  double mean = 0.0;
  double max = 0.0;
};

Error relative_error(const std::vector<float>& out, const std::vector<double>& ref, uint32_t rows,
                     uint32_t d) {
  Error e;
  for (uint32_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 0.0;
    for (uint32_t x = 0; x < d; ++x) {
      const double diff = out[size_t{r} * d + x] - ref[size_t{r} * d + x];
      num += diff * diff;
      den += ref[size_t{r} * d + x] * ref[size_t{r} * d + x];
    }
    const double rel = std::sqrt(num / den);
    e.mean += rel / rows;
    e.max = std::max(e.max, rel);
  }
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvpool-mixed-precision-bench: capacity, decode speed, conversion cost and accuracy "
      "of mixed-precision KV (recent tokens bf16, older ones 8-bit)"};
  unsigned threads = std::thread::hardware_concurrency();
  int reps = 5;
  uint32_t layers = 32, kv_heads = 8, head_dim = 128, tpp = 16, q_per_kv = 4;
  uint32_t context = 32768, seqs = 4, accuracy_context = 8192, accuracy_seqs = 2;
  std::vector<uint32_t> recents{256, 1024, 4096};
  std::string low_name = "fp8_e4m3";
  float score_std = 2.5f;
  app.add_option("--threads", threads, "Kernel threads")->capture_default_str();
  app.add_option("--reps", reps, "Repetitions per timing (best is reported)")
      ->capture_default_str();
  app.add_option("--layers", layers, "Model layers (capacity, conversion)")->capture_default_str();
  app.add_option("--kv-heads", kv_heads, "KV heads")->capture_default_str();
  app.add_option("--head-dim", head_dim, "Head dim")->capture_default_str();
  app.add_option("--tokens-per-page", tpp, "Tokens per page")->capture_default_str();
  app.add_option("--group", q_per_kv, "Query heads per KV head")->capture_default_str();
  app.add_option("--context", context, "Context length (capacity, decode)")->capture_default_str();
  app.add_option("--seqs", seqs, "Sequences in the decode batch")->capture_default_str();
  app.add_option("--accuracy-context", accuracy_context, "Context length of the accuracy runs")
      ->capture_default_str();
  app.add_option("--accuracy-seqs", accuracy_seqs, "Sequences of the accuracy runs")
      ->capture_default_str();
  app.add_option("--recent", recents, "recent_tokens values")->capture_default_str();
  app.add_option("--low", low_name, "8-bit dtype of older pages: fp8_e4m3 or int8")
      ->capture_default_str();
  app.add_option("--score-std", score_std, "Standard deviation of q·k · scale in the accuracy runs")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::optional<KvDtype> low_dtype = parse_dtype(low_name);
  if (!low_dtype || !dtype_is_quantized(*low_dtype)) {
    std::fprintf(stderr, "--low: '%s' is not an 8-bit dtype (fp8_e4m3, int8)\n", low_name.c_str());
    return 2;
  }

  Geometry model{layers, kv_heads, head_dim, tpp, KvDtype::bf16};
  Geometry model_low = model;
  model_low.dtype = *low_dtype;
  const double gib = double(1ull << 30);
  const auto page_bytes = [](const Geometry& g) {
    return double(page_data_bytes(g) + page_scale_bytes(g));
  };
  const uint32_t total_pages = (context + tpp - 1) / tpp;
  std::printf("# capacity: %u layers, %u KV heads, head_dim %u, %u tokens/page, context %u\n",
              layers, kv_heads, head_dim, tpp, context);
  std::printf("%-22s %14s %14s %10s\n", "configuration", "MiB/sequence", "tokens/GiB", "vs bf16");
  const double bf16_seq = total_pages * page_bytes(model);
  const auto capacity_row = [&](const std::string& name, double bytes) {
    std::printf("%-22s %14.1f %14.0f %9.2fx\n", name.c_str(), bytes / (1 << 20),
                context / bytes * gib, bf16_seq / bytes);
  };
  capacity_row("all bf16", bf16_seq);
  capacity_row(std::string("all ") + low_name, total_pages * page_bytes(model_low));
  for (const uint32_t r : recents) {
    const uint32_t o = older_pages(context, r, tpp);
    capacity_row("mixed recent=" + std::to_string(r),
                 o * page_bytes(model_low) + (total_pages - o) * page_bytes(model));
  }

  // Decode: one layer of the geometry, a batch of sequences at `context`.
  Geometry layer = model;
  layer.layers = 1;
  Geometry layer_low = layer;
  layer_low.dtype = *low_dtype;
  const uint32_t hq = kv_heads * q_per_kv;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  std::mt19937_64 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::lognormal_distribution<float> channel(0.0f, 0.5f);
  const auto make_kv = [&](uint32_t n_seqs, uint32_t ctx, std::vector<std::vector<float>>& k,
                           std::vector<std::vector<float>>& v) {
    std::vector<float> ch(head_dim);
    for (uint32_t x = 0; x < head_dim; ++x)
      ch[x] = channel(rng) * (x % 16 == 0 ? 8.0f : 1.0f);
    k.assign(n_seqs, {});
    v.assign(n_seqs, {});
    for (uint32_t s = 0; s < n_seqs; ++s) {
      k[s].resize(size_t{ctx} * kv_heads * head_dim);
      v[s].resize(k[s].size());
      for (size_t i = 0; i < k[s].size(); ++i) {
        k[s][i] = nd(rng) * ch[i % head_dim];
        v[s][i] = nd(rng);
      }
    }
  };
  {
    std::vector<std::vector<float>> k, v;
    make_kv(seqs, context, k, v);
    std::vector<float> q(size_t{seqs} * hq * head_dim);
    for (float& x : q)
      x = nd(rng);
    const std::vector<uint32_t> lens(seqs, context);
    std::vector<float> out(q.size());
    const uint64_t bf16_row = uint64_t{kv_heads} * head_dim * 2 * 2;  // K and V of a token
    const uint64_t low_row = bf16_row / 2;
    std::printf(
        "\n# decode (CPU, %u threads): one layer, %u sequences x %u tokens, %u query heads "
        "per KV head, page_major, pages scattered\n",
        threads, seqs, context, q_per_kv);
    std::printf("%-22s %10s %10s %10s %12s\n", "configuration", "ms", "GB/s", "vs bf16 t",
                "vs bf16 GB/s");
    double bf16_ms = 0.0, bf16_gbs = 0.0;
    const auto run = [&](const std::string& name, uint32_t recent, bool all_low, bool all_high) {
      Pool high(layer, seqs * (total_pages + 1), 1);
      Pool low(layer_low, seqs * (total_pages + 1), 2);
      const Batch b = fill(high, low, seqs, context, all_high ? context : recent, all_low, k, v);
      const DecodeArgs a =
          decode_args(high, low, b, seqs, hq, lens, q.data(), out.data(), all_low, scale);
      const uint32_t bound = all_low ? low.num_pages : high.num_pages;
      check(cpu::decode(a, bound, threads), "decode");
      const double t = best_seconds(reps, [&] { cpu::decode(a, bound, threads); });
      uint64_t bytes = 0;
      for (uint32_t s = 0; s < seqs; ++s) {
        const uint64_t older_tokens = std::min<uint64_t>(context, uint64_t{b.older[s]} * tpp);
        bytes += older_tokens * low_row + (context - older_tokens) * bf16_row;
      }
      const double gbs = double(bytes) / t / 1e9;
      if (all_high) {
        bf16_ms = t * 1e3;
        bf16_gbs = gbs;
      }
      std::printf("%-22s %10.2f %10.2f %9.2fx %11.0f%%\n", name.c_str(), t * 1e3, gbs,
                  bf16_ms / (t * 1e3), 100.0 * gbs / bf16_gbs);
    };
    run("all bf16", 0, false, true);
    run(std::string("all ") + low_name, 0, true, false);
    for (const uint32_t r : recents)
      run("mixed recent=" + std::to_string(r), r, false, false);
  }

  // Conversion of whole pages of the full geometry.
  {
    const uint32_t pages = std::max(8u, uint32_t((256ull << 20) / page_data_bytes(model)));
    Pool src(model, pages, 3);
    std::fill(src.data.begin(), src.data.end(), std::byte{0x3c});  // bf16 ≈ 0.0117, finite
    std::printf(
        "\n# convert_pages: whole pages of the capacity geometry (%.2f MiB bf16 each), %u "
        "pages per call\n",
        double(page_data_bytes(model)) / double(1 << 20), pages);
    std::printf("%-12s %8s %12s %12s\n", "to", "threads", "us/page", "GB/s read");
    for (const KvDtype to : {KvDtype::fp8_e4m3, KvDtype::int8}) {
      Geometry dg = model;
      dg.dtype = to;
      Pool dst(dg, pages, 4);
      std::vector<PageId> ids(pages);
      std::iota(ids.begin(), ids.end(), 0u);
      for (const unsigned th : {1u, threads}) {
        ConvertPagesArgs c{src.kv(), dst.kv(), pages, ids.data(), ids.data()};
        const double t =
            best_seconds(reps, [&] { check(cpu::convert_pages(c, pages, pages, th), "convert"); });
        std::printf("%-12s %8u %12.1f %12.2f\n", std::string(dtype_name(to)).c_str(), th,
                    t / pages * 1e6, double(page_data_bytes(model)) * pages / t / 1e9);
        if (threads == 1) break;
      }
    }
  }

  // Accuracy against fp64 over the source values.
  {
    std::vector<std::vector<float>> k, v;
    make_kv(accuracy_seqs, accuracy_context, k, v);
    // q · k · scale ≈ N(0, score_std²): |k|² ≈ Σ ch², so q ~ N(0, σ²) with σ = score_std /
    // (scale · sqrt(mean k²·d)).
    double k2 = 0.0;
    for (float x : k[0])
      k2 += double{x} * x;
    k2 /= double(k[0].size());
    const float q_std = score_std / (scale * float(std::sqrt(k2 * head_dim)));
    std::vector<float> q(size_t{accuracy_seqs} * hq * head_dim);
    for (float& x : q)
      x = nd(rng) * q_std;
    const std::vector<uint32_t> lens(accuracy_seqs, accuracy_context);
    const std::vector<double> ref =
        reference(k, v, q, accuracy_seqs, accuracy_context, hq, kv_heads, head_dim, scale);
    std::vector<float> out(q.size());
    const uint32_t pages = (accuracy_context + tpp - 1) / tpp;
    std::printf(
        "\n# accuracy: decode output vs fp64 over the fp32 source, %u sequences x %u "
        "tokens, %u query heads, scores' std %.1f; relative L2 error per (sequence, "
        "head)\n",
        accuracy_seqs, accuracy_context, hq, double(score_std));
    std::printf("%-22s %12s %12s\n", "configuration", "mean", "max");
    const auto run = [&](const std::string& name, uint32_t recent, bool all_low) {
      Pool high(layer, accuracy_seqs * (pages + 1), 5);
      Pool low(layer_low, accuracy_seqs * (pages + 1), 6);
      const Batch b = fill(high, low, accuracy_seqs, accuracy_context, recent, all_low, k, v);
      const DecodeArgs a =
          decode_args(high, low, b, accuracy_seqs, hq, lens, q.data(), out.data(), all_low, scale);
      check(cpu::decode(a, all_low ? low.num_pages : high.num_pages, threads), "decode");
      const Error e = relative_error(out, ref, accuracy_seqs * hq, head_dim);
      std::printf("%-22s %12.3e %12.3e\n", name.c_str(), e.mean, e.max);
    };
    run("all bf16", accuracy_context, false);
    run(std::string("all ") + low_name, 0, true);
    for (const uint32_t r : recents)
      run("mixed recent=" + std::to_string(r), r, false);
  }
  return 0;
}

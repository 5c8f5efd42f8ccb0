#include "tests/gpu/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/kernels_cpu.h"
#include "tests/unit/kernel_test_util.h"

namespace kvpool::gpu_check {

using namespace kvpool::kernels;

namespace {

// A host pool with its pages filled through cpu::append_kv: the reference's memory.
struct HostPool {
  Geometry g;
  uint32_t num_pages = 0;
  uint64_t stride = 0;
  std::vector<std::byte> mem;
  std::vector<float> scales;
  KvLayout layout = KvLayout::page_major;
  // Segmented layer_major (an elastic pool's, kernels/paged_kv.h): segments of segment_pages
  // pages with one block of slack after each.
  uint32_t segment_pages = 0;
  uint64_t segment_stride = 0;
  PagedKv view() {
    return PagedKv{mem.data(),
                   stride,
                   scales.empty() ? nullptr : scales.data(),
                   g,
                   layout,
                   num_pages,
                   segment_pages,
                   segment_stride};
  }
  // Sizes mem (and the segment stride) for num_pages pages of `stride` bytes.
  size_t bytes() {
    if (segment_pages == 0) return size_t(num_pages) * stride;
    segment_stride = uint64_t(segment_pages) * stride + stride / (kv_planes(g) * g.layers);
    return size_t((num_pages + segment_pages - 1) / segment_pages) * segment_stride;
  }
};

struct Case {
  KvDtype dtype;
  uint32_t head_dim;
  uint32_t group;
  uint32_t tpp;
  std::vector<uint32_t> contexts;
  std::vector<uint32_t> splits;  // decode split_tokens to run: 0 = planned, 1 << 20 = no split
  KvLayout layout = KvLayout::page_major;
  // AttentionMask: a sliding window (window_left ≥ 0), an attention chunk, per-head sinks.
  int32_t window_left = -1;
  uint32_t chunk = 0;
  bool sinks = false;
  // A latent (MLA) pool: one head_dim vector per token (kv_heads 1, `group` query heads), value
  // rows its first value_dim elements.
  uint32_t value_dim = 0;
  // layer_major only: pages per segment of a segmented pool; 0 for one plane per layer.
  uint32_t segment_pages = 0;
  // Mixed precision (DecodeArgs::mixed, ExtendArgs::mixed; 16-bit dtypes): each sequence's first
  // half of its blocks (rounded up) lives in an 8-bit pool of the other layout (fp8 under bf16,
  // int8 under fp16; the other way round with other_older, so that every pair is compared).
  bool mixed = false;
  bool other_older = false;
  bool latent() const { return value_dim != 0; }
};

// The 8-bit pool under a mixed case's 16-bit one.
KvDtype older_dtype(const Case& c) {
  return (c.dtype == KvDtype::bf16) != c.other_older ? KvDtype::fp8_e4m3 : KvDtype::int8;
}

// Elements of one output row.
uint32_t out_width(const Case& c) {
  return c.latent() ? c.value_dim : c.head_dim;
}

// Target memory freed at scope exit; each put/get records the first error.
class TargetBuffers {
 public:
  explicit TargetBuffers(KernelTarget& t) : t_(t) {}
  TargetBuffers(const TargetBuffers&) = delete;
  TargetBuffers& operator=(const TargetBuffers&) = delete;
  ~TargetBuffers() {
    for (void* p : owned_)
      t_.release(p);
  }
  void* raw(size_t bytes) {
    void* p = nullptr;
    if (std::string e = t_.alloc(&p, std::max<size_t>(bytes, 1)); !e.empty()) {
      note(e);
      return nullptr;
    }
    owned_.push_back(p);
    return p;
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    auto* p = static_cast<T*>(raw(v.size() * sizeof(T)));
    if (p != nullptr && !v.empty()) note(t_.upload(p, v.data(), v.size() * sizeof(T)));
    return p;
  }
  // A buffer of `n` floats that reads NaN until written, followed by kGuard more that must stay
  // so (a kernel writing past its output is caught, not hidden in a larger allocation).
  static constexpr size_t kGuard = 64;
  float* nan_floats(size_t n) {
    auto* p = static_cast<float*>(raw((n + kGuard) * sizeof(float)));
    if (p != nullptr) note(t_.fill(p, 0xff, (n + kGuard) * sizeof(float)));
    return p;
  }
  // Copies the first host.size() floats of a nan_floats buffer back and checks its guard.
  void get_output(std::vector<float>& host, const float* src) {
    std::vector<float> all(host.size() + kGuard);
    get(all, src);
    if (!error_.empty()) return;
    std::copy(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(host.size()), host.begin());
    for (size_t i = host.size(); i < all.size(); ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &all[i], sizeof bits);
      if (bits != 0xffffffffu) {
        return note("the kernel wrote past its output (float " + std::to_string(i) + " of a " +
                    std::to_string(host.size()) + "-float output)");
      }
    }
  }
  template <typename T>
  void get(std::vector<T>& host, const T* src) {
    if (src == nullptr) return note("no target buffer to copy back");
    note(t_.download(host.data(), src, host.size() * sizeof(T)));
  }
  void note(const std::string& e) {
    if (!e.empty() && error_.empty()) error_ = e;
  }
  const std::string& error() const { return error_; }
  void clear_error() { error_.clear(); }

 private:
  KernelTarget& t_;
  std::vector<void*> owned_;
  std::string error_;
};

class Matrix {
 public:
  Matrix(KernelTarget& t, bool verbose) : t_(t), verbose_(verbose) {}

  void run_case(const Case& c);
  void run_append_case(KvDtype dtype, KvLayout layout, bool latent, uint32_t segment_pages = 0);
  int failures() const { return failures_; }
  int comparisons() const { return comparisons_; }

 private:
  void result(bool ok, const std::string& line) {
    ++comparisons_;
    if (!ok) ++failures_;
    if (!ok || verbose_) std::printf("%-6s %s\n", ok ? "ok" : "FAILED", line.c_str());
  }
  // An error that stops a case before its comparisons: counted as one failed comparison.
  void error(const std::string& what, const std::string& err) { result(false, what + ": " + err); }
  void expect_close(const char* what, const Case& c, uint32_t detail, const std::string& err,
                    const std::vector<float>& got, const std::vector<float>& want);
  void run_convert_case(HostPool& src, const PagedKv& on_target, TargetBuffers& buf,
                        const std::string& what);

  KernelTarget& t_;
  bool verbose_;
  std::mt19937 rng_{42};
  int failures_ = 0;
  int comparisons_ = 0;
};

std::string describe(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%-11s %-9s D=%-3u group=%u T=%-2u seqs=%zu",
                std::string(layout_name(c.layout)).c_str(),
                std::string(dtype_name(c.dtype)).c_str(), c.head_dim, c.group, c.tpp,
                c.contexts.size());
  std::string out = buf;
  if (c.segment_pages != 0) out += " segment_pages=" + std::to_string(c.segment_pages);
  if (c.window_left >= 0) out += " window_left=" + std::to_string(c.window_left);
  if (c.chunk != 0) out += " chunk=" + std::to_string(c.chunk);
  if (c.sinks) out += " sinks";
  if (c.latent()) out += " latent value_dim=" + std::to_string(c.value_dim);
  if (c.mixed) {
    out += " mixed (older: " + std::string(dtype_name(older_dtype(c))) + " " +
           std::string(layout_name(c.layout == KvLayout::page_major ? KvLayout::layer_major
                                                                    : KvLayout::page_major)) +
           ")";
  }
  return out;
}

void Matrix::expect_close(const char* what, const Case& c, uint32_t detail, const std::string& err,
                          const std::vector<float>& got, const std::vector<float>& want) {
  char head[200];
  std::snprintf(head, sizeof head, "%-7s %s %s=%-7u", what, describe(c).c_str(),
                what[0] == 'd' ? "split" : "new", detail);
  if (!err.empty()) return error(head, err);
  // Each output row (one query head of one token) against its own range: fp32 accumulation on
  // both sides in a different order, a few ulps of that row's values. A row of a short context
  // (whose output is close to one V row) does not widen the bound of a long one.
  const size_t row = out_width(c);
  double worst = 0;  // max |err| / bound over the rows; ≤ 1 passes
  double worst_abs = 0;
  for (size_t r = 0; r + row <= want.size(); r += row) {
    double range = 0;
    for (size_t i = r; i < r + row; ++i)
      range = std::max(range, double(std::fabs(want[i])));
    const double bound = 2e-5 * range + 1e-6;
    for (size_t i = r; i < r + row; ++i) {
      double e = std::fabs(double(got[i]) - double(want[i]));
      if (std::isnan(e)) e = INFINITY;
      worst_abs = std::max(worst_abs, e);
      worst = std::max(worst, e / bound);
    }
  }
  const bool ok = worst <= 1.0 && got.size() == want.size();
  char tail[96];
  std::snprintf(tail, sizeof tail, " max|err|=%.2e (%.2f of the bound)", worst_abs, worst);
  result(ok, std::string(head) + tail);
}

// One pool (layer 1 of 2; layer 0, unused slots and unused pages' scales hold NaN) holding the
// case's sequences on scattered pages; decode for every split of the case and extend with a
// cached prefix (the last min(ctx, 5) tokens new) and without one (every token new where ctx ≤
// 300, else the last 70), each against the CPU kernels on the same pool.
void Matrix::run_case(const Case& c) {
  const uint32_t kv_heads = c.latent() ? 1 : 2;
  const uint32_t layer = 1;
  const uint32_t q_heads = kv_heads * c.group;
  const Geometry g = c.latent()
                         ? Geometry{2, 1, c.head_dim, c.tpp, c.dtype, AttentionKind::latent, 0}
                         : Geometry{2, kv_heads, c.head_dim, c.tpp, c.dtype};
  uint32_t blocks = 0;
  uint32_t max_ctx = 0;
  for (uint32_t ctx : c.contexts) {
    blocks = std::max(blocks, (ctx + c.tpp - 1) / c.tpp);
    max_ctx = std::max(max_ctx, ctx);
  }
  const auto nseq = static_cast<uint32_t>(c.contexts.size());
  HostPool p;
  p.g = g;
  p.layout = c.layout;
  p.num_pages = blocks * nseq * 2;
  p.stride = page_data_bytes(g);
  p.segment_pages = c.segment_pages;
  p.mem.resize(p.bytes());
  const uint16_t nan = kernels::test::nan_bits(g.dtype);  // the slots no token uses
  for (size_t i = 0; i < p.mem.size(); i += dtype_bytes(g.dtype))
    std::memcpy(&p.mem[i], &nan, dtype_bytes(g.dtype));
  p.scales.assign(p.num_pages * page_scale_bytes(g) / sizeof(float), std::nanf(""));
  std::vector<PageId> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), rng_);
  std::vector<PageId> tables(size_t(nseq) * blocks);
  for (size_t i = 0; i < tables.size(); ++i)
    tables[i] = perm[i];
  // A mixed case's older pool: the same page count, its own NaN-filled memory; block-table entry
  // i < older_pages[s] of sequence s names a page of it.
  HostPool o;
  std::vector<uint32_t> older_pages(nseq, 0);
  if (c.mixed) {
    o.g = g;
    o.g.dtype = older_dtype(c);
    o.layout = c.layout == KvLayout::page_major ? KvLayout::layer_major : KvLayout::page_major;
    o.num_pages = p.num_pages;
    o.stride = page_data_bytes(o.g);
    o.mem.assign(o.bytes(), std::byte{0x7f});  // fp8 NaN; int8 127 with a NaN scale
    o.scales.assign(o.num_pages * page_scale_bytes(o.g) / sizeof(float), std::nanf(""));
    for (uint32_t s = 0; s < nseq; ++s)
      older_pages[s] = ((c.contexts[s] + c.tpp - 1) / c.tpp + 1) / 2;
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Fill every sequence's tokens through the CPU append, in order.
  for (uint32_t s = 0; s < nseq; ++s) {
    for (uint32_t t = 0; t < c.contexts[s]; ++t) {
      std::vector<float> k(kv_heads * c.head_dim), v(k.size());
      for (auto& x : k)
        x = nd(rng_);
      for (auto& x : v)
        x = nd(rng_);
      const int64_t slot = int64_t(tables[s * blocks + t / c.tpp]) * c.tpp + t % c.tpp;
      HostPool& into = t / c.tpp < older_pages[s] ? o : p;
      AppendArgs a{into.view(), layer, 1, k.data(), c.latent() ? nullptr : v.data(), &slot};
      if (const std::string e = cpu::append_kv(a, into.num_pages); !e.empty())
        return error("fill " + describe(c), e);
    }
  }
  std::vector<float> q(size_t(nseq) * q_heads * c.head_dim);
  for (auto& x : q)
    x = nd(rng_);
  std::vector<float> want(size_t(nseq) * q_heads * out_width(c)), got(want.size());
  std::vector<float> sinks(q_heads);
  for (auto& x : sinks)
    x = nd(rng_) * 2.0f;
  DecodeArgs a;
  a.kv = p.view();
  a.layer = layer;
  a.num_seqs = nseq;
  a.num_q_heads = q_heads;
  a.q = q.data();
  a.out = want.data();
  a.block_tables = tables.data();
  a.block_table_stride = blocks;
  a.context_lens = c.contexts.data();
  a.scale = 1.0f / std::sqrt(float(c.head_dim));
  a.mask = AttentionMask{c.window_left, c.chunk, c.sinks ? sinks.data() : nullptr};
  a.value_dim = c.value_dim;
  if (c.mixed) a.mixed = MixedPrecision{o.view(), older_pages.data(), o.num_pages};
  if (const std::string e = cpu::decode(a, p.num_pages); !e.empty())
    return error("reference decode " + describe(c), e);

  // The same on the target, for every split.
  TargetBuffers buf(t_);
  DecodeArgs d = a;
  d.kv.base = buf.put(p.mem);
  d.kv.scales = p.scales.empty() ? nullptr : buf.put(p.scales);
  d.q = buf.put(q);
  d.block_tables = buf.put(tables);
  d.context_lens = buf.put(c.contexts);
  if (c.sinks) d.mask.sinks = buf.put(sinks);
  if (c.mixed) {
    d.mixed.older.base = buf.put(o.mem);
    d.mixed.older.scales = buf.put(o.scales);
    d.mixed.older_pages = buf.put(older_pages);
  }
  if (!buf.error().empty()) return error("upload " + describe(c), buf.error());
  for (uint32_t split : c.splits) {
    d.split_tokens = split;
    TargetBuffers run(t_);
    const size_t ws_bytes = t_.decode_workspace_bytes(d, max_ctx);
    void* ws = ws_bytes != 0 ? run.raw(ws_bytes) : nullptr;
    d.out = run.nan_floats(got.size());
    std::fill(got.begin(), got.end(), std::nanf(""));
    std::string err = run.error();
    if (err.empty()) err = t_.decode(d, max_ctx, p.num_pages, ws, ws_bytes);
    if (err.empty()) err = t_.synchronize();
    if (err.empty()) {
      run.get_output(got, d.out);
      err = run.error();
    }
    expect_close("decode", c, split, err, got, want);
  }

  // Extend over the same pool.
  for (const bool with_prefix : {true, false}) {
    std::vector<uint32_t> offsets{0};
    uint32_t longest = 0;
    for (uint32_t s = 0; s < nseq; ++s) {
      const uint32_t ctx = c.contexts[s];
      const uint32_t n = with_prefix ? std::min(ctx, 5u) : (ctx <= 300 ? ctx : 70u);
      offsets.push_back(offsets.back() + n);
      longest = std::max(longest, n);
    }
    std::vector<float> eq(size_t(offsets.back()) * q_heads * c.head_dim);
    for (auto& x : eq)
      x = nd(rng_);
    std::vector<float> ewant(size_t(offsets.back()) * q_heads * out_width(c));
    std::vector<float> egot(ewant.size(), std::nanf(""));
    ExtendArgs e{p.view(),     layer,          nseq,          q_heads, eq.data(),
                 ewant.data(), offsets.data(), tables.data(), blocks,  c.contexts.data(),
                 a.scale,      a.mask,         c.value_dim,   a.mixed};
    if (const std::string err = cpu::extend(e, p.num_pages); !err.empty())
      return error("reference extend " + describe(c), err);
    TargetBuffers run(t_);
    ExtendArgs ed = e;
    ed.kv = d.kv;
    ed.q = run.put(eq);
    ed.out = run.nan_floats(egot.size());
    ed.q_offsets = run.put(offsets);
    ed.block_tables = d.block_tables;
    ed.context_lens = d.context_lens;
    ed.mask.sinks = d.mask.sinks;
    ed.mixed = d.mixed;
    std::string err = run.error();
    if (err.empty()) err = t_.extend(ed, offsets.back(), p.num_pages);
    if (err.empty()) err = t_.synchronize();
    if (err.empty()) {
      run.get_output(egot, ed.out);
      err = run.error();
    }
    expect_close("extend", c, longest, err, egot, ewant);
  }
}

// The target's append writes the same values the CPU append does (compared dequantised); then
// the target's copy-pages copies what the CPU one does. `latent`: DeepSeek-V3's MLA vector (one
// 576-value row per token and layer, no V).
void Matrix::run_append_case(KvDtype dtype, KvLayout layout, bool latent, uint32_t segment_pages) {
  const Geometry g = latent ? Geometry{2, 1, 576, 16, dtype, AttentionKind::latent, 0}
                            : Geometry{2, 2, 128, 16, dtype};
  const uint32_t pages = 8;
  HostPool cpu_pool;
  cpu_pool.g = g;
  cpu_pool.layout = layout;
  cpu_pool.num_pages = pages;
  cpu_pool.stride = page_data_bytes(g);
  cpu_pool.segment_pages = segment_pages;
  cpu_pool.mem.assign(cpu_pool.bytes(), std::byte{0});
  cpu_pool.scales.assign(pages * page_scale_bytes(g) / sizeof(float), 0.0f);
  const std::string what = std::string(layout_name(layout)) + " " + std::string(dtype_name(dtype)) +
                           (latent ? " latent" : "") + (segment_pages != 0 ? " segmented" : "");
  const uint32_t n = 40;
  std::vector<float> k(size_t{n} * g.kv_heads * g.head_dim), v(latent ? 0 : k.size());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& x : k)
    x = nd(rng_) * (1.0f + float(&x - k.data()) / float(k.size()) * 4.0f);
  for (auto& x : v)
    x = nd(rng_);
  std::vector<int64_t> slots(n);
  for (uint32_t t = 0; t < n; ++t)
    slots[t] = t == 7 ? -1 : int64_t(3 * 16 + t);
  AppendArgs a{cpu_pool.view(), 1, n, k.data(), latent ? nullptr : v.data(), slots.data()};
  if (const std::string e = cpu::append_kv(a, pages); !e.empty())
    return error("reference append " + what, e);

  TargetBuffers buf(t_);
  const std::vector<std::byte> zero(cpu_pool.mem.size(), std::byte{0});
  const std::vector<float> zero_scales(cpu_pool.scales.size(), 0.0f);
  AppendArgs d = a;
  d.kv.base = buf.put(zero);
  d.kv.scales = zero_scales.empty() ? nullptr : buf.put(zero_scales);
  d.k = buf.put(k);
  d.v = latent ? nullptr : buf.put(v);
  d.slots = buf.put(slots);
  std::string err = buf.error();
  if (err.empty()) err = t_.append_kv(d, pages);
  if (err.empty()) err = t_.synchronize();
  std::vector<std::byte> got(zero.size());
  std::vector<float> got_scales(zero_scales.size());
  if (err.empty()) {
    buf.get(got, static_cast<const std::byte*>(d.kv.base));
    if (!got_scales.empty()) buf.get(got_scales, d.kv.scales);
    err = buf.error();
  }
  if (!err.empty()) return error("append  " + what, err);
  bool same = got == cpu_pool.mem;
  for (size_t i = 0; i < got_scales.size(); ++i) {
    same = same &&
           std::fabs(got_scales[i] - cpu_pool.scales[i]) <= 1e-6f * std::fabs(cpu_pool.scales[i]);
  }
  result(same, "append  " + what +
                   (same ? ": bytes and scales identical to the CPU append"
                         : ": bytes or scales differ from the CPU append"));

  // Copy pages 3 and 4 (the appended ones) onto 6 and 1, on both sides, from the CPU's bytes.
  const std::vector<PageId> src{3, 4}, dst{6, 1};
  CopyPagesArgs cc{cpu_pool.view(), 2, src.data(), dst.data()};
  const std::vector<std::byte> before = cpu_pool.mem;
  const std::vector<float> before_scales = cpu_pool.scales;
  if (const std::string e = cpu::copy_pages(cc, pages); !e.empty())
    return error("reference copy " + what, e);
  CopyPagesArgs dc = cc;
  dc.kv = d.kv;
  dc.src = buf.put(src);
  dc.dst = buf.put(dst);
  buf.note(t_.upload(dc.kv.base, before.data(), before.size()));
  if (!before_scales.empty()) {
    buf.note(t_.upload(dc.kv.scales, before_scales.data(), before_scales.size() * sizeof(float)));
  }
  err = buf.error();
  if (err.empty()) err = t_.copy_pages(dc, pages);
  if (err.empty()) err = t_.synchronize();
  std::vector<std::byte> copied(got.size());
  std::vector<float> copied_scales(got_scales.size());
  if (err.empty()) {
    buf.get(copied, static_cast<const std::byte*>(dc.kv.base));
    if (!copied_scales.empty()) buf.get(copied_scales, dc.kv.scales);
    err = buf.error();
  }
  if (!err.empty()) return error("copy    " + what, err);
  const bool copy_same = copied == cpu_pool.mem && copied_scales == cpu_pool.scales;
  result(copy_same, "copy    " + what +
                        (copy_same ? ": bytes identical to the CPU copy"
                                   : ": bytes differ from the CPU copy"));
  if (!dtype_is_quantized(dtype)) run_convert_case(cpu_pool, dc.kv, buf, what);
}

// Convert-pages: pages 3 and 4 of a 16-bit pool (the CPU's bytes, uploaded to `on_target`)
// into pages 5 and 0 of an 8-bit pool of the other layout (fp8 from bf16, int8 from fp16): the
// target's bytes and scales must be the CPU kernel's, bit for bit (same quantisers, same amax).
void Matrix::run_convert_case(HostPool& src, const PagedKv& on_target, TargetBuffers& buf,
                              const std::string& what) {
  HostPool dst;
  dst.g = src.g;
  dst.g.dtype = src.g.dtype == KvDtype::bf16 ? KvDtype::fp8_e4m3 : KvDtype::int8;
  dst.layout = src.layout == KvLayout::page_major ? KvLayout::layer_major : KvLayout::page_major;
  dst.num_pages = 6;
  dst.stride = page_data_bytes(dst.g);
  dst.mem.assign(dst.bytes(), std::byte{0});
  dst.scales.assign(dst.num_pages * page_scale_bytes(dst.g) / sizeof(float), 0.0f);
  const std::string name = "convert " + what + " to " + std::string(dtype_name(dst.g.dtype)) + " " +
                           std::string(layout_name(dst.layout));
  const std::vector<PageId> from{3, 4}, to{5, 0};
  const std::vector<std::byte> zero = dst.mem;
  const std::vector<float> zero_scales = dst.scales;
  ConvertPagesArgs cc{src.view(), dst.view(), 2, from.data(), to.data()};
  if (const std::string e = cpu::convert_pages(cc, src.num_pages, dst.num_pages); !e.empty())
    return error("reference " + name, e);
  // The target's source starts from the CPU's bytes, so a wrong copy before leaves this alone.
  buf.note(t_.upload(on_target.base, src.mem.data(), src.mem.size()));
  ConvertPagesArgs dc = cc;
  dc.src = on_target;
  dc.dst.base = buf.put(zero);
  dc.dst.scales = buf.put(zero_scales);
  dc.src_pages = buf.put(from);
  dc.dst_pages = buf.put(to);
  std::string err = buf.error();
  if (err.empty()) err = t_.convert_pages(dc, src.num_pages, dst.num_pages);
  if (err.empty()) err = t_.synchronize();
  std::vector<std::byte> got(zero.size());
  std::vector<float> got_scales(zero_scales.size());
  if (err.empty()) {
    buf.get(got, static_cast<const std::byte*>(dc.dst.base));
    buf.get(got_scales, dc.dst.scales);
    err = buf.error();
  }
  if (!err.empty()) return error(name, err);
  const bool same = got == dst.mem && got_scales == dst.scales;
  result(same, name + (same ? ": bytes and scales identical to the CPU conversion"
                            : ": bytes or scales differ from the CPU conversion"));
}

std::vector<Case> matrix_cases() {
  std::vector<Case> cases;
  constexpr uint32_t kNoSplit = 1u << 20;
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    // Every dtype × head dim × group bucket × page size; contexts around page boundaries (ragged
    // last pages) and across several tiles; the planned split and none.
    for (uint32_t d : {64u, 128u, 256u}) {
      for (uint32_t grp : {1u, 4u, 8u}) {
        for (uint32_t t : {8u, 16u, 32u}) {
          cases.push_back(
              {dt, d, grp, t, {1, t - 1, t, t + 1, 3 * t + 5, 300, 1000}, {0, kNoSplit}});
        }
      }
    }
    // Groups that pad their bucket (2 → 4, 3 → 4, 5 → 8).
    cases.push_back({dt, 64, 2, 16, {1, 17, 333}, {0, kNoSplit}});
    cases.push_back({dt, 256, 3, 8, {9, 100}, {0, kNoSplit}});
    cases.push_back({dt, 128, 5, 32, {31, 65}, {0, kNoSplit}});
    // Long contexts with forced splits: chunks of one page, of a few tiles, planned, none.
    cases.push_back({dt, 128, 4, 8, {2049, 5, 4096}, {8, 256, 0, kNoSplit}});
    cases.push_back({dt, 128, 8, 32, {3000, 1}, {32, 96, 0}});
    cases.push_back({dt, 64, 1, 16, {5000}, {16, 0}});
    // layer_major: every head dim and group bucket, ragged pages, splits.
    for (uint32_t d : {64u, 128u, 256u}) {
      for (uint32_t grp : {1u, 4u, 8u}) {
        cases.push_back({dt,
                         d,
                         grp,
                         16,
                         {1, 15, 16, 17, 53, 300, 1000},
                         {0, 32, kNoSplit},
                         KvLayout::layer_major});
      }
    }
    cases.push_back({dt, 128, 3, 8, {9, 2049}, {8, 0}, KvLayout::layer_major});
    // Attention shapes: groups wider than a CTA's 8 heads (Qwen3-235B's 16, Falcon-7B's 71),
    // sliding windows ending inside a page and wider than the context, chunks, sinks, in both
    // layouts and with splits before the window.
    cases.push_back({dt, 128, 16, 16, {1, 40, 700}, {0, 64, kNoSplit}});
    cases.push_back({dt, 64, 71, 16, {3, 90}, {0, kNoSplit}, KvLayout::layer_major});
    cases.push_back(
        {dt, 128, 4, 16, {1, 20, 33, 600, 3000}, {0, 64, kNoSplit}, KvLayout::page_major, 19});
    cases.push_back({dt, 64, 8, 8, {5, 1000}, {16, 0}, KvLayout::layer_major, 4095});
    cases.push_back({dt, 256, 2, 32, {31, 500}, {0, kNoSplit}, KvLayout::page_major, -1, 64});
    cases.push_back({dt, 128, 8, 16, {7, 130, 2000}, {32, 0}, KvLayout::layer_major, 127, 0, true});
    cases.push_back({dt, 64, 1, 16, {1, 77}, {0}, KvLayout::page_major, -1, 0, true});
    // Wide groups with the mask: decode in 3 slices and extend in 2 with a window, sinks and
    // split chunks wholly before the window; Falcon's 71 with a window and a chunk, split.
    cases.push_back(
        {dt, 256, 24, 16, {1, 40, 700}, {0, 64, kNoSplit}, KvLayout::page_major, 19, 0, true});
    cases.push_back({dt, 64, 71, 16, {90, 600}, {64}, KvLayout::layer_major, 200, 64, true});
    // Latent (MLA) pools: DeepSeek-V3's 576 = 512 + 64 with 16 and 128 query heads (one GPU at
    // TP 8, all), 64-token pages as FlashMLA pages them, both layouts; a small one with a window.
    cases.push_back(
        {dt, 576, 16, 64, {1, 63, 64, 65, 700}, {0}, KvLayout::page_major, -1, 0, false, 512});
    cases.push_back({dt, 576, 128, 64, {5, 300}, {0}, KvLayout::layer_major, -1, 0, false, 512});
    cases.push_back({dt, 64, 3, 16, {9, 200}, {0}, KvLayout::page_major, 20, 0, true, 48});
    // A partial last slice of 16 heads (40 = 16 + 16 + 8) with a chunk and sinks.
    cases.push_back({dt, 576, 40, 64, {70, 300}, {0}, KvLayout::layer_major, -1, 128, true, 512});
    // Segmented layer_major (elastic pools): sequences cross segments of 5 and 3 pages with a
    // block of slack between them; splits, a window with sinks, a latent pool.
    cases.push_back({dt,
                     128,
                     4,
                     16,
                     {1, 17, 300, 1000},
                     {0, 32, kNoSplit},
                     KvLayout::layer_major,
                     -1,
                     0,
                     false,
                     0,
                     5});
    cases.push_back({dt, 64, 8, 8, {9, 500}, {16, 0}, KvLayout::layer_major, 63, 0, true, 0, 3});
    cases.push_back({dt, 576, 16, 64, {65, 300}, {0}, KvLayout::layer_major, -1, 0, false, 512, 3});
  }
  // Mixed precision: older halves in 8 bits of the other layout; one-page splits (a chunk per
  // page, so chunks fall on both sides of the boundary), straddling splits, planned and none; a
  // window with sinks; a wide group; a sequence shorter than a page (its one block older); latent
  // pools.
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp16}) {
    std::vector<Case> mixed{
        {dt, 128, 4, 16, {1, 17, 300, 1000}, {16, 40, 0, kNoSplit}},
        {dt, 64, 8, 8, {9, 2049}, {8, 0}, KvLayout::layer_major, 127, 0, true},
        {dt, 256, 1, 32, {33, 500}, {0, kNoSplit}},
        {dt, 128, 16, 16, {40, 700}, {0, 64}, KvLayout::layer_major},
        {dt, 64, 4, 16, {3000, 5}, {0, 256}, KvLayout::page_major, -1, 64, true},
        // Latent (MLA) pools: DeepSeek-V3's vector on 64-token pages, and a small one with a
        // window and sinks.
        {dt, 576, 16, 64, {1, 65, 700}, {0}, KvLayout::page_major, -1, 0, false, 512},
        {dt, 64, 3, 16, {9, 200}, {0}, KvLayout::layer_major, 20, 0, true, 48}};
    for (size_t i = 0; i < mixed.size(); ++i) {
      mixed[i].mixed = true;
      mixed[i].other_older = i % 2 == 1;
      cases.push_back(std::move(mixed[i]));
    }
  }
  return cases;
}

// The CPU stand-in ---------------------------------------------------------------------------

class CpuStandIn final : public KernelTarget {
 public:
  explicit CpuStandIn(Fault fault) : fault_(fault) {}
  std::string name() const override { return "CPU kernels standing in for CUDA"; }

  std::string alloc(void** ptr, size_t bytes) override {
    *ptr = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    return *ptr != nullptr ? "" : "out of host memory";
  }
  void release(void* ptr) override { std::free(ptr); }
  std::string upload(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  std::string download(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return {};
  }
  std::string fill(void* dst, int byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
    return {};
  }
  std::string synchronize() override { return {}; }

  size_t decode_workspace_bytes(const DecodeArgs&, uint32_t) override { return 0; }
  std::string decode(const DecodeArgs& a, uint32_t, uint32_t num_pages, void*, size_t) override {
    DecodeArgs b = a;
    std::vector<uint32_t> lens;
    if (fault_ == Fault::decode) b.context_lens = shorter(a.context_lens, a.num_seqs, lens);
    const bool portable = a.kv.geometry.head_dim % 8 == 0;
    return cpu::decode(b, num_pages, 0, portable ? cpu::Isa::baseline : cpu::Isa::automatic);
  }
  std::string extend(const ExtendArgs& a, uint32_t, uint32_t num_pages) override {
    ExtendArgs b = a;
    std::vector<uint32_t> lens;
    if (fault_ == Fault::extend) b.context_lens = shorter(a.context_lens, a.num_seqs, lens);
    return cpu::extend(b, num_pages);
  }
  std::string append_kv(const AppendArgs& a, uint32_t num_pages) override {
    AppendArgs b = a;
    std::vector<int64_t> slots;
    if (fault_ == Fault::append) {
      const int64_t end = int64_t{num_pages} * a.kv.geometry.tokens_per_page;
      slots.assign(a.slots, a.slots + a.num_tokens);
      for (int64_t& s : slots) {
        if (s >= 0 && s + 1 < end) ++s;
      }
      b.slots = slots.data();
    }
    return cpu::append_kv(b, num_pages);
  }
  std::string copy_pages(const CopyPagesArgs& a, uint32_t num_pages) override {
    CopyPagesArgs b = a;
    std::vector<PageId> dst;
    if (fault_ == Fault::copy) {
      dst.assign(a.dst, a.dst + a.num_pairs);
      for (PageId& p : dst)
        p = (p + 1) % num_pages;
      b.dst = dst.data();
    }
    return cpu::copy_pages(b, num_pages);
  }
  std::string convert_pages(const ConvertPagesArgs& a, uint32_t src_pages,
                            uint32_t dst_pages) override {
    ConvertPagesArgs b = a;
    std::vector<PageId> dst;
    if (fault_ == Fault::convert) {
      dst.assign(a.dst_pages, a.dst_pages + a.num_pairs);
      for (PageId& p : dst)
        p = (p + 1) % dst_pages;
      b.dst_pages = dst.data();
    }
    return cpu::convert_pages(b, src_pages, dst_pages);
  }

 private:
  // The longest context of the call, one token short: the smallest error a real off-by-one
  // makes (one key of up to 5,000 missing from one sequence's softmax).
  static const uint32_t* shorter(const uint32_t* lens, uint32_t n, std::vector<uint32_t>& out) {
    out.assign(lens, lens + n);
    auto longest = std::max_element(out.begin(), out.end());
    if (longest != out.end() && *longest > 1) --*longest;
    return out.data();
  }

  Fault fault_;
};

}  // namespace

bool parse_fault(const std::string& text, Fault& out) {
  static constexpr std::pair<const char*, Fault> kNames[] = {
      {"none", Fault::none},     {"decode", Fault::decode}, {"extend", Fault::extend},
      {"append", Fault::append}, {"copy", Fault::copy},     {"convert", Fault::convert}};
  for (const auto& [name, fault] : kNames) {
    if (text == name) {
      out = fault;
      return true;
    }
  }
  return false;
}

std::unique_ptr<KernelTarget> make_cpu_stand_in(Fault fault) {
  return std::make_unique<CpuStandIn>(fault);
}

int run_kernel_matrix(KernelTarget& target, bool verbose, const MatrixSelection& selection) {
  Matrix m(target, verbose);
  const std::vector<KvDtype>& dtypes = selection.dtypes;
  const auto wanted = [&](KvDtype dt) {
    return dtypes.empty() || std::find(dtypes.begin(), dtypes.end(), dt) != dtypes.end();
  };
  std::printf("kernel check on %s\n", target.name().c_str());
  uint32_t index = 0;
  for (const Case& c : matrix_cases()) {
    if (wanted(c.dtype) && index++ % std::max(1u, selection.sample) == 0) m.run_case(c);
  }
  for (KvDtype dt : {KvDtype::bf16, KvDtype::fp16, KvDtype::fp8_e4m3, KvDtype::int8}) {
    if (!wanted(dt)) continue;
    for (KvLayout layout : {KvLayout::page_major, KvLayout::layer_major}) {
      m.run_append_case(dt, layout, false);
      m.run_append_case(dt, layout, true);
    }
    m.run_append_case(dt, KvLayout::layer_major, false, 3);
    m.run_append_case(dt, KvLayout::layer_major, true, 3);
  }
  if (m.failures() == 0) {
    std::printf("GPU TESTS PASSED: %d comparisons\n", m.comparisons());
  } else {
    std::printf("GPU TESTS FAILED: %d of %d comparisons\n", m.failures(), m.comparisons());
  }
  std::fflush(stdout);
  return m.failures();
}

}  // namespace kvpool::gpu_check

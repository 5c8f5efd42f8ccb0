// Append-KV on the CPU: writes each token's K and V rows, for every KV head of one layer, into its
// page slot (kernels/paged_kv.h, AppendArgs), in either layout: rows are addressed through
// kv_strides, and a head's earlier rows of a page (re-quantisation) are st.token bytes apart. A
// latent pool's token has one row per layer (its K, the vector [c, k_rope]) and no V.
//
// Everything is validated before the first byte is written, so an error leaves the pool as it
// was. Slots of −1 are dropped; the others must lie in [0, num_pages · T) and be distinct. The
// tokens are then handled in ascending slot order, which is slot order within every page.
//
// 16-bit pools: each element is converted (kernels/kv_dtype.h) and stored.
// 8-bit pools, per (page, layer, KV head, K|V), token by token (off = its offset in the page,
// m = max |x| over its row with NaN ignored, R = kInt8Max or kFp8Max, old = the stored scale):
//   off == 0 or !(old > 0):  scale = max(m, kMinAmax) / R   (a previous owner's scale is ignored;
//                                                             kMinAmax keeps it positive)
//   m > old · R:             scale = m / R, and the rows [0, off) are re-quantised:
//                            x̂ ← q(deq(x̂) · old, 1 / scale)
//   otherwise:               scale = old
// then the row is stored as q(x, 1 / scale): f32_to_int8(x, inv) or f32_to_fp8_e4m3(x · inv).
// A scale therefore never falls while a page fills, and every stored row decodes to within half
// a quantisation step of the scale that was current when it was (re-)quantised. This is the same
// arithmetic, operation for operation, as the CUDA kernel, so the two agree bit for bit when
// the tokens of a page arrive in slot order. K and V are expected finite: a NaN is stored as
// NaN (fp8) or 0 (int8) without affecting the scale, but an infinity makes the scale infinite.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/attention_common.h"
#include "kernels/cpu/kernels_cpu.h"
#include "kernels/kv_dtype.h"

namespace kvpool::kernels::cpu {

namespace {

struct Item {
  uint64_t slot;
  uint32_t token;
};

uint8_t quantize(KvDtype dtype, float x, float inv_scale) {
  if (dtype == KvDtype::int8) return static_cast<uint8_t>(f32_to_int8(x, inv_scale));
  return f32_to_fp8_e4m3(x * inv_scale);
}

float dequantize(KvDtype dtype, uint8_t v) {
  if (dtype == KvDtype::int8) return int8_to_f32(static_cast<int8_t>(v));
  return fp8_e4m3_to_f32(v);
}

// Writes the rows of one token (all KV heads of `layer`, K and V) of a 16-bit pool.
void store16(const AppendArgs& a, const KvStrides& st, uint64_t page_id, uint32_t off,
             uint32_t token) {
  const Geometry& g = a.kv.geometry;
  const bool fp16 = g.dtype == KvDtype::fp16;
  auto* base = static_cast<uint8_t*>(a.kv.base);
  for (uint32_t h = 0; h < g.kv_heads; ++h) {
    const uint64_t src = (uint64_t{token} * g.kv_heads + h) * g.head_dim;
    for (uint32_t is_v = 0; is_v < kv_planes(g); ++is_v) {
      const float* x = (is_v ? a.v : a.k) + src;
      uint8_t* dst = base + st.row(page_id, a.layer, h, off, is_v);
      for (uint32_t d = 0; d < g.head_dim; ++d) {
        const uint16_t e = fp16 ? f32_to_fp16(x[d]) : f32_to_bf16(x[d]);
        std::memcpy(dst + uint64_t{d} * 2, &e, 2);  // the pool need not be 2-byte aligned
      }
    }
  }
}

// Writes the rows of one token of an 8-bit pool, updating the page's scales (rules above).
void store8(const AppendArgs& a, const KvStrides& st, uint64_t page_id, uint32_t off,
            uint32_t token) {
  const Geometry& g = a.kv.geometry;
  const float range = g.dtype == KvDtype::int8 ? kInt8Max : kFp8Max;
  auto* base = static_cast<uint8_t*>(a.kv.base);
  for (uint32_t h = 0; h < g.kv_heads; ++h) {
    const uint64_t src = (uint64_t{token} * g.kv_heads + h) * g.head_dim;
    for (uint32_t is_v = 0; is_v < kv_planes(g); ++is_v) {
      const float* x = (is_v ? a.v : a.k) + src;
      uint8_t* row0 = base + st.row(page_id, a.layer, h, 0, is_v);
      float& scale = a.kv.scales[scale_index(g, page_id, a.layer, h, is_v != 0)];

      float m = 0.0f;
      for (uint32_t d = 0; d < g.head_dim; ++d)
        m = std::fmax(m, std::fabs(x[d]));
      const float old = scale;
      float sc;
      if (off == 0 || !(old > 0.0f)) {
        sc = std::fmax(m, kMinAmax) / range;
      } else if (m > old * range) {
        sc = m / range;
      } else {
        sc = old;
      }
      const float inv = 1.0f / sc;
      if (off != 0 && sc != old) {
        // Rows [0, off) of this head: one run in page_major, st.token apart in layer_major.
        for (uint32_t r = 0; r < off; ++r) {
          uint8_t* prev = row0 + r * st.token;
          for (uint32_t e = 0; e < g.head_dim; ++e)
            prev[e] = quantize(g.dtype, dequantize(g.dtype, prev[e]) * old, inv);
        }
      }
      uint8_t* row = row0 + off * st.token;
      for (uint32_t d = 0; d < g.head_dim; ++d)
        row[d] = quantize(g.dtype, x[d], inv);
      scale = sc;
    }
  }
}

}  // namespace

std::string append_kv(const AppendArgs& args, uint32_t num_pages) {
  const Geometry& g = args.kv.geometry;
  if (std::string e = validate(g); !e.empty()) return "append_kv: geometry: " + e;
  if (args.layer >= g.layers) {
    return "append_kv: layer " + std::to_string(args.layer) +
           " out of range (layers = " + std::to_string(g.layers) + ")";
  }
  if (args.num_tokens == 0) return {};
  if (args.k == nullptr) return "append_kv: k is null";
  if (g.kind == AttentionKind::latent) {
    if (args.v != nullptr) {
      return "append_kv: v is given for a latent pool, which keeps one vector per token (pass it "
             "as k)";
    }
  } else if (args.v == nullptr) {
    return "append_kv: v is null";
  }
  if (args.slots == nullptr) return "append_kv: slots is null";
  if (args.kv.base == nullptr) return "append_kv: kv.base is null";
  if (args.kv.layout == KvLayout::page_major && args.kv.page_stride < page_data_bytes(g)) {
    return "append_kv: kv.page_stride " + std::to_string(args.kv.page_stride) +
           " is below the page size " + std::to_string(page_data_bytes(g));
  }
  if (std::string e = detail::check_layout(args.kv, num_pages); !e.empty()) {
    return "append_kv: " + e;
  }
  const bool quantized = dtype_is_quantized(g.dtype);
  if (quantized && args.kv.scales == nullptr) {
    return "append_kv: kv.scales is null for an 8-bit pool";
  }

  const uint64_t num_slots = uint64_t{num_pages} * g.tokens_per_page;
  std::vector<Item> items;
  items.reserve(args.num_tokens);
  for (uint32_t t = 0; t < args.num_tokens; ++t) {
    const int64_t s = args.slots[t];
    if (s == -1) continue;
    if (s < 0 || static_cast<uint64_t>(s) >= num_slots) {
      return "append_kv: token " + std::to_string(t) + ": slot " + std::to_string(s) +
             " out of range (num_pages · tokens_per_page = " + std::to_string(num_slots) +
             "; -1 skips)";
    }
    items.push_back({static_cast<uint64_t>(s), t});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& x, const Item& y) { return x.slot < y.slot; });
  for (size_t i = 1; i < items.size(); ++i) {
    if (items[i].slot == items[i - 1].slot) {
      return "append_kv: tokens " + std::to_string(items[i - 1].token) + " and " +
             std::to_string(items[i].token) + " both write slot " + std::to_string(items[i].slot);
    }
  }

  const KvStrides strides = kv_strides(args.kv);
  for (const Item& it : items) {
    const uint64_t page_id = it.slot / g.tokens_per_page;
    const auto off = static_cast<uint32_t>(it.slot % g.tokens_per_page);
    if (quantized) {
      store8(args, strides, page_id, off, it.token);
    } else {
      store16(args, strides, page_id, off, it.token);
    }
  }
  return {};
}

}  // namespace kvpool::kernels::cpu

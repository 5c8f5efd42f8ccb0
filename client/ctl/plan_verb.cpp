// kvpoolctl plan: KV-cache bytes for a model geometry and context (GQA aware), the pool pages
// that holds, and how many such sequences a capacity fits; with --models, for every model of a
// models.yaml-style file, hybrid (sliding + full), chunked and latent (MLA) ones included
// (common/kv_plan.h), against what every layer keeping full K/V would take. No daemon needed.
#include <string>
#include <vector>

#include "client/ctl/common.h"
#include "client/ctl/model_file.h"
#include "common/geometry.h"
#include "common/kv_plan.h"

namespace kvpool::ctl {
namespace {

// --capacity in binary units (80GiB, 512MiB), decimal GB/TB, or plain bytes; "" = none (0).
// False, with the error printed, when it is not a positive size.
bool parse_capacity(const std::string& text, uint64_t& capacity) {
  capacity = 0;
  if (text.empty()) return true;
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || !(v > 0) || v > 1e30) {
    std::fprintf(stderr, "kvpoolctl plan: --capacity %s is not a positive size like 80GiB\n",
                 display_text(text).c_str());
    return false;
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ')
    unit.erase(0, 1);
  double mult = 1;
  if (unit == "KiB")
    mult = 1024.0;
  else if (unit == "MiB")
    mult = 1024.0 * 1024;
  else if (unit == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "GB")
    mult = 1e9;
  else if (unit == "TB")
    mult = 1e12;
  else if (!unit.empty() && unit != "B") {
    std::fprintf(stderr,
                 "kvpoolctl plan: --capacity %s: unit must be B, KiB, MiB, GiB, TiB, GB or TB\n",
                 display_text(text).c_str());
    return false;
  }
  capacity = static_cast<uint64_t>(v * mult);
  return true;
}

// The kinds of a model's groups, once each in order: "sliding+full".
std::string kinds_of(const ModelShape& m) {
  std::string out;
  for (const LayerGroup& g : m.groups) {
    const std::string k(attention_kind_name(g.kind));
    if (out.find(k) != std::string::npos) continue;
    out += (out.empty() ? "" : "+") + k;
  }
  return out;
}

// kvpoolctl plan --models FILE: every model (or --model's) at --tokens.
int plan_models(const Globals& g, const PlanArgs& a, KvDtype dtype, uint64_t capacity) {
  std::vector<ModelShape> models;
  if (const std::string e = load_model_file(a.models, models); !e.empty()) {
    std::fprintf(stderr, "kvpoolctl plan: %s\n", e.c_str());
    return 2;
  }
  if (!a.model.empty()) {
    std::erase_if(models, [&](const ModelShape& m) { return m.name != a.model; });
    if (models.empty()) {
      std::fprintf(stderr, "kvpoolctl plan: no model named %s in %s\n",
                   display_text(a.model).c_str(), display_text(a.models).c_str());
      return 2;
    }
  }
  const std::string dt(dtype_name(dtype));
  if (g.json) {
    std::string rows;
    for (const ModelShape& m : models) {
      const KvPlan p = plan_sequence(m.groups, a.tokens, a.tokens_per_page, dtype);
      if (!rows.empty()) rows += ',';
      rows += "{\"name\":\"" + json_escape(m.name) + "\",\"kinds\":\"" + kinds_of(m) +
              "\",\"layers\":" + std::to_string(m.layers) +
              ",\"bytes_per_token\":" + std::to_string(p.bytes_per_token_all_layers) +
              ",\"bytes_per_sequence\":" + std::to_string(p.bytes) +
              ",\"full_kv_bytes_per_sequence\":" + std::to_string(p.full_kv_bytes) +
              ",\"sequences_that_fit\":" + std::to_string(capacity ? capacity / p.bytes : 0) + "}";
    }
    std::printf(
        "{\"schema\":%d,\"tokens\":%u,\"dtype\":\"%s\",\"tokens_per_page\":%u,"
        "\"capacity_bytes\":%llu,\"models\":[%s]}\n",
        kSchema, a.tokens, dt.c_str(), a.tokens_per_page, static_cast<unsigned long long>(capacity),
        rows.c_str());
    return 0;
  }
  std::printf("KV cache per sequence of %s tokens, %s, pages of %u tokens:\n",
              count_text(a.tokens, g.raw).c_str(), dt.c_str(), a.tokens_per_page);
  std::printf("  %-24s %-14s %12s %14s %16s %7s", "model", "attention", "per token", "per sequence",
              "all full K/V", "ratio");
  std::printf(capacity ? " %10s\n" : "\n", "fit");
  for (const ModelShape& m : models) {
    const KvPlan p = plan_sequence(m.groups, a.tokens, a.tokens_per_page, dtype);
    std::printf("  %-24s %-14s %12s %14s %16s %7.3f", display_text(m.name).c_str(),
                kinds_of(m).c_str(), bytes_text(p.bytes_per_token_all_layers, g.raw).c_str(),
                bytes_text(p.bytes, g.raw).c_str(), bytes_text(p.full_kv_bytes, g.raw).c_str(),
                static_cast<double>(p.bytes) / static_cast<double>(p.full_kv_bytes));
    if (capacity) std::printf(" %10s", count_text(capacity / p.bytes, g.raw).c_str());
    std::printf("\n");
  }
  std::printf(
      "  (per sequence: what the pool holds, windows and chunks in whole pages; all full "
      "K/V: every layer keeping K and V of every token)\n");
  return 0;
}

}  // namespace

int plan_verb(const Globals& g, const PlanArgs& a) {
  const auto dtype = kvpool::parse_dtype(a.dtype);
  if (!dtype) {
    std::fprintf(stderr, "kvpoolctl plan: --dtype %s is not fp16, bf16, fp8_e4m3 or int8\n",
                 display_text(a.dtype).c_str());
    return 2;
  }
  if (!a.models.empty()) {
    uint64_t capacity = 0;
    if (!parse_capacity(a.capacity, capacity)) return 2;
    return plan_models(g, a, *dtype, capacity);
  }
  if (a.layers == 0 || a.kv_heads == 0 || a.head_dim == 0) {
    std::fprintf(stderr,
                 "kvpoolctl plan: layers, kv_heads and head_dim must be at least 1: give --layers, "
                 "--kv-heads and --head-dim, or --models FILE\n");
    return 2;
  }
  const kvpool::Geometry geo{a.layers, a.kv_heads, a.head_dim, a.tokens_per_page, *dtype};
  if (const std::string e = kvpool::validate(geo); !e.empty()) {
    std::fprintf(stderr, "kvpoolctl plan: %s\n", e.c_str());
    return 2;
  }
  const uint64_t per_token = kvpool::kv_bytes_per_token(geo);
  const uint64_t per_seq = kvpool::kv_bytes(geo, a.tokens);
  const uint64_t pages = kvpool::pages_for_tokens(geo, a.tokens);
  const uint64_t page_bytes = kvpool::page_data_bytes(geo) + kvpool::page_scale_bytes(geo);
  const uint64_t pool_per_seq = pages * page_bytes;
  uint64_t capacity = 0;
  if (!parse_capacity(a.capacity, capacity)) return 2;
  const uint64_t fit = capacity ? capacity / pool_per_seq : 0;
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"layers\":%u,\"kv_heads\":%u,\"head_dim\":%u,\"dtype\":\"%s\","
        "\"tokens\":%u,\"batch\":%u,\"tokens_per_page\":%u,\"bytes_per_token\":%llu,"
        "\"bytes_per_sequence\":%llu,\"bytes_per_batch\":%llu,\"pages_per_sequence\":%llu,"
        "\"page_bytes\":%llu,\"pool_bytes_per_sequence\":%llu,\"capacity_bytes\":%llu,"
        "\"sequences_that_fit\":%llu}\n",
        kSchema, a.layers, a.kv_heads, a.head_dim, std::string(kvpool::dtype_name(*dtype)).c_str(),
        a.tokens, a.batch, a.tokens_per_page, static_cast<unsigned long long>(per_token),
        static_cast<unsigned long long>(per_seq),
        static_cast<unsigned long long>(per_seq * a.batch), static_cast<unsigned long long>(pages),
        static_cast<unsigned long long>(page_bytes), static_cast<unsigned long long>(pool_per_seq),
        static_cast<unsigned long long>(capacity), static_cast<unsigned long long>(fit));
    return 0;
  }
  std::printf("KV cache of %u layers x %u KV heads x head dim %u, %s:\n", a.layers, a.kv_heads,
              a.head_dim, std::string(kvpool::dtype_name(*dtype)).c_str());
  std::printf("  per token     %s\n", bytes_text(per_token, g.raw).c_str());
  std::printf("  per sequence  %s for %s tokens\n", bytes_text(per_seq, g.raw).c_str(),
              count_text(a.tokens, g.raw).c_str());
  if (a.batch > 1) {
    std::printf("  per batch     %s for %u sequences\n",
                bytes_text(per_seq * a.batch, g.raw).c_str(), a.batch);
  }
  std::printf("  in the pool   %s pages of %u tokens (%s each) = %s per sequence\n",
              count_text(pages, g.raw).c_str(), a.tokens_per_page,
              bytes_text(page_bytes, g.raw).c_str(), bytes_text(pool_per_seq, g.raw).c_str());
  if (capacity) {
    std::printf("  capacity      %s holds %s such sequences\n", bytes_text(capacity, g.raw).c_str(),
                count_text(fit, g.raw).c_str());
  }
  return 0;
}

}  // namespace kvpool::ctl

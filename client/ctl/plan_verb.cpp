// kvpoolctl plan: KV-cache bytes for a model geometry and context (GQA aware), the pool pages
// that holds, and how many such sequences a capacity fits. No daemon needed.
#include <string>

#include "client/ctl/common.h"
#include "common/geometry.h"

namespace kvpool::ctl {

int plan_verb(const Globals& g, const PlanArgs& a) {
  const auto dtype = kvpool::parse_dtype(a.dtype);
  if (!dtype) {
    std::fprintf(stderr, "kvpoolctl plan: --dtype %s is not fp16, bf16, fp8_e4m3 or int8\n",
                 display_text(a.dtype).c_str());
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
  if (!a.capacity.empty()) {
    // Binary units only here: 80GiB, 512MiB, or plain bytes.
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(a.capacity, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || !(v > 0) || v > 1e30) {
      std::fprintf(stderr, "kvpoolctl plan: --capacity %s is not a positive size like 80GiB\n",
                   display_text(a.capacity).c_str());
      return 2;
    }
    std::string unit = a.capacity.substr(used);
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
                   display_text(a.capacity).c_str());
      return 2;
    }
    capacity = static_cast<uint64_t>(v * mult);
  }
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

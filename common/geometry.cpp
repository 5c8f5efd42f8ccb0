#include "common/geometry.h"

#include <limits>

namespace kvpool {

std::string_view dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::fp16:
      return "fp16";
    case KvDtype::bf16:
      return "bf16";
    case KvDtype::fp8_e4m3:
      return "fp8_e4m3";
    case KvDtype::int8:
      return "int8";
  }
  return "unknown";
}

std::optional<KvDtype> parse_dtype(std::string_view name) {
  if (name == "fp16" || name == "float16" || name == "half") return KvDtype::fp16;
  if (name == "bf16" || name == "bfloat16") return KvDtype::bf16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "fp8-e4m3") return KvDtype::fp8_e4m3;
  if (name == "int8") return KvDtype::int8;
  return std::nullopt;
}

std::string_view layout_name(KvLayout l) {
  switch (l) {
    case KvLayout::page_major:
      return "page_major";
    case KvLayout::layer_major:
      return "layer_major";
  }
  return "unknown";
}

std::optional<KvLayout> parse_layout(std::string_view name) {
  if (name == "page_major") return KvLayout::page_major;
  if (name == "layer_major") return KvLayout::layer_major;
  return std::nullopt;
}

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::full:
      return "full";
    case AttentionKind::sliding:
      return "sliding";
    case AttentionKind::chunked:
      return "chunked";
    case AttentionKind::latent:
      return "latent";
  }
  return "unknown";
}

std::optional<AttentionKind> parse_attention_kind(std::string_view name) {
  for (AttentionKind k : {AttentionKind::full, AttentionKind::sliding, AttentionKind::chunked,
                          AttentionKind::latent}) {
    if (attention_kind_name(k) == name) return k;
  }
  return std::nullopt;
}

std::string validate(const Geometry& g) {
  if (g.layers == 0) return "layers must be at least 1";
  if (g.kv_heads == 0) return "kv_heads must be at least 1";
  if (g.head_dim == 0) return "head_dim must be at least 1";
  if (g.tokens_per_page == 0) return "tokens_per_page must be at least 1";
  switch (g.dtype) {
    case KvDtype::fp16:
    case KvDtype::bf16:
    case KvDtype::fp8_e4m3:
    case KvDtype::int8:
      break;
    default:
      return "dtype is not one of fp16, bf16, fp8_e4m3, int8";
  }
  switch (g.kind) {
    case AttentionKind::full:
      if (g.window != 0) {
        return "window " + std::to_string(g.window) +
               " is set on a full-attention geometry (a window needs kind sliding or chunked)";
      }
      break;
    case AttentionKind::sliding:
    case AttentionKind::chunked:
      if (g.window == 0) {
        return "window must be at least 1 token for kind " +
               std::string(attention_kind_name(g.kind));
      }
      break;
    case AttentionKind::latent:
      if (g.kv_heads != 1) {
        return "kv_heads " + std::to_string(g.kv_heads) +
               " on a latent geometry: an MLA cache holds one vector per token and layer "
               "(kv_heads 1, head_dim = latent width + rotary width, e.g. 512 + 64)";
      }
      if (g.window != 0) {
        return "window " + std::to_string(g.window) + " is set on a latent geometry (no window)";
      }
      break;
    default:
      return "kind is not one of full, sliding, chunked, latent";
  }
  // Keep a page below 2^40 bytes (1 TiB) so that page arithmetic for any token count below 2^32
  // stays far from uint64 overflow. Each factor is below 2^32, so check the running product.
  constexpr uint64_t kMaxPageBytes = uint64_t{1} << 40;
  uint64_t bytes = uint64_t{kv_planes(g)} * dtype_bytes(g.dtype);
  for (uint64_t f : {uint64_t{g.layers}, uint64_t{g.kv_heads}, uint64_t{g.head_dim},
                     uint64_t{g.tokens_per_page}}) {
    if (bytes > kMaxPageBytes / f) return "page size exceeds 1 TiB";
    bytes *= f;
  }
  return {};
}

}  // namespace kvpool

// The C API's block hashing (client/capi/kvpool.h) over kvpool::BlockHasher: one hasher per thread,
// made on first use, so the calls are thread-safe without a handle.

#include <cstring>
#include <string>

#include "client/capi/kvpool.h"
#include "common/block_hash.h"
#include "common/status.h"
#include "common/vllm_block_hash.h"

namespace {

static_assert(sizeof(kvpool_hash) == sizeof(kvpool::BlockHash));

thread_local std::string hash_error;

kvpool::BlockHasher& hasher() {
  thread_local kvpool::BlockHasher h;
  return h;
}

int refuse(std::string why) {
  hash_error = std::move(why);
  return static_cast<int>(kvpool::Errc::invalid_argument);
}

kvpool::BlockHash from_c(const kvpool_hash& h) {
  return kvpool::BlockHash{h.lo, h.hi};
}
kvpool_hash to_c(const kvpool::BlockHash& h) {
  return kvpool_hash{h.lo, h.hi};
}

}  // namespace

extern "C" {

const char* kvpool_error_name(int code) {
  if (code < 0 || code > UINT16_MAX) return "unknown_error";
  // errc_name's views are of string literals, so the pointer stays valid and NUL-terminated.
  return kvpool::errc_name(static_cast<kvpool::Errc>(code)).data();
}

int kvpool_hash_root(const char* model_id, const kvpool_geometry* geometry, const char* adapter_id,
                     const char* salt, kvpool_hash* out) {
  return kvpool_hash_root_attention(model_id, geometry, KVPOOL_ATTENTION_FULL, 0, adapter_id, salt,
                                    out);
}

int kvpool_hash_root_attention(const char* model_id, const kvpool_geometry* geometry, uint8_t kind,
                               uint32_t window, const char* adapter_id, const char* salt,
                               kvpool_hash* out) {
  if (model_id == nullptr || geometry == nullptr || out == nullptr) {
    return refuse("kvpool_hash_root: model_id, geometry and out must not be NULL");
  }
  if (geometry->dtype > static_cast<uint8_t>(kvpool::KvDtype::int8)) {
    return refuse("kvpool_hash_root: dtype " + std::to_string(geometry->dtype) +
                  " is not a KV dtype (0 fp16, 1 bf16, 2 fp8_e4m3, 3 int8)");
  }
  if (kind > KVPOOL_ATTENTION_LATENT) {
    return refuse("kvpool_hash_root: kind " + std::to_string(kind) +
                  " is not an attention kind (0 full, 1 sliding, 2 chunked, 3 latent)");
  }
  const kvpool::Geometry g{geometry->layers,
                           geometry->kv_heads,
                           geometry->head_dim,
                           geometry->tokens_per_page,
                           static_cast<kvpool::KvDtype>(geometry->dtype),
                           static_cast<kvpool::AttentionKind>(kind),
                           window};
  if (std::string why = kvpool::validate(g); !why.empty()) {
    return refuse("kvpool_hash_root: " + why);
  }
  const kvpool::ModelIdentity id{model_id, g, adapter_id != nullptr ? adapter_id : "",
                                 salt != nullptr ? salt : ""};
  *out = to_c(hasher().root(id));
  return KVPOOL_OK;
}

int kvpool_hash_block(const kvpool_hash* parent, const uint32_t* tokens, size_t n,
                      const void* extra, size_t extra_len, kvpool_hash* out) {
  if (parent == nullptr || out == nullptr || (tokens == nullptr && n > 0) ||
      (extra == nullptr && extra_len > 0)) {
    return refuse("kvpool_hash_block: a NULL pointer with a non-zero length");
  }
  const std::span<const std::byte> extra_bytes(static_cast<const std::byte*>(extra), extra_len);
  *out = to_c(hasher().block(from_c(*parent), std::span(tokens, n), extra_bytes));
  return KVPOOL_OK;
}

int kvpool_hash_chain(const kvpool_hash* root, const uint32_t* tokens, size_t n,
                      uint32_t tokens_per_block, kvpool_hash* out, size_t out_len,
                      size_t* written) {
  if (written != nullptr) *written = 0;
  if (root == nullptr || written == nullptr || (tokens == nullptr && n > 0) ||
      (out == nullptr && out_len > 0)) {
    return refuse("kvpool_hash_chain: a NULL pointer with a non-zero length");
  }
  if (tokens_per_block == 0) return refuse("kvpool_hash_chain: tokens_per_block is 0");
  // kvpool_hash and BlockHash have one layout (asserted above), so the chain is written in place.
  static_assert(alignof(kvpool_hash) == alignof(kvpool::BlockHash));
  std::span<kvpool::BlockHash> dst(reinterpret_cast<kvpool::BlockHash*>(out), out_len);
  *written = hasher().chain(from_c(*root), std::span(tokens, n), tokens_per_block, dst);
  return KVPOOL_OK;
}

const char* kvpool_hash_last_error(void) {
  return hash_error.c_str();
}

}  // extern "C"

namespace {

// vLLM's scheme: block() with an explicit parent never reads the hasher's own NONE_HASH.
kvpool::VllmBlockHasher& vllm_hasher() {
  thread_local kvpool::VllmBlockHasher h("");
  return h;
}

}  // namespace

extern "C" {

int kvpool_vllm_none_hash(const char* seed, uint8_t out[32]) {
  if (seed == nullptr || out == nullptr) {
    return refuse("kvpool_vllm_none_hash: seed and out must not be NULL");
  }
  const kvpool::VllmDigest d = kvpool::VllmBlockHasher(seed).none_hash();
  std::memcpy(out, d.data(), d.size());
  return KVPOOL_OK;
}

int kvpool_vllm_hash_block(const uint8_t parent[32], const uint32_t* tokens, size_t n,
                           const void* extra_cbor, size_t extra_len, uint8_t out[32]) {
  if (parent == nullptr || out == nullptr || (tokens == nullptr && n != 0)) {
    return refuse("kvpool_vllm_hash_block: parent, out and tokens (when n > 0) must not be NULL");
  }
  if (extra_cbor == nullptr && extra_len != 0) {
    return refuse("kvpool_vllm_hash_block: extra_cbor is NULL but extra_len is " +
                  std::to_string(extra_len));
  }
  kvpool::VllmDigest p;
  std::memcpy(p.data(), parent, p.size());
  const kvpool::VllmDigest d = vllm_hasher().block(
      &p, std::span(tokens, n), std::span(static_cast<const std::byte*>(extra_cbor), extra_len));
  std::memcpy(out, d.data(), d.size());
  return KVPOOL_OK;
}

void kvpool_vllm_key(const uint8_t digest[32], kvpool_hash* out) {
  kvpool::VllmDigest d;
  std::memcpy(d.data(), digest, d.size());
  *out = to_c(kvpool::VllmBlockHasher::key(d));
}

}  // extern "C"

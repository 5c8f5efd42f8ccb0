#include "daemon/core/eviction_policy.h"

#include "daemon/core/lru_policy.h"
#include "daemon/core/prefix_policy.h"
#include "daemon/core/s3fifo_policy.h"

namespace kvpool::core {

namespace {
constexpr std::string_view kNames[] = {"prefix", "lru", "s3fifo"};
static_assert(kNames[0] == kDefaultPolicy);
}  // namespace

uint64_t contents_key(Namespace ns, const BlockHash& hash) {
  uint64_t z = hash.lo ^ (hash.hi * 0x9E3779B97F4A7C15ull) ^ (uint64_t{ns} << 32);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::unique_ptr<EvictionPolicy> make_policy(std::string_view name) {
  if (name == "prefix") return std::make_unique<PrefixPolicy>();
  if (name == "lru") return std::make_unique<LruPolicy>();
  if (name == "s3fifo") return std::make_unique<S3FifoPolicy>();
  return nullptr;
}

std::span<const std::string_view> policy_names() {
  return kNames;
}

}  // namespace kvpool::core

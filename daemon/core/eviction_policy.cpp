#include "daemon/core/eviction_policy.h"

#include "daemon/core/lru_policy.h"

namespace kvpool::core {

std::unique_ptr<EvictionPolicy> make_policy(std::string_view name) {
  if (name == "lru") return std::make_unique<LruPolicy>();
  return nullptr;
}

}  // namespace kvpool::core

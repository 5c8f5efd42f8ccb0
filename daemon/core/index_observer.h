// IndexObserver: what a PagePool tells an observer about its prefix index.
//
// stored() is called once for each (namespace, hash) a publish inserts (not for an idempotent
// republish, not for a duplicate answered with another page); removed() once for each one that
// leaves the index, with the reason: evicted (a victim taken by alloc, or evict()) or flushed
// (flush()). The calls arrive in the order the index changes, from inside the pool operation,
// so an observer must only record: it must not call back into the pool.
//
// Thread-safety: called on the pool's thread.
#pragma once

#include <cstdint>

#include "common/block_hash.h"
#include "daemon/core/types.h"

namespace kvpool::core {

class IndexObserver {
 public:
  enum class Removal : uint8_t { evicted, flushed };

  virtual ~IndexObserver() = default;
  virtual void stored(Namespace ns, const BlockHash& hash, PageId page) = 0;
  virtual void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) = 0;
};

}  // namespace kvpool::core

// IndexObserver: what a PagePool tells an observer about its prefix index.
//
// stored() is called once for each (namespace, hash) a publish inserts (not for an idempotent
// republish, not for a duplicate answered with another page); removed() once for each one that
// leaves the index, with the reason: evicted (a victim taken by alloc, or evict()), flushed
// (flush()) or dropped (drop_cached(): a hybrid model's other group lost the block, so this copy
// serves no hit; a host tier does not keep it). The calls arrive in the order the index changes,
// from inside the pool operation, so an observer must only record: it must not call back into the
// pool. The host tier reports its own index changes to the same observer (host_stored,
// host_removed).
//
// Thread-safety: called on the pool's thread.
#pragma once

#include <cstdint>

#include "common/block_hash.h"
#include "daemon/core/types.h"

namespace kvpool::core {

class IndexObserver {
 public:
  enum class Removal : uint8_t { evicted, flushed, dropped };

  virtual ~IndexObserver() = default;
  virtual void stored(Namespace ns, const BlockHash& hash, PageId page) = 0;
  virtual void removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) = 0;

  // The pool's host tier (HostTier): a block became findable there (a demotion, or a promotion
  // put back), or stopped being; `promoting`: it left to be copied up into the device tier.
  // Only a pool with a host tier calls these. Default: nothing.
  virtual void host_stored(Namespace /*ns*/, const BlockHash& /*hash*/) {}
  virtual void host_removed(Namespace /*ns*/, const BlockHash& /*hash*/, bool /*promoting*/) {}
  // The pool's remote tier (RemoteTier, daemon/remote/): this daemon wrote the block to the
  // cluster, or learned it is gone from there (its expiry passed, a read found no value).
  // Default: nothing.
  virtual void remote_stored(Namespace /*ns*/, const BlockHash& /*hash*/) {}
  virtual void remote_removed(Namespace /*ns*/, const BlockHash& /*hash*/) {}
};

}  // namespace kvpool::core

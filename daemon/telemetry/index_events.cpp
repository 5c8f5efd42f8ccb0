#include "daemon/telemetry/index_events.h"

#include <span>

namespace kvpool::daemon {

void PoolIndexEvents::begin_publish(const wire::PublishRequest& r, uint32_t tokens_per_page) {
  publish_ = r.has_chain() ? &r : nullptr;
  tokens_per_page_ = tokens_per_page;
  publish_cursor_ = 0;
}

BlockChainInfo PoolIndexEvents::publish_chain(const BlockHash& hash) {
  if (publish_ == nullptr) return {};
  // The pool stores a publish's items in order, skipping those it does not insert.
  const auto& items = publish_->items;
  size_t i = publish_cursor_;
  while (i < items.size() && !(items[i].hash == hash))
    ++i;
  if (i == items.size()) return {};
  publish_cursor_ = i + 1;
  BlockChainInfo c;
  c.parent = i == 0 ? publish_->parent : std::optional<BlockHash>(items[i - 1].hash);
  if (!publish_->token_ids.empty()) {
    c.token_ids = std::span(publish_->token_ids).subspan(i * tokens_per_page_, tokens_per_page_);
  }
  c.lora_name = publish_->lora_name;
  return c;
}

void PoolIndexEvents::stored(Namespace ns, const BlockHash& hash, PageId page) {
  prefix_stats_.stored(page, now_);
  log_.append(LoggedEvent{hash, 0, page, ns, pool_, wire::Event::kStored, wire::Event::kNone});
  if (kv_events_ == nullptr) return;
  BlockChainInfo chain = publish_chain(hash);
  if (!keep_chains_) {
    kv_events_->stored(hash, KvTier::pool, chain);
    return;
  }
  if (!chain.empty()) {
    Described& d = described_[Key{ns, hash}];
    d.parent = chain.parent;
    if (keep_token_ids_) d.token_ids.assign(chain.token_ids.begin(), chain.token_ids.end());
    d.lora_name.assign(chain.lora_name);
    d.tiers |= kDevice;
  } else if (auto it = described_.find(Key{ns, hash}); it != described_.end()) {
    // A promotion: the block keeps the chain it was published with.
    it->second.tiers |= kDevice;
    chain = chain_of(it->second);
  }
  kv_events_->stored(hash, KvTier::pool, chain);
}

void PoolIndexEvents::removed(Namespace ns, const BlockHash& hash, PageId page, Removal why) {
  const uint8_t cause = why == Removal::flushed ? wire::Event::kFlushed : wire::Event::kEvicted;
  const LoggedEvent e{hash, 0, page, ns, pool_, wire::Event::kRemoved, cause};
  if (flushing_) {
    held_.push_back(e);
  } else {
    log_.append(e);
    if (kv_events_ != nullptr) kv_events_->removed(hash);
  }
  leave(ns, hash, kDevice);
}

void PoolIndexEvents::host_stored(Namespace ns, const BlockHash& hash) {
  if (kv_events_ == nullptr) return;
  BlockChainInfo chain;
  if (auto it = described_.find(Key{ns, hash}); it != described_.end()) {
    it->second.tiers |= kHost;
    chain = chain_of(it->second);
  }
  kv_events_->stored(hash, KvTier::host, chain);
}

void PoolIndexEvents::host_removed(Namespace ns, const BlockHash& hash, bool /*promoting*/) {
  if (kv_events_ == nullptr) return;
  if (flushing_) {
    held_host_.push_back(hash);
  } else {
    kv_events_->removed(hash, KvTier::host);
  }
  leave(ns, hash, kHost);
}

void PoolIndexEvents::remote_stored(Namespace ns, const BlockHash& hash) {
  if (kv_events_ == nullptr) return;
  BlockChainInfo chain;
  if (auto it = described_.find(Key{ns, hash}); it != described_.end())
    chain = chain_of(it->second);
  kv_events_->stored(hash, KvTier::remote, chain);
  ++remote_live_;
}

void PoolIndexEvents::remote_removed(Namespace /*ns*/, const BlockHash& hash) {
  if (kv_events_ == nullptr) return;
  kv_events_->removed(hash, KvTier::remote);
  if (remote_live_ != 0) --remote_live_;
}

const PoolIndexEvents::Described* PoolIndexEvents::described_block(Namespace ns,
                                                                   const BlockHash& hash) const {
  const auto it = described_.find(Key{ns, hash});
  return it == described_.end() ? nullptr : &it->second;
}

void PoolIndexEvents::carry(Namespace ns, const BlockHash& hash, const Described& chain) {
  if (!keep_chains_ || kv_events_ == nullptr) return;
  Described& d = described_[Key{ns, hash}];
  if (d.tiers != 0) return;  // a tier of this pool holds the block: it keeps its own chain
  d.parent = chain.parent;
  if (keep_token_ids_) d.token_ids = chain.token_ids;
  d.lora_name = chain.lora_name;
  // A store that does not come leaves it with no tier: end_turn forgets it.
  gone_.push_back(Key{ns, hash});
}

void PoolIndexEvents::leave(Namespace ns, const BlockHash& hash, uint8_t tier) {
  if (!keep_chains_) return;  // every eviction passes here: no probe of an empty map
  const auto it = described_.find(Key{ns, hash});
  if (it == described_.end()) return;
  it->second.tiers &= static_cast<uint8_t>(~tier);
  if (it->second.tiers == 0) gone_.push_back(Key{ns, hash});
}

void PoolIndexEvents::end_turn() {
  for (const Key& k : gone_) {
    const auto it = described_.find(k);
    if (it != described_.end() && it->second.tiers == 0) described_.erase(it);
  }
  gone_.clear();
  if (gone_.capacity() > 4096) gone_.shrink_to_fit();  // a large flush should not pin it
}

void PoolIndexEvents::begin_flush() {
  flushing_ = true;
  held_.clear();
  held_host_.clear();
}

void PoolIndexEvents::end_flush(bool index_empty) {
  flushing_ = false;
  if (index_empty) {
    log_.append(LoggedEvent{BlockHash{}, held_.size(), kNoPage, 0, pool_, wire::Event::kCleared,
                            wire::Event::kFlushed});
  } else {
    for (const LoggedEvent& e : held_)
      log_.append(e);
  }
  // A router drops everything of this pool on AllBlocksCleared: its REMOTE blocks, which the
  // flush left in the cluster, too. While some are announced, the removals go one by one.
  if (kv_events_ != nullptr && index_empty && remote_live_ == 0) {
    kv_events_->cleared();
  } else if (kv_events_ != nullptr) {
    for (const LoggedEvent& e : held_)
      kv_events_->removed(e.hash);
    for (const BlockHash& h : held_host_)
      kv_events_->removed(h, KvTier::host);
  }
  held_.clear();
  held_.shrink_to_fit();  // a flush of a large pool should not pin its scratch
  held_host_.clear();
  held_host_.shrink_to_fit();
}

}  // namespace kvpool::daemon

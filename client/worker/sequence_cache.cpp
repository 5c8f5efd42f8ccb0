#include "client/worker/sequence_cache.h"

#include <algorithm>

namespace kvpool::client {

SequenceCache::SequenceCache(Connection& conn, BlockHasher& hasher, const BlockHash& root)
    : conn_(conn),
      hasher_(hasher),
      root_(root),
      tpp_(conn.pool().geometry.tokens_per_page),
      scheme_matches_(conn.hash_scheme().name.empty() ||
                      conn.hash_scheme().name == hasher.scheme_name()) {}

SequenceCache::~SequenceCache() {
  (void)release();
}

void SequenceCache::hash_new_full_blocks() {
  for (uint32_t b = static_cast<uint32_t>(hashes_.size()); b < full_blocks(); ++b) {
    const BlockHash& parent = b == 0 ? root_ : hashes_[b - 1];
    hashes_.push_back(hasher_.block(parent, std::span(tokens_).subspan(uint64_t{b} * tpp_, tpp_)));
  }
}

Result<Ok> SequenceCache::check_scheme() const {
  if (scheme_matches_) return Ok{};
  return Error{Status(Errc::invalid_argument),
               "this SequenceCache hashes with " + hasher_.scheme_name() +
                   " but its connection attached with " + conn_.hash_scheme().name +
                   " (the pool's scheme): every block would be named otherwise than the pool's "
                   "other workers name it"};
}

Result<uint32_t> SequenceCache::begin(std::span<const uint32_t> prompt) {
  if (!tokens_.empty()) {
    return Error{Status(Errc::invalid_argument), "begin() on a sequence that has tokens"};
  }
  if (auto ok = check_scheme(); !ok.ok()) return ok.error();
  tokens_.assign(prompt.begin(), prompt.end());
  hash_new_full_blocks();
  auto hits = conn_.lookup(hashes_, hints_);
  if (!hits.ok()) {
    tokens_.clear();
    hashes_.clear();
    return hits.error();
  }
  return start(std::move(hits.value()));
}

Result<uint32_t> SequenceCache::begin_from(std::span<const uint32_t> prompt,
                                           std::span<const PageId> held) {
  // Refused before the cache takes them: the references go back, as start() gives its own back.
  auto refuse = [&](Error e) -> Result<uint32_t> {
    std::vector<PageId> pages;
    for (const PageId p : held) {
      if (p != kNoPage) pages.push_back(p);
    }
    if (!pages.empty()) (void)conn_.release(pages);
    return e;
  };
  if (!tokens_.empty()) {
    return refuse(
        Error{Status(Errc::invalid_argument), "begin_from() on a sequence that has tokens"});
  }
  if (auto ok = check_scheme(); !ok.ok()) return refuse(ok.error());
  if (held.size() > prompt.size() / tpp_) {
    return refuse(Error{Status(Errc::invalid_argument),
                        "begin_from(): " + std::to_string(held.size()) +
                            " held pages for a prompt of " + std::to_string(prompt.size() / tpp_) +
                            " full blocks"});
  }
  tokens_.assign(prompt.begin(), prompt.end());
  hash_new_full_blocks();
  return start({held.begin(), held.end()});
}

Result<uint32_t> SequenceCache::start(std::vector<PageId> hit) {
  pages_ = std::move(hit);
  published_ = static_cast<uint32_t>(pages_.size());
  const uint32_t blocks = (tokens() + tpp_ - 1) / tpp_;
  if (blocks > pages_.size()) {
    auto fresh = conn_.alloc(blocks - static_cast<uint32_t>(pages_.size()), hints_);
    if (!fresh.ok()) {
      (void)release();
      return fresh.error();
    }
    pages_.insert(pages_.end(), fresh.value().begin(), fresh.value().end());
  }
  return published_ * tpp_;
}

Result<SequenceCache::Slot> SequenceCache::append(uint32_t token) {
  if (tokens() % tpp_ == 0) {
    auto page = conn_.alloc(1, hints_);
    if (!page.ok()) return page.error();
    pages_.push_back(page.value()[0]);
  }
  tokens_.push_back(token);
  hash_new_full_blocks();
  return slot(tokens() - 1);
}

SequenceCache::Slot SequenceCache::slot(uint32_t pos) const {
  return Slot{pages_[pos / tpp_], pos % tpp_};
}

Result<uint32_t> SequenceCache::publish_full() {
  const uint32_t full = full_blocks();
  if (full <= published_) {
    auto dropped = release_out_of_window();
    if (!dropped.ok()) return dropped.error();
    return 0u;
  }
  // One publish per run of consecutive blocks (a window may have dropped blocks before they
  // were published), each with its tokens and parent for the daemon's KV events.
  std::vector<PageId> own_copies;
  std::vector<PublishItem> items;
  uint32_t b = published_;
  while (b < full) {
    if (pages_[b] == kNoPage) {  // dropped by the window before it was published
      ++b;
      continue;
    }
    const uint32_t first = b;
    items.clear();
    for (; b < full && pages_[b] != kNoPage; ++b)
      items.push_back({pages_[b], hashes_[b]});
    PublishChain chain;
    if (first > 0) chain.parent = hashes_[first - 1];
    chain.token_ids = std::span(tokens_).subspan(uint64_t{first} * tpp_, items.size() * tpp_);
    chain.lora_name = lora_name_;
    auto results = conn_.publish(items, hints_, chain);
    if (!results.ok()) {
      if (!own_copies.empty()) (void)conn_.release(own_copies);  // replaced by earlier runs
      return results.error();
    }
    for (size_t i = 0; i < items.size(); ++i) {
      const PublishResult& r = results.value()[i];
      if (r.kind == PublishResult::Kind::duplicate) {
        own_copies.push_back(pages_[first + i]);
        pages_[first + i] = r.page;  // already retained for us by the daemon
      }
    }
    published_ = b;
  }
  published_ = full;
  if (!own_copies.empty()) {
    auto rel = conn_.release(own_copies);
    if (!rel.ok()) return rel.error();
  }
  auto dropped = release_out_of_window();
  if (!dropped.ok()) return dropped.error();
  return static_cast<uint32_t>(own_copies.size());
}

Result<std::unique_ptr<SequenceCache>> SequenceCache::fork() {
  auto child = std::make_unique<SequenceCache>(conn_, hasher_, root_);
  child->hints_ = hints_;
  child->lora_name_ = lora_name_;
  const uint32_t full = full_blocks();
  std::vector<PageId> shared;
  for (uint32_t b = 0; b < full; ++b) {
    if (pages_[b] != kNoPage) shared.push_back(pages_[b]);
  }
  if (!shared.empty()) {
    auto r = conn_.retain(shared, hints_);
    if (!r.ok()) return r.error();
  }
  child->tokens_ = tokens_;
  child->hashes_ = hashes_;
  child->published_ = published_;
  child->pages_.assign(pages_.begin(), pages_.begin() + full);
  if (tokens() % tpp_ != 0) {
    // The partial last block will be written by both sequences: the child gets its own copy.
    auto page = conn_.alloc(1, hints_);
    if (!page.ok()) return page.error();  // child's destructor releases what it retained
    const PageId copy = page.value()[0];
    child->pages_.push_back(copy);  // from here on the child's destructor releases it
    // The daemon copies (bytes and 8-bit scales) on its own stream: the pool may be GPU memory,
    // which this process cannot memcpy.
    const wire::PageCopy pair{pages_.back(), copy};
    auto copied = conn_.copy(std::span(&pair, 1));
    if (!copied.ok()) return copied.error();
  }
  return child;
}

Result<Ok> SequenceCache::apply_window(uint32_t window) {
  if (tokens() <= window) return Ok{};
  const uint32_t first_kept = tokens() - window;  // oldest token still inside the window
  const uint32_t droppable = first_kept / tpp_;   // blocks entirely before it
  std::vector<PageId> drop;
  for (uint32_t b = droppable; b-- > 0;) {  // tail first
    if (pages_[b] != kNoPage) drop.push_back(pages_[b]);
  }
  if (drop.empty()) return Ok{};
  auto r = conn_.release(drop);
  if (!r.ok()) return r.error();
  std::fill(pages_.begin(), pages_.begin() + droppable, kNoPage);
  return Ok{};
}

uint32_t SequenceCache::first_visible() const {
  // The next query sits at position tokens(); the result is at most that.
  return static_cast<uint32_t>(first_visible_token(conn_.pool().geometry, tokens()));
}

Result<Ok> SequenceCache::release_out_of_window() {
  const AttentionKind kind = conn_.pool().geometry.kind;
  if (kind != AttentionKind::sliding && kind != AttentionKind::chunked) return Ok{};
  const uint32_t gone = std::min(first_visible() / tpp_, published_);  // whole published blocks
  std::vector<PageId> drop;
  for (uint32_t b = gone; b-- > 0;) {  // tail first
    if (pages_[b] != kNoPage) drop.push_back(pages_[b]);
  }
  if (drop.empty()) return Ok{};
  auto r = conn_.release(drop);
  if (!r.ok()) return r.error();
  std::fill(pages_.begin(), pages_.begin() + gone, kNoPage);
  return Ok{};
}

Result<Ok> SequenceCache::release() {
  std::vector<PageId> held;
  for (auto it = pages_.rbegin(); it != pages_.rend(); ++it) {
    if (*it != kNoPage) held.push_back(*it);
  }
  tokens_.clear();
  pages_.clear();
  hashes_.clear();
  published_ = 0;
  if (held.empty()) return Ok{};
  return conn_.release(held);
}

std::vector<uint64_t> SequenceCache::kv_block_table() const {
  const kernels::PagedKv kv = kernels::paged_kv_of(conn_.pool(), nullptr);
  std::vector<uint64_t> out(pages_.size());
  for (size_t i = 0; i < pages_.size(); ++i)
    out[i] = pages_[i] == kNoPage ? kNoPage : kernels::block_index(kv, pages_[i]);
  return out;
}

}  // namespace kvpool::client

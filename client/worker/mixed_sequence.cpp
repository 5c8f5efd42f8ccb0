#include "client/worker/mixed_sequence.h"

#include <algorithm>
#include <string>

#include "common/geometry.h"

namespace kvpool::client {

namespace {

Error invalid(std::string message) {
  return Error{Status(Errc::invalid_argument), std::move(message)};
}

// Releases `pages` through `conn`, last first (tails are evicted before heads).
Result<Ok> release_tail_first(Connection& conn, std::vector<PageId> pages) {
  std::reverse(pages.begin(), pages.end());
  if (pages.empty()) return Ok{};
  return conn.release(pages);
}

}  // namespace

Result<std::unique_ptr<MixedSequence>> MixedSequence::create(
    Connection& recent, PoolKernels& recent_k, Connection& older, PoolKernels& older_k,
    BlockHasher& hasher, const BlockHash& root, uint32_t recent_tokens) {
  const Geometry& rg = recent.pool().geometry;
  const Geometry& og = older.pool().geometry;
  if (!kernels::same_shape(rg, og)) {
    return invalid("pool " + recent.pool().pool_name + " and pool " + older.pool().pool_name +
                   " are not of one shape (layers, kv_heads, head_dim, tokens_per_page, kind and "
                   "window must match): they cannot hold one sequence's pages");
  }
  if (dtype_is_quantized(rg.dtype) || !dtype_is_quantized(og.dtype)) {
    return invalid("pool " + recent.pool().pool_name + " is " + std::string(dtype_name(rg.dtype)) +
                   " and pool " + older.pool().pool_name + " " + std::string(dtype_name(og.dtype)) +
                   ": the recent pool keeps 16 bits (bf16, fp16), the older one 8 (fp8_e4m3, "
                   "int8)");
  }
  if (recent.base() == nullptr || older.base() == nullptr) {
    return invalid("pool " + (recent.base() == nullptr ? recent : older).pool().pool_name +
                   " is attached without a mapping: a conversion reads and writes the pages");
  }
  if (recent.device() != older.device()) {
    return invalid("pools " + recent.pool().pool_name + " and " + older.pool().pool_name +
                   " are not in the same memory (host or one GPU): a conversion runs on one");
  }
  if (&recent_k.connection() != &recent || &older_k.connection() != &older) {
    return invalid(
        "recent_k and older_k must be the PoolKernels of the recent and older "
        "connections given");
  }
  if (recent_tokens == 0) return invalid("recent_tokens must be at least 1");
  for (const Connection* c : {&recent, &older}) {
    if (!c->hash_scheme().name.empty() && c->hash_scheme().name != hasher.scheme_name()) {
      return invalid("pool " + c->pool().pool_name + " names blocks by " + c->hash_scheme().name +
                     ", the hasher by " + hasher.scheme_name());
    }
  }
  return std::unique_ptr<MixedSequence>(
      new MixedSequence(recent, recent_k, older, older_k, hasher, root, recent_tokens));
}

MixedSequence::MixedSequence(Connection& recent, PoolKernels& recent_k, Connection& older,
                             PoolKernels& older_k, BlockHasher& hasher, const BlockHash& root,
                             uint32_t recent_tokens)
    : recent_(recent),
      recent_k_(recent_k),
      older_conn_(older),
      older_k_(older_k),
      hasher_(hasher),
      root_(root),
      recent_tokens_(recent_tokens),
      tpp_(recent.pool().geometry.tokens_per_page) {}

MixedSequence::~MixedSequence() {
  (void)release();
}

void MixedSequence::hash_new_full_blocks() {
  for (uint32_t b = static_cast<uint32_t>(hashes_.size()); b < full_blocks(); ++b) {
    const BlockHash& parent = b == 0 ? root_ : hashes_[b - 1];
    hashes_.push_back(hasher_.block(parent, std::span(tokens_).subspan(uint64_t{b} * tpp_, tpp_)));
  }
}

Result<uint32_t> MixedSequence::begin(std::span<const uint32_t> prompt) {
  if (!tokens_.empty()) return invalid("begin() on a sequence that has tokens");
  tokens_.assign(prompt.begin(), prompt.end());
  hash_new_full_blocks();
  // Older blocks first: a block converted by any worker is found there; the chain then goes on
  // in the recent pool from the first block the older pool does not hold.
  auto old_hits = older_conn_.lookup(hashes_);
  if (!old_hits.ok()) {
    (void)release();
    return old_hits.error();
  }
  pages_ = std::move(old_hits.value());
  older_ = static_cast<uint32_t>(pages_.size());
  auto new_hits = recent_.lookup(std::span(hashes_).subspan(older_));
  if (!new_hits.ok()) {
    (void)release();
    return new_hits.error();
  }
  pages_.insert(pages_.end(), new_hits.value().begin(), new_hits.value().end());
  published_ = static_cast<uint32_t>(pages_.size());
  if (auto trimmed = trim_hit(); !trimmed.ok()) {
    (void)release();
    return trimmed.error();
  }
  const uint32_t blocks = (tokens() + tpp_ - 1) / tpp_;
  if (blocks > pages_.size()) {
    auto fresh = recent_.alloc(blocks - static_cast<uint32_t>(pages_.size()));
    if (!fresh.ok()) {
      (void)release();
      return fresh.error();
    }
    pages_.insert(pages_.end(), fresh.value().begin(), fresh.value().end());
  }
  // Blocks the older pool has no room for stay in 16 bits (age() takes that as no failure); any
  // other failure (the daemon gone, a conversion error) is the call's.
  const uint32_t cached = published_ * tpp_;
  // The query at `cached` runs next (the prompt's first token not cached, or the next token after
  // a prompt cached whole): it reads keys from its own window on, which may reach blocks before
  // the window of the prompt's last token.
  auto aged = age(cached);
  if (!aged.ok()) {
    (void)release();
    return aged.error();
  }
  return cached;
}

Result<Ok> MixedSequence::trim_hit() {
  if (published_ == 0) return Ok{};
  const Geometry& g = recent_.pool().geometry;
  // Whether the query after a hit of n blocks (at n · T: what a lookup's hit serves) finds every
  // block it reads in the table.
  const auto readable = [&](uint32_t n) {
    for (uint64_t b = first_visible_token(g, uint64_t{n} * tpp_) / tpp_; b < n; ++b) {
      if (pages_[b] == kNoPage) return false;
    }
    return true;
  };
  uint32_t n = published_;
  while (n > 0 && !readable(n))
    --n;
  if (n == published_) return Ok{};
  std::vector<PageId> older_pages, recent_pages;
  for (uint32_t b = n; b < published_; ++b) {
    if (pages_[b] != kNoPage) (b < older_ ? older_pages : recent_pages).push_back(pages_[b]);
  }
  pages_.resize(n);
  published_ = n;
  older_ = std::min(older_, n);
  auto a = release_tail_first(older_conn_, std::move(older_pages));
  auto b = release_tail_first(recent_, std::move(recent_pages));
  if (!a.ok()) return a.error();
  return b;
}

Result<MixedSequence::Slot> MixedSequence::append(uint32_t token) {
  if (tokens() % tpp_ == 0) {
    auto page = recent_.alloc(1);
    if (!page.ok()) return page.error();
    pages_.push_back(page.value()[0]);
  }
  tokens_.push_back(token);
  hash_new_full_blocks();
  const uint32_t pos = tokens() - 1;
  return Slot{pages_[pos / tpp_], pos % tpp_};
}

Result<Ok> MixedSequence::publish_blocks(Connection& conn, uint32_t first,
                                         std::vector<PageId>& pages,
                                         std::vector<PageId>& own_copies) {
  std::vector<PublishItem> items(pages.size());
  for (size_t i = 0; i < pages.size(); ++i)
    items[i] = {pages[i], hashes_[first + i]};
  PublishChain chain;
  if (first > 0) chain.parent = hashes_[first - 1];
  chain.token_ids = std::span(tokens_).subspan(uint64_t{first} * tpp_, pages.size() * tpp_);
  auto results = conn.publish(items, {}, chain);
  if (!results.ok()) return results.error();
  for (size_t i = 0; i < pages.size(); ++i) {
    const PublishResult& r = results.value()[i];
    if (r.kind == PublishResult::Kind::duplicate) {
      own_copies.push_back(pages[i]);
      pages[i] = r.page;  // retained for us by the daemon
    }
  }
  return Ok{};
}

Result<uint32_t> MixedSequence::publish_full() {
  const uint32_t full = full_blocks();
  if (full > published_) {
    std::vector<PageId> pages(pages_.begin() + published_, pages_.begin() + full);
    std::vector<PageId> own_copies;
    if (auto r = publish_blocks(recent_, published_, pages, own_copies); !r.ok()) {
      return r.error();
    }
    std::copy(pages.begin(), pages.end(), pages_.begin() + published_);
    published_ = full;
    if (auto rel = release_tail_first(recent_, std::move(own_copies)); !rel.ok()) {
      return rel.error();
    }
  }
  return age(tokens() - 1);
}

Result<uint32_t> MixedSequence::age(uint32_t first_query) {
  // A sliding or chunked pool's blocks before the window (chunk) of the first query still to
  // run are read by no query from now on: let go (published, they stay cached for other
  // sequences), not converted.
  // A hit's holes just past them (a lookup keeps the window of the next token's query, one
  // position on) go too: the table keeps no hole after a page.
  const Geometry& g = recent_.pool().geometry;
  const auto first =
      static_cast<uint32_t>(tokens() == 0 ? 0 : first_visible_token(g, first_query) / tpp_);
  uint32_t gone = std::min(first, published_);
  while (gone < published_ && pages_[gone] == kNoPage)
    ++gone;
  if (gone > let_go_) {
    std::vector<PageId> older_pages, recent_pages;
    for (uint32_t b = let_go_; b < gone; ++b) {
      if (pages_[b] == kNoPage) continue;
      (b < older_ ? older_pages : recent_pages).push_back(pages_[b]);
      pages_[b] = kNoPage;
    }
    let_go_ = gone;
    older_ = std::max(older_, gone);
    // Head first, as they left the window: the oldest go first when the pools evict.
    if (!older_pages.empty()) {
      if (auto r = older_conn_.release(older_pages); !r.ok()) return r.error();
    }
    if (!recent_pages.empty()) {
      if (auto r = recent_.release(recent_pages); !r.ok()) return r.error();
    }
  }
  const uint32_t aged = tokens() > recent_tokens_ ? (tokens() - recent_tokens_) / tpp_ : 0;
  const uint32_t limit = std::min(aged, published_);
  if (limit <= older_) return 0u;
  // No lookup first: begin() took what the older pool held of the prompt, and a block another
  // worker converted since is adopted from the publish's duplicate answer (convert_blocks), so
  // the common case (nobody else converted it) costs no extra round trip per aging step.
  // In batches: a batch the older pool cannot take now (no free pages, its capacity, a
  // quota) is halved, down to one block, and what is left stays in 16 bits until a later call.
  uint32_t converted = 0;
  uint32_t batch = limit - older_;
  while (older_ < limit && batch > 0) {
    auto r = convert_blocks(older_, std::min(batch, limit - older_));
    if (!r.ok()) {
      const Errc code = r.error().status.code();
      if (code != Errc::out_of_pages && code != Errc::exceeds_capacity &&
          code != Errc::quota_exceeded) {
        return r.error();
      }
      batch /= 2;
      continue;
    }
    converted += r.value();
  }
  return converted;
}

Result<uint32_t> MixedSequence::convert_blocks(uint32_t first, uint32_t n) {
  auto fresh = older_conn_.alloc(n);
  if (!fresh.ok()) return fresh.error();
  std::vector<PageId> dst = std::move(fresh.value());
  const std::span<const PageId> src(pages_.data() + first, n);
  if (std::string e = recent_k_.convert_to(older_k_, src, dst, stream_); !e.empty()) {
    (void)older_conn_.release(dst);
    return Error{Status(Errc::internal),
                 "converting " + std::to_string(n) + " blocks to " +
                     std::string(dtype_name(older_conn_.pool().geometry.dtype)) + ": " + e};
  }
  if (after_convert_) after_convert_();
  // Another worker's conversion that won the race is adopted: its page replaces ours.
  std::vector<PageId> own_copies;
  if (auto r = publish_blocks(older_conn_, first, dst, own_copies); !r.ok()) {
    (void)older_conn_.release(dst);
    return r.error();
  }
  const auto stored = static_cast<uint32_t>(n - own_copies.size());
  std::vector<PageId> recent_pages(src.begin(), src.end());
  std::copy(dst.begin(), dst.end(), pages_.begin() + first);
  older_ = first + n;
  converted_ += stored;
  adopted_ += n - stored;
  auto rel_own = release_tail_first(older_conn_, std::move(own_copies));
  auto rel_recent = release_tail_first(recent_, std::move(recent_pages));
  if (!rel_own.ok()) return rel_own.error();
  if (!rel_recent.ok()) return rel_recent.error();
  return stored;
}

Result<Ok> MixedSequence::release() {
  std::vector<PageId> recent_pages, older_pages;
  for (size_t b = 0; b < pages_.size(); ++b) {
    if (pages_[b] == kNoPage) continue;
    (b < older_ ? older_pages : recent_pages).push_back(pages_[b]);
  }
  tokens_.clear();
  pages_.clear();
  hashes_.clear();
  older_ = 0;
  published_ = 0;
  let_go_ = 0;
  auto a = release_tail_first(recent_, std::move(recent_pages));
  auto b = release_tail_first(older_conn_, std::move(older_pages));
  if (!a.ok()) return a.error();
  return b;
}

}  // namespace kvpool::client

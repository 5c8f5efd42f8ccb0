// RecordingPolicy: an EvictionPolicy that forwards every call to a real policy and logs what the
// pool told it (on_cached with its PageFacts, on_reuse) and what it answered (victim), so that
// tests can check the facts and the order of calls the pool makes, not only their effect.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <utility>
#include <vector>

#include "daemon/core/eviction_policy.h"

namespace kvpool::core::test {

struct PolicyCall {
  enum class Kind : uint8_t { cached, reuse, victim };
  Kind kind = Kind::cached;
  PageId page = kNoPage;
  PageFacts facts;  // cached only

  friend bool operator==(const PolicyCall& a, const PolicyCall& b) {
    if (a.kind != b.kind || a.page != b.page) return false;
    if (a.kind != Kind::cached) return true;
    return a.facts.key == b.facts.key && a.facts.hits == b.facts.hits &&
           a.facts.priority == b.facts.priority && a.facts.first == b.facts.first &&
           a.facts.run == b.facts.run;
  }
  friend std::ostream& operator<<(std::ostream& os, const PolicyCall& c) {
    switch (c.kind) {
      case Kind::cached:
        return os << "on_cached(" << c.page << ", key " << c.facts.key << " hits "
                  << int{c.facts.hits} << " prio " << int{static_cast<uint8_t>(c.facts.priority)}
                  << (c.facts.first ? " first" : "") << " run " << c.facts.run << ")";
      case Kind::reuse:
        return os << "on_reuse(" << c.page << ")";
      case Kind::victim:
        return os << "victim() = " << c.page;
    }
    return os;
  }
};

inline PolicyCall cached_call(PageId page, const PageFacts& facts) {
  return {PolicyCall::Kind::cached, page, facts};
}
inline PolicyCall reuse_call(PageId page) {
  return {PolicyCall::Kind::reuse, page, {}};
}
inline PolicyCall victim_call(PageId page) {
  return {PolicyCall::Kind::victim, page, {}};
}

class RecordingPolicy final : public EvictionPolicy {
 public:
  explicit RecordingPolicy(std::unique_ptr<EvictionPolicy> inner) : inner_(std::move(inner)) {}

  std::string_view name() const override { return inner_->name(); }
  void attach(uint32_t num_pages) override { inner_->attach(num_pages); }
  // Not logged: a resize queues or dequeues nothing.
  void resize(uint32_t num_pages) override { inner_->resize(num_pages); }
  void on_cached(PageId page, const PageFacts& facts) override {
    log_.push_back(cached_call(page, facts));
    inner_->on_cached(page, facts);
  }
  void on_reuse(PageId page) override {
    log_.push_back(reuse_call(page));
    inner_->on_reuse(page);
  }
  // Calls that find nothing queued are not logged: they change nothing.
  PageId victim() override {
    const PageId page = inner_->victim();
    if (page != kNoPage) log_.push_back(victim_call(page));
    return page;
  }
  void for_each_queued(const std::function<void(PageId)>& fn) const override {
    inner_->for_each_queued(fn);
  }

  const EvictionPolicy& inner() const { return *inner_; }
  // The calls since the last take().
  std::vector<PolicyCall> take() { return std::exchange(log_, {}); }

 private:
  std::unique_ptr<EvictionPolicy> inner_;
  std::vector<PolicyCall> log_;
};

}  // namespace kvpool::core::test

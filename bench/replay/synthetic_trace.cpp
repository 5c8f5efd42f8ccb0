#include "bench/replay/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_set>
#include <vector>

namespace kvpool::bench {

namespace {

struct Chat {
  std::vector<uint64_t> ids;
  uint32_t turns_left = 0;
  double ready_at = 0;  // seconds
};

}  // namespace

Trace synthetic_trace(const SyntheticTraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::exponential_distribution<double> gap(o.requests_per_second);
  std::exponential_distribution<double> think(1.0 / o.mean_think_seconds);
  std::geometric_distribution<uint32_t> extra_turns(1.0 / o.mean_turns);
  std::uniform_int_distribution<uint32_t> question_blocks(1, 3);
  std::uniform_int_distribution<uint32_t> chat_blocks(2, 6);
  std::uniform_int_distribution<uint32_t> turn_blocks(1, 3);
  std::uniform_int_distribution<uint32_t> document_blocks(20, 80);
  // Zipf(1) over the system prompts, by inverse CDF.
  std::vector<double> zipf_cdf(o.system_prompts);
  double total = 0;
  for (uint32_t i = 0; i < o.system_prompts; ++i)
    zipf_cdf[i] = (total += 1.0 / (i + 1));
  for (double& c : zipf_cdf)
    c /= total;

  uint64_t next_id = 0;
  auto fresh = [&](std::vector<uint64_t>& ids, uint32_t n) {
    for (uint32_t i = 0; i < n; ++i)
      ids.push_back(next_id++);
  };
  std::vector<std::vector<uint64_t>> prompts(o.system_prompts);
  for (auto& p : prompts)
    fresh(p, o.system_prompt_blocks);

  Trace trace;
  trace.has_hints = true;
  std::vector<Chat> chats;
  const auto pin_ms = static_cast<uint32_t>(o.mean_think_seconds * 1000.0);
  double now = 0;
  for (uint32_t r = 0; r < o.requests; ++r) {
    now += gap(rng);
    TraceRequest req;
    req.timestamp_ms = static_cast<uint64_t>(now * 1000.0);
    const double kind = unit(rng);
    if (kind < o.assistant_share) {
      const auto p = static_cast<size_t>(
          std::lower_bound(zipf_cdf.begin(), zipf_cdf.end(), unit(rng)) - zipf_cdf.begin());
      req.hash_ids = prompts[std::min(p, prompts.size() - 1)];
      fresh(req.hash_ids, question_blocks(rng));
      req.system_blocks = o.system_prompt_blocks;
      req.priority = Priority::one_off;
    } else if (kind < o.assistant_share + o.conversation_share) {
      // The chat that has waited longest past its think time, else a new one.
      auto ready = std::min_element(chats.begin(), chats.end(), [](const Chat& a, const Chat& b) {
        return a.ready_at < b.ready_at;
      });
      if (ready == chats.end() || ready->ready_at > now) {
        chats.push_back(Chat{{}, extra_turns(rng), 0});
        ready = std::prev(chats.end());
        fresh(ready->ids, chat_blocks(rng));
      } else {
        fresh(ready->ids, turn_blocks(rng));
      }
      req.hash_ids = ready->ids;
      req.priority = Priority::conversation;
      req.pin_ttl_ms = pin_ms;
      if (ready->turns_left == 0) {
        chats.erase(ready);
      } else {
        --ready->turns_left;
        ready->ready_at = now + think(rng);
      }
    } else {
      fresh(req.hash_ids, document_blocks(rng));
      req.priority = Priority::one_off;
    }
    req.input_length = req.hash_ids.size() * 512;
    trace.total_blocks += req.hash_ids.size();
    trace.requests.push_back(std::move(req));
  }
  std::unordered_set<uint64_t> distinct;
  for (const auto& req : trace.requests)
    distinct.insert(req.hash_ids.begin(), req.hash_ids.end());
  trace.distinct_blocks = distinct.size();
  return trace;
}

}  // namespace kvpool::bench

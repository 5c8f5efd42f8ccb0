// kvpoolctl events: follows the daemon's prefix-index events (client/connection/event_stream.h),
// one line per event, flushed as it comes, until --count events were printed or the stream ends.
#include <string>

#include "client/connection/event_stream.h"
#include "client/ctl/common.h"
#include "common/block_hash.h"

namespace kvpool::ctl {

namespace {

// `pool` is already JSON-escaped.
void print_json(const wire::Event& e, const std::string& pool) {
  const auto seq = static_cast<unsigned long long>(e.seq);
  const auto count = static_cast<unsigned long long>(e.count);
  switch (e.kind) {
    case wire::Event::kGap:
      std::printf(
          "{\"schema\":%d,\"type\":\"gap\",\"pool\":\"%s\",\"lost\":%llu,"
          "\"resume_seq\":%llu}\n",
          kSchema, pool.c_str(), count, seq);
      break;
    case wire::Event::kCleared:
      std::printf(
          "{\"schema\":%d,\"seq\":%llu,\"type\":\"cleared\",\"pool\":\"%s\","
          "\"blocks\":%llu}\n",
          kSchema, seq, pool.c_str(), count);
      break;
    case wire::Event::kResized:
      std::printf(
          "{\"schema\":%d,\"seq\":%llu,\"type\":\"resized\",\"pool\":\"%s\",\"cause\":\"%s\","
          "\"pages\":%llu}\n",
          kSchema, seq, pool.c_str(), wire::event_cause_name(e.cause), count);
      break;
    default: {
      const std::string cause =
          e.kind == wire::Event::kRemoved
              ? std::string(",\"cause\":\"") + wire::event_cause_name(e.cause) + "\""
              : "";
      std::printf(
          "{\"schema\":%d,\"seq\":%llu,\"type\":\"%s\",\"pool\":\"%s\",\"tenant\":\"%s\","
          "\"hash\":\"%s\",\"page\":%u%s}\n",
          kSchema, seq, wire::event_kind_name(e.kind), pool.c_str(), json_escape(e.tenant).c_str(),
          to_hex(e.hash).c_str(), e.page, cause.c_str());
    }
  }
}

void print_text(const wire::Event& e) {
  const std::string tenant = display_text(e.tenant);
  const auto seq = static_cast<unsigned long long>(e.seq);
  const auto count = static_cast<unsigned long long>(e.count);
  switch (e.kind) {
    case wire::Event::kGap:
      std::printf("gap          lost %llu event(s); resuming at seq %llu\n", count, seq);
      break;
    case wire::Event::kCleared:
      std::printf("seq %-8llu cleared  every cached block of the pool (%llu)\n", seq, count);
      break;
    case wire::Event::kResized:
      std::printf("seq %-8llu resized  the pool %s to %llu pages\n", seq,
                  wire::event_cause_name(e.cause), count);
      break;
    default:
      std::printf("seq %-8llu %-8s block %s  page %u  tenant %s%s\n", seq,
                  wire::event_kind_name(e.kind), to_hex(e.hash).c_str(), e.page, tenant.c_str(),
                  e.kind == wire::Event::kRemoved
                      ? (std::string("  (") + wire::event_cause_name(e.cause) + ")").c_str()
                      : "");
  }
}

}  // namespace

int events_verb(const Globals& g, uint64_t from_seq, uint64_t count) {
  auto stream = client::EventStream::open(g.socket, g.pool, from_seq);
  if (!succeeded(stream)) return 1;
  client::EventStream& s = *stream.value();
  const std::string pool = json_escape(s.pool().pool_name);
  const wire::SubscribeReply& sub = s.subscribed();
  if (g.json) {
    std::printf(
        "{\"schema\":%d,\"type\":\"subscribed\",\"pool\":\"%s\",\"stream\":\"%016llx\","
        "\"next_seq\":%llu,\"oldest_seq\":%llu}\n",
        kSchema, pool.c_str(), static_cast<unsigned long long>(sub.stream_id),
        static_cast<unsigned long long>(sub.next_seq),
        static_cast<unsigned long long>(sub.oldest_seq));
  } else {
    std::printf("following pool %s: stream %016llx, next seq %llu (oldest held %llu)\n",
                display_text(s.pool().pool_name).c_str(),
                static_cast<unsigned long long>(sub.stream_id),
                static_cast<unsigned long long>(sub.next_seq),
                static_cast<unsigned long long>(sub.oldest_seq));
  }
  std::fflush(stdout);
  uint64_t printed = 0;
  while (count == 0 || printed < count) {
    auto batch = s.next(-1);
    if (!succeeded(batch)) return 1;
    for (const wire::Event& e : batch.value().events) {
      if (g.json) {
        print_json(e, pool);
      } else {
        print_text(e);
      }
      if (count != 0 && ++printed == count) break;
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace kvpool::ctl

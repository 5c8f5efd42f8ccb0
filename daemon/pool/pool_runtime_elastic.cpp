// PoolRuntime, elastic half: the layout made once at create, and one segment more or fewer.
//
// Mechanism (the memory backends and the pool core move pages, daemon/memory/memory_backend.h and
// PagePool::grow/shrink): a pool grows by one segment at the end of its pages region and shrinks
// by its last one. A shrink is all or nothing: the core refuses it while a page past the new end
// is held (pages_in_use, naming how many and the first); cached pages there move to free pages
// below (copied here, before anything else runs) or are evicted, and evicted ones go down to the
// pool's host tier while their segment is still mapped. Only then is the segment unmapped.
//
// Sessions learn of a new segment list by a pool_changed notice (common/wire/protocol.h): the
// Service puts one before the reply of the session whose call resized the pool, the Server
// pushes one to the pool's other sessions; each client then asks for the segments and maps them.
#include <algorithm>
#include <chrono>

#include "common/byte_units.h"
#include "daemon/core/check.h"
#include "daemon/pool/pool_runtime.h"
#include "daemon/pool/pool_set.h"
#include "daemon/telemetry/log.h"

namespace kvpool::daemon {

namespace {

wire::Error resize_error(Errc code, std::string message, uint64_t value = 0) {
  return wire::Error{Status(code, kNoItem, value), std::move(message)};
}

uint64_t pages_of(const Capacity& c, uint64_t per_page) {
  return c.unit == Capacity::Unit::pages ? c.value : c.value / per_page;
}

uint64_t unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace

wire::Result<uint32_t> PoolRuntime::create_elastic(MemoryBackend& backend, uint32_t initial_pages) {
  const PoolConfig& pc = config_;
  const Geometry& g = pc.geometry;
  const uint64_t stride = page_data_bytes(g);
  const uint64_t scale = page_scale_bytes(g);
  const uint64_t per_page = stride + scale;
  const uint64_t gran = backend.granularity();
  uint64_t max_pages = std::min<uint64_t>(pages_of(*pc.max_capacity, per_page), core::kMaxPages);
  const std::string where = "pool " + pc.name + ": ";
  if (max_pages < initial_pages) {
    return resize_error(Errc::invalid_argument, where + "max_capacity (" +
                                                    std::to_string(max_pages) +
                                                    " pages) is below capacity (" +
                                                    std::to_string(initial_pages) + " pages)");
  }
  ElasticLayout l;
  uint64_t pages_per_segment = 0;
  if (pc.layout == KvLayout::layer_major) {
    // Segmented (kernels/paged_kv.h): each segment is a layer_major pool of its own pages, and
    // its size a whole number of plane blocks, so that an engine can view each layer's planes as
    // one tensor of blocks. Pages never straddle segments: the pool is whole segments.
    const uint64_t unit = layer_major_segment_unit(g, gran);
    if (unit > (uint64_t{1} << 32)) {
      return resize_error(Errc::invalid_argument,
                          where + "a layer_major pool's segments must be whole granules (" +
                              human_bytes(gran) + ") and whole blocks of " +
                              human_bytes(stride / (uint64_t{kv_planes(g)} * g.layers)) +
                              " (tokens_per_page × kv_heads × head_dim); their least common "
                              "multiple, " +
                              human_bytes(unit) + ", is too large: use page_major");
    }
    l.segment_bytes = round_up(std::max(pc.segment_size, stride), unit);
    pages_per_segment = l.segment_bytes / stride;
    // Whole segments, rounded up as the first segment is (max_capacity may be passed by less
    // than a segment; the budgets count the bytes mapped), within the page limit.
    max_pages = (max_pages + pages_per_segment - 1) / pages_per_segment * pages_per_segment;
    if (max_pages > core::kMaxPages) {
      max_pages = core::kMaxPages / pages_per_segment * pages_per_segment;
    }
    if (max_pages < initial_pages) {
      return resize_error(Errc::invalid_argument,
                          where + "segments of " + std::to_string(pages_per_segment) +
                              " pages cannot hold capacity (" + std::to_string(initial_pages) +
                              " pages) within the page limit");
    }
    l.pages_region_bytes = max_pages / pages_per_segment * l.segment_bytes;
    l.initial_pages_bytes = std::min(
        (uint64_t{initial_pages} + pages_per_segment - 1) / pages_per_segment * l.segment_bytes,
        l.pages_region_bytes);
    info_.segment_pages = static_cast<uint32_t>(pages_per_segment);
    info_.segment_stride = l.segment_bytes;
  } else {
    l.segment_bytes = round_up(std::max(pc.segment_size, stride), gran);
    l.pages_region_bytes = round_up(max_pages * stride, gran);
    l.initial_pages_bytes =
        std::min(round_up(uint64_t{initial_pages} * stride, l.segment_bytes), l.pages_region_bytes);
    pages_per_segment = std::max<uint64_t>(1, l.segment_bytes / stride);
  }
  l.scales_offset = l.pages_region_bytes;
  l.scales_bytes = scale == 0 ? 0 : round_up(max_pages * scale, gran);
  l.reserve_bytes = l.scales_offset + l.scales_bytes;
  auto memory = backend.create_elastic(l, pc.name);
  if (!memory.ok()) return memory.error();
  memory_ = std::move(memory.value());
  const uint64_t min_pages =
      pc.min_capacity ? pages_of(*pc.min_capacity, per_page) : pages_per_segment;
  elastic_.min_pages = static_cast<uint32_t>(std::clamp<uint64_t>(min_pages, 1, max_pages));
  elastic_.segment_bytes = l.segment_bytes;
  info_.reserved_bytes = memory_->reserved_bytes();
  info_.scales_offset = l.scales_offset;
  info_.max_pages = static_cast<uint32_t>(max_pages);
  const uint64_t pages = std::min(pages_in(memory_->pages_bytes_mapped()), max_pages);
  log_event(LogLevel::info, "pool_elastic",
            {kv("pool", pc.name), kv("pages", pages), kv("min_pages", elastic_.min_pages),
             kv("max_pages", max_pages), kv("segment_bytes", l.segment_bytes),
             kv("reserved", human_bytes(l.reserve_bytes))});
  return static_cast<uint32_t>(pages);
}

void PoolRuntime::resized(bool grew) {
  const uint32_t pages = pages_->num_pages();
  prefix_stats_->resize(pages);
  info_.num_pages = pages;
  info_.segments = memory_->segments();
  info_.segment_bytes = memory_->bytes();
  ++info_.epoch;
  elastic_.hits_at_resize = pages_->stats().counters.hit_blocks;
  ++(grew ? elastic_.grows : elastic_.shrinks);
  elastic_.history[elastic_.resize_count % ElasticState::kHistory] = {unix_ms(), pages};
  ++elastic_.resize_count;
  set_.note_resized();
  events_->append(LoggedEvent{{},
                              pages,
                              kNoPage,
                              0,
                              index_,
                              wire::Event::kResized,
                              grew ? wire::Event::kGrown : wire::Event::kShrunk});
  log_event(LogLevel::info, grew ? "pool_grown" : "pool_shrunk",
            {kv("pool", config_.name), kv("pages", pages), kv("bytes", memory_->bytes()),
             kv("segments", info_.segments.size()), kv("epoch", info_.epoch)});
}

uint64_t PoolRuntime::pages_in(uint64_t bytes) const {
  if (info_.segment_pages != 0) return bytes / info_.segment_stride * info_.segment_pages;
  return bytes / info_.page_stride;
}

void PoolRuntime::grown() {
  const uint64_t pages =
      std::min<uint64_t>(pages_in(memory_->pages_bytes_mapped()), info_.max_pages);
  KVPOOL_CHECK(pages_->grow(static_cast<uint32_t>(pages)).ok());
  resized(true);
}

uint32_t PoolRuntime::pages_after_shrink() const {
  uint64_t last_bytes = 0;
  uint64_t last_offset = 0;
  for (const wire::SegmentInfo& seg : memory_->segments()) {
    if (seg.offset < info_.scales_offset && seg.offset >= last_offset) {
      last_offset = seg.offset;
      last_bytes = seg.bytes;
    }
  }
  const uint64_t mapped = memory_->pages_bytes_mapped();
  return static_cast<uint32_t>(
      std::min<uint64_t>(pages_in(mapped - std::min(mapped, last_bytes)), pages_->num_pages()));
}

uint64_t PoolRuntime::next_segment_bytes() const {
  const uint64_t region = info_.scales_offset;
  return std::min(elastic_.segment_bytes, region - std::min(region, memory_->pages_bytes_mapped()));
}

double PoolRuntime::hits_per_byte() const {
  const uint64_t hits = pages_->stats().counters.hit_blocks - elastic_.hits_at_resize;
  return static_cast<double>(hits) / static_cast<double>(std::max<uint64_t>(1, memory_->bytes()));
}

uint64_t PoolRuntime::bytes_above_min() const {
  const uint64_t mapped = memory_->pages_bytes_mapped();
  const uint64_t min_bytes = info_.segment_pages == 0
                                 ? uint64_t{elastic_.min_pages} * info_.page_stride
                                 : (uint64_t{elastic_.min_pages} + info_.segment_pages - 1) /
                                       info_.segment_pages * info_.segment_stride;
  return mapped - std::min(min_bytes, mapped);
}

wire::Result<bool> PoolRuntime::shrink_last(LooseSegment* loose) {
  if (copies_in_flight_ > 0) {
    // A deferred copy runs on the pool's copier off the loop; a shrink's moves would share it.
    return resize_error(Errc::out_of_pages, "pool " + config_.name +
                                                " is running a daemon-side copy; it gives back "
                                                "no segment until the copy is done");
  }
  const uint32_t old_total = pages_->num_pages();
  const uint32_t new_total = pages_after_shrink();
  if (memory_->segments().size() <= 1 || new_total < elastic_.min_pages || new_total == 0) {
    return resize_error(Errc::invalid_argument,
                        "pool " + config_.name + " cannot shrink below its min_capacity (" +
                            std::to_string(elastic_.min_pages) + " pages) or its first segment");
  }
  std::vector<core::PageMove> moves;
  const Status st = pages_->shrink(new_total, moves);
  if (!st.ok()) {
    return resize_error(st.code(),
                        "pool " + config_.name + ": shrinking to " + std::to_string(new_total) +
                            " pages: " + st.message(),
                        st.value());
  }
  // Copies and demotions read the tail, which is still mapped: describe it at its old size.
  kernels::PagedKv tail = paged_kv();
  tail.num_pages = old_total;
  if (!moves.empty()) {
    std::vector<PageId> src, dst;
    for (const core::PageMove& m : moves) {
      src.push_back(m.from);
      dst.push_back(m.to);
      prefix_stats_->move(m.from, m.to);
    }
    kernels::CopyPagesArgs args;
    args.kv = tail;
    args.num_pairs = static_cast<uint32_t>(moves.size());
    args.src = src.data();
    args.dst = dst.data();
    if (std::string err = memory_->copy_pages(args, old_total); !err.empty()) {
      // The moved pages' bytes are not where the index says: drop them rather than serve them.
      log_event(LogLevel::error, "shrink_copy_failed",
                {kv("pool", config_.name), kv("error", err)});
      index_events_->begin_flush();
      pages_->flush();
      index_events_->end_flush(tiers_empty());
    }
  }
  if (host_tier_) host_tier_->demote(tail);
  // The remote tier's copies would run after the unmap: those evictions are not written.
  if (remote_) remote_->drop_pending_demotions();
  // The tail is unmapped next, and a shrink may be the 8-bit pool's own growth: its evictions
  // are not converted.
  if (converter_) converter_->drop_pending();
  auto r = memory_->shrink_segment(loose);
  KVPOOL_CHECK(r.ok());  // the core refused nothing, and more than one pages segment is mapped
  resized(false);
  return true;
}

}  // namespace kvpool::daemon

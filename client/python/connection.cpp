// kvpool.attach() and Connection: the pool calls of client/connection/connection.h for Python.
//
// Page lists come in as any sequence of ints (a list, a numpy array: converted once, in C) and go
// out as lists of ints. Hints are keyword arguments: priority ('one_off', 'conversation',
// 'system') and pin_ttl_ms. Every call releases the GIL for its round trip.

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>

#include "client/python/bindings.h"
#include "client/python/py_connection.h"
#include "common/stats_counters.h"
#include "common/vllm_block_hash.h"
#include "kernels/pool_view.h"

namespace kvpool::python {

namespace {

using Pages = py::array_t<PageId, py::array::c_style | py::array::forcecast>;

std::span<const PageId> pages_of(const Pages& p, const char* what) {
  if (p.ndim() != 1) {
    throw py::value_error(std::string(what) + " must be a one-dimensional sequence of page ids");
  }
  return {p.data(), static_cast<size_t>(p.size())};
}

PageHints hints_of(const py::object& priority, uint32_t pin_ttl_ms) {
  return PageHints{priority_of(priority), pin_ttl_ms};
}

// Page ids as Python ints; kNoPage (a lookup's block before a sliding window's hit) as None.
py::list to_list(const std::vector<PageId>& pages) {
  py::list out(pages.size());
  for (size_t i = 0; i < pages.size(); ++i)
    out[i] = pages[i] == kNoPage ? py::object(py::none()) : py::object(py::int_(pages[i]));
  return out;
}

py::dict stats_dict(const wire::StatsReply& s) {
  py::dict d;
  d["total"] = s.total;
  d["free"] = s.free;
  d["in_use"] = s.in_use;
  d["cached"] = s.cached;
  d["sessions"] = s.sessions;
  d["session_held_pages"] = s.session_held_pages;
  // Every counter of the pool, named as the counter table names it; those past this side's
  // table (a newer daemon's) are left out.
  for (size_t i = 0; i < s.counters.size() && i < stats::kNumPoolCounters; ++i)
    d[py::str(std::string(stats::kPoolCounters[i].name))] = s.counters[i];
  return d;
}

// The daemon's own figures, named as the daemon counter table names them.
py::dict daemon_dict(const wire::StatsReply& s) {
  py::dict d;
  for (size_t i = 0; i < s.daemon_counters.size() && i < stats::kNumDaemonCounters; ++i)
    d[py::str(std::string(stats::kDaemonCounters[i].name))] = s.daemon_counters[i];
  return d;
}

// A table's names, in its order.
template <class Row, size_t N>
py::tuple names_of(const Row (&table)[N]) {
  py::tuple names(N);
  for (size_t i = 0; i < N; ++i)
    names[i] = py::str(std::string(table[i].name));
  return names;
}

}  // namespace

void bind_connection(py::module_& m) {
  m.attr("POOL_COUNTERS") = names_of(stats::kPoolCounters);
  m.attr("DAEMON_COUNTERS") = names_of(stats::kDaemonCounters);
  py::class_<wire::PoolInfo>(m, "PoolInfo", "The pool a connection is attached to.")
      .def_readonly("name", &wire::PoolInfo::pool_name, "The pool's name in the daemon's config.")
      .def_readonly("backend", &wire::PoolInfo::backend,
                    "The memory backend serving it (\"host\", \"cuda-vmm\", ...).")
      .def_readonly("tenant", &wire::PoolInfo::tenant, "The tenant this session was admitted as.")
      .def_readonly("geometry", &wire::PoolInfo::geometry, "The pool's Geometry.")
      .def_readonly("num_pages", &wire::PoolInfo::num_pages, "Pages the pool holds now.")
      .def_readonly("page_stride", &wire::PoolInfo::page_stride,
                    "Bytes from one page to the next in the mapping.")
      .def_readonly("mapped_bytes", &wire::PoolInfo::segment_bytes,
                    "Bytes of pool memory this process maps.")
      .def_readonly("reserved_bytes", &wire::PoolInfo::reserved_bytes,
                    "the virtual range kept for the pool at its base (its largest size)")
      .def_readonly("max_pages", &wire::PoolInfo::max_pages,
                    "the pages an elastic pool may grow to (num_pages for a fixed pool)")
      .def_readonly("epoch", &wire::PoolInfo::epoch,
                    "the version of the pool's segment list: every grow or shrink increments it")
      .def_readonly("model", &wire::PoolInfo::model,
                    "the hybrid model this pool is a group of (\"\" for a plain pool)")
      .def_readonly("group", &wire::PoolInfo::group, "this pool's index among the model's groups")
      .def_readonly("groups", &wire::PoolInfo::groups,
                    "the model's group names, in order (group g is pool MODEL/NAME)")
      .def_property_readonly(
          "layout", [](const wire::PoolInfo& p) { return std::string(layout_name(p.layout)); },
          "page_major (a page holds every layer) or layer_major (one dense plane per layer)")
      .def_property_readonly(
          "layer_stride", [](const wire::PoolInfo& p) { return kernels::layer_stride_of(p); },
          "bytes from layer l to l+1 in a layer_major pool (inside a segment when it is "
          "segmented); 0 in page_major")
      .def_readonly("scales_offset", &wire::PoolInfo::scales_offset,
                    "byte offset of an 8-bit pool's scales region in its memory (0 for a 16-bit "
                    "pool): float32 [num_pages, layers, kv_heads, planes], kv_scales_view()")
      .def_readonly("segment_pages", &wire::PoolInfo::segment_pages,
                    "a segmented (elastic) layer_major pool's pages per segment; 0 otherwise")
      .def_readonly("segment_stride", &wire::PoolInfo::segment_stride,
                    "bytes from one segment of a segmented layer_major pool to the next; 0 "
                    "otherwise")
      .def(
          "block_index",
          [](const wire::PoolInfo& p, PageId page) {
            return kernels::block_index(kernels::paged_kv_of(p, nullptr), page);
          },
          py::arg("page"),
          "Where page `page` sits in kv_cache_view()'s block dimension: the page itself, except "
          "in a segmented layer_major pool, whose segments are segment_stride bytes apart "
          "(what a block table handed to an engine's own kernels holds).")
      .def("__repr__", [](const wire::PoolInfo& p) {
        return "PoolInfo(name='" + p.pool_name + "', backend='" + p.backend +
               "', num_pages=" + std::to_string(p.num_pages) + ")";
      });

  py::class_<PublishResult>(m, "PublishResult", "What publish() did with one (page, hash) pair.")
      .def_readonly("page", &PublishResult::page,
                    "stored: the page given; duplicate: the page that already had the hash, "
                    "now held by this session")
      .def_property_readonly(
          "duplicate",
          [](const PublishResult& r) { return r.kind == PublishResult::Kind::duplicate; },
          "True when the hash was already published (page is the cached one, now held too; the "
          "caller's page stays held, unpublished, for it to release).")
      .def("__repr__", [](const PublishResult& r) {
        return std::string("PublishResult(page=") + std::to_string(r.page) +
               (r.kind == PublishResult::Kind::duplicate ? ", duplicate=True)"
                                                         : ", duplicate=False)");
      });

  py::class_<PyConnection>(m, "Connection",
                           "A worker's session with kvpoold: pages held by it are released when "
                           "it closes, however the process ends.")
      .def_property_readonly(
          "pool", [](PyConnection& c) { return c.get().conn->pool(); },
          "The PoolInfo of the attached pool.")
      .def_property_readonly(
          "session_id", [](PyConnection& c) { return c.get().conn->session_id(); },
          "The daemon's id for this session (in its logs and stats).")
      .def_property_readonly(
          "device", [](PyConnection& c) { return c.get().conn->device(); },
          "CUDA ordinal of the pool's memory in this process; -1: host memory")
      .def_property_readonly(
          "closed",
          [](const PyConnection& c) {
            if (c.ref == nullptr) return true;
            const ConnectionRef keep = c.ref;
            py::gil_scoped_release nogil;  // another thread's call may hold the lock a while
            std::lock_guard lock(keep->lock);
            return keep->conn->peer_closed();
          },
          "True after close(), or once the daemon's end of the connection is gone (it stopped "
          "or closed the session): every call would then fail.")
      .def(
          "alloc",
          [](PyConnection& c, int64_t count, const py::object& priority, uint32_t pin_ttl_ms) {
            const uint32_t n = page_count(count, "n");
            const PageHints h = hints_of(priority, pin_ttl_ms);
            return to_list(c.call([&](client::Connection& k) { return k.alloc(n, h); }));
          },
          py::arg("n"), py::kw_only(), py::arg("priority") = py::none(), py::arg("pin_ttl_ms") = 0,
          "Allocates n pages, now held by this session.")
      .def(
          "retain",
          [](PyConnection& c, const Pages& pages, const py::object& priority, uint32_t pin_ttl_ms) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            const auto p = pages_of(pages, "pages");
            c.call([&](client::Connection& k) { return k.retain(p, h); });
          },
          py::arg("pages"), py::kw_only(), py::arg("priority") = py::none(),
          py::arg("pin_ttl_ms") = 0, "Takes one more reference to each page.")
      .def(
          "release",
          [](PyConnection& c, const Pages& pages) {
            const auto p = pages_of(pages, "pages");
            c.call([&](client::Connection& k) { return k.release(p); });
          },
          py::arg("pages"),
          "Drops one reference to each page; the last reference of a published page caches it. "
          "Cached pages are evicted in release order: give a sequence's pages back tail first "
          "(reversed), as SequenceCache.release() does, or its first eviction strands the rest.")
      .def(
          "lookup",
          [](PyConnection& c, const std::vector<BlockHash>& chain, const py::object& priority,
             uint32_t pin_ttl_ms) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            return to_list(c.call([&](client::Connection& k) { return k.lookup(chain, h); }));
          },
          py::arg("chain"), py::kw_only(), py::arg("priority") = py::none(),
          py::arg("pin_ttl_ms") = 0,
          "The pages of the longest cached prefix of chain, each now held by this session. On a "
          "sliding or chunked pool the prefix may skip blocks no resumed query reads (before "
          "the window of its last block): those entries are None, and the hit serves a sequence "
          "resuming right after it (one resuming earlier looks up the shorter chain).")
      .def(
          "lookup_with_tiers",
          [](PyConnection& c, const std::vector<BlockHash>& chain, const py::object& priority,
             uint32_t pin_ttl_ms) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            const wire::LookupReply r =
                c.call([&](client::Connection& k) { return k.lookup_with_tiers(chain, h); });
            py::list tiers;
            for (const uint8_t t : r.tiers)
              tiers.append(t == wire::kTierHost        ? "host"
                           : t == wire::kTierConverted ? "converted"
                           : t == wire::kTierRemote    ? "remote"
                           : t == wire::kTierNone      ? "none"
                                                       : "device");
            return py::make_tuple(to_list(r.pages), tiers);
          },
          py::arg("chain"), py::kw_only(), py::arg("priority") = py::none(),
          py::arg("pin_ttl_ms") = 0,
          "As lookup, and which tier served each hit: (pages, tiers), a tier being \"device\", "
          "\"host\" (a block the daemon promoted from the pool's host tier into the page), "
          "\"converted\" (a block the daemon converted back from the 8-bit pool the pool's "
          "evictions go to, convert_evictions_to: 8-bit precision) or \"none\" (a None page: "
          "a block before a sliding window's hit).")
      .def(
          "lookup_groups",
          [](PyConnection& c, const std::vector<BlockHash>& chain, const py::object& priority,
             uint32_t pin_ttl_ms) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            const wire::GroupLookupReply r =
                c.call([&](client::Connection& k) { return k.lookup_groups(chain, h); });
            py::list groups;
            for (const wire::LookupReply& g : r.groups)
              groups.append(to_list(g.pages));
            return groups;
          },
          py::arg("chain"), py::kw_only(), py::arg("priority") = py::none(),
          py::arg("pin_ttl_ms") = 0,
          "A hybrid model's lookup, on a session linked to a session of every other group "
          "(attach(..., link_session=)): per group, in the model's order, the pages of the "
          "longest prefix every group can serve, each held by that group's session (None where "
          "a group's window does not need the block). Every list has the hit's length.")
      .def(
          "reserve",
          [](PyConnection& c, uint32_t max_tokens, const std::vector<std::optional<PageId>>& seeds,
             const py::object& priority, uint32_t pin_ttl_ms) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            std::vector<PageId> s;
            for (const auto& p : seeds)
              s.push_back(p.value_or(kNoPage));
            const wire::ReserveReply r =
                c.call([&](client::Connection& k) { return k.reserve(max_tokens, s, h); });
            return py::make_tuple(r.reservation, to_list(r.pages));
          },
          py::arg("max_tokens"), py::arg("seeds") = std::vector<std::optional<PageId>>{},
          py::kw_only(), py::arg("priority") = py::none(), py::arg("pin_ttl_ms") = 0,
          "A static reservation: (id, block table) of a sequence of up to max_tokens, every page "
          "held now and the table fixed until unreserve(id) or the session's end (release() "
          "refuses its pages). seeds, pages this session holds (a lookup's hit, None for the "
          "blocks a window skipped), come first; the rest are allocated.")
      .def(
          "unreserve",
          [](PyConnection& c, uint64_t reservation) {
            c.call([&](client::Connection& k) { return k.unreserve(reservation); });
          },
          py::arg("reservation"),
          "Gives back a reservation's pages, tail first (published ones stay cached).")
      .def(
          "publish",
          [](PyConnection& c, const Pages& pages, const std::vector<BlockHash>& hashes,
             const py::object& priority, uint32_t pin_ttl_ms, const py::object& tokens,
             std::optional<BlockHash> parent, const std::string& lora_name) {
            const PageHints h = hints_of(priority, pin_ttl_ms);
            const auto p = pages_of(pages, "pages");
            if (p.size() != hashes.size()) {
              throw py::value_error("publish: " + std::to_string(p.size()) + " pages but " +
                                    std::to_string(hashes.size()) + " hashes");
            }
            std::vector<PublishItem> items(p.size());
            for (size_t i = 0; i < p.size(); ++i)
              items[i] = PublishItem{p[i], hashes[i]};
            std::vector<uint32_t> ids;
            if (!tokens.is_none()) ids = token_ids(tokens, "token_ids");
            const client::PublishChain chain{parent, ids, lora_name};
            return c.call([&](client::Connection& k) { return k.publish(items, h, chain); });
          },
          py::arg("pages"), py::arg("hashes"), py::kw_only(), py::arg("priority") = py::none(),
          py::arg("pin_ttl_ms") = 0, py::arg("token_ids") = py::none(),
          py::arg("parent") = py::none(), py::arg("lora_name") = "",
          "Names written pages by their block hashes so every worker can find them. For KV-aware "
          "routers (the daemon's KV events), the blocks may be described as one chain: token_ids "
          "(tokens_per_page per block), parent (the first block's parent hash; None for a "
          "sequence's first block) and lora_name.")
      .def(
          "copy",
          [](PyConnection& c, const Pages& src, const Pages& dst) {
            const auto s = pages_of(src, "src");
            const auto d = pages_of(dst, "dst");
            if (s.size() != d.size()) throw py::value_error("copy: src and dst differ in length");
            std::vector<wire::PageCopy> pairs(s.size());
            for (size_t i = 0; i < s.size(); ++i)
              pairs[i] = wire::PageCopy{s[i], d[i]};
            return c.call([&](client::Connection& k) { return k.copy(pairs); });
          },
          py::arg("src"), py::arg("dst"),
          "The daemon copies whole pages src[i] -> dst[i]; returns when the bytes are in place.")
      .def("stats",
           [](PyConnection& c) {
             return stats_dict(c.call([](client::Connection& k) { return k.stats(); }));
           })
      .def(
          "daemon_stats",
          [](PyConnection& c) {
            return daemon_dict(c.call([](client::Connection& k) { return k.stats(); }));
          },
          "The daemon's own figures (kvpool.DAEMON_COUNTERS: sessions, events_lost, reloads, "
          "sessions_refused, ...), asked of the daemon now.")
      .def(
          "evict",
          [](PyConnection& c, int64_t count) {
            const uint32_t n = page_count(count, "n");
            return c.call([&](client::Connection& k) { return k.evict(n); });
          },
          py::arg("n"), "Admin: drops up to n cached pages in eviction order.")
      .def(
          "flush",
          [](PyConnection& c) { return c.call([](client::Connection& k) { return k.flush(); }); },
          "Admin: drops every cached page.")
      .def(
          "poll_notices",
          [](PyConnection& c) {
            return c.call([](client::Connection& k) { return k.poll_notices(); });
          },
          "Without blocking: follows a grow or shrink the daemon announced (maps the new "
          "segments, unmaps the removed ones); True when the mapping changed. For idle workers; "
          "every other call does it too. Views stay valid: the pool's base never moves.")
      .def(
          "sync",
          [](PyConnection& c) {
            return c.call([](client::Connection& k) { return k.sync_segments(); });
          },
          "Asks the daemon for the pool's segments and maps the new ones now (one round trip); "
          "True when the mapping changed. For a page another group's lookup_groups returned "
          "past pool.num_pages (HybridModel.lookup does this).")
      .def(
          "resize",
          [](PyConnection& c, uint32_t pages) {
            return c.call([&](client::Connection& k) { return k.resize(pages); });
          },
          py::arg("pages"),
          "Admin: resizes an elastic pool by whole segments within its min and max (grows to the "
          "first size at or above pages, or shrinks while it stays at or above it); "
          "returns its size in pages now.")
      .def("close", &PyConnection::close,
           "Drops this handle; the session ends when no view or SequenceCache uses it either.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyConnection& c, const py::args&) { c.close(); });

  m.def(
      "attach",
      [](const std::optional<std::string>& socket, const std::string& worker,
         const std::string& pool, bool map_memory, uint64_t link_session,
         const py::object& hasher) {
        const std::string path = socket.value_or(client::default_socket_path());
        const auto memory =
            map_memory ? client::Connection::Memory::map : client::Connection::Memory::none;
        HashScheme scheme = default_hash_scheme();
        if (py::isinstance<BlockHasher>(hasher)) {
          scheme = hasher.cast<BlockHasher&>().scheme();
        } else if (py::isinstance<VllmBlockHasher>(hasher)) {
          scheme = VllmBlockHasher::scheme();
        } else if (!hasher.is_none()) {
          throw py::type_error("hasher: expected a BlockHasher or a VllmBlockHasher, got " +
                               std::string(py::str(hasher.get_type())));
        }
        auto r = [&] {
          py::gil_scoped_release nogil;
          return client::Connection::attach(path, worker, pool, memory, link_session, scheme);
        }();
        auto shared = std::make_shared<SharedConnection>();
        shared->conn = value_or_raise(std::move(r));
        return PyConnection{std::move(shared)};
      },
      py::arg("socket") = py::none(), py::arg("worker") = "python", py::arg("pool") = "",
      py::arg("map_memory") = true, py::arg("link_session") = 0, py::arg("hasher") = py::none(),
      "Connects to kvpoold (socket: $KVPOOL_SOCKET or the daemon's default) and attaches to a "
      "pool (the default pool when empty), mapping its memory unless map_memory is False. For a "
      "group of a hybrid model, link_session names this process's session of another group of "
      "the model, so that lookup_groups on either answers for every group. hasher: the "
      "BlockHasher or VllmBlockHasher this worker names blocks with (default: the library's "
      "BlockHasher); the daemon refuses a hashing scheme other than the pool's "
      "(pools[].hash_scheme), naming both.");
  m.def("default_socket_path", &client::default_socket_path);
}

}  // namespace kvpool::python

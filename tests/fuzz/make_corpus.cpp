// Writes the seed corpus of kvpool_frame_fuzz (tests/fuzz/corpus/frames): byte streams of frames
// made with the real encoder, so that every seed starts where the fuzzer should, inside the
// Service rather than at the decoder's first refusal.
//
//   kvpool_frame_corpus DIR      (writes DIR/NN-name, one file per stream)
//
// The seeds: hello and then each request type for root; the pool operations' error paths; each
// non-root credential class; long multi-frame streams; and streams made malformed on purpose
// (cut short, bad magic, version or length, unknown opcodes, trailing bytes, forged counts).
// frame_fuzz.cpp reads the credentials from the low two bits of the first frame's request id:
// 0 root, 1 tenant alpha, 2 the default tenant, 3 admin through admin_group. A fresh Service
// hands out pages 0, 1, 2, ... in order, which is what the page ids below rely on.
//
// The committed files are what the fuzz test uses; run this again only to change the seeds.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/wire/protocol.h"

namespace {

using namespace kvpool;
using namespace kvpool::wire;

using Bytes = std::vector<std::byte>;

enum Peer : uint32_t { kRoot = 0, kAlpha = 1, kDefault = 2, kGroupAdmin = 3 };

BlockHash hash(uint64_t i) {
  return BlockHash{0x9E3779B97F4A7C15ull * (i + 1), i};
}

std::vector<BlockHash> chain(uint64_t from, uint64_t n) {
  std::vector<BlockHash> c;
  for (uint64_t i = 0; i < n; ++i)
    c.push_back(hash(from + i));
  return c;
}

std::vector<PublishItem> publish_items(std::vector<PageId> pages, uint64_t first_hash) {
  std::vector<PublishItem> items;
  for (size_t i = 0; i < pages.size(); ++i)
    items.push_back(PublishItem{pages[i], hash(first_hash + i)});
  return items;
}

// The frames of `requests`, the first with request id `peer` (the credentials), the next ones
// with ids that keep the same low bits.
Bytes stream(Peer peer, const std::vector<Request>& requests) {
  Bytes out;
  uint32_t id = peer;
  for (const Request& r : requests) {
    encode_request(id, r, out);
    id += 4;
  }
  return out;
}

Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts)
    out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A raw frame: any header fields, any payload.
Bytes raw(uint32_t magic, uint32_t length, uint16_t version, uint16_t opcode, uint32_t id,
          const Bytes& payload) {
  Bytes out(kHeaderBytes);
  std::memcpy(out.data(), &magic, 4);
  std::memcpy(out.data() + 4, &length, 4);
  std::memcpy(out.data() + 8, &version, 2);
  std::memcpy(out.data() + 10, &opcode, 2);
  std::memcpy(out.data() + 12, &id, 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

Bytes u32(uint32_t v) {
  Bytes b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

HelloRequest hello(std::string pool = "") {
  return HelloRequest{"fuzz-worker", std::move(pool)};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kvpool_frame_corpus DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  int n = 0;
  auto put = [&](const std::string& name, const Bytes& bytes) {
    char prefix[8];
    std::snprintf(prefix, sizeof prefix, "%02d-", n++);
    std::ofstream f(dir / (prefix + name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  };
  const std::vector<PageId> p012 = {0, 1, 2};

  // Root: hello, then each request type.
  put("hello", stream(kRoot, {hello()}));
  put("hello-bf16-pool", stream(kRoot, {hello("bf16")}));
  put("hello-no-such-pool", stream(kRoot, {hello("nope")}));
  put("alloc", stream(kRoot, {hello(), AllocRequest{4}}));
  put("retain", stream(kRoot, {hello(), AllocRequest{2}, RetainRequest{{0, 1, 0}}}));
  put("release", stream(kRoot, {hello(), AllocRequest{3}, ReleaseRequest{{2, 1}}}));
  put("lookup-miss", stream(kRoot, {hello(), LookupRequest{chain(0, 3)}}));
  put("publish", stream(kRoot, {hello(), AllocRequest{3}, PublishRequest{publish_items(p012, 0)}}));
  put("publish-release-lookup-hit",
      stream(kRoot, {hello(), AllocRequest{3}, PublishRequest{publish_items(p012, 0)},
                     ReleaseRequest{p012}, LookupRequest{chain(0, 4)}}));
  put("stats", stream(kRoot, {hello(), AllocRequest{1}, StatsRequest{}}));
  put("evict", stream(kRoot, {hello(), AllocRequest{4}, PublishRequest{publish_items({0, 1}, 0)},
                              ReleaseRequest{{0, 1, 2, 3}}, EvictRequest{1}}));
  put("flush", stream(kRoot, {hello(), AllocRequest{2}, PublishRequest{publish_items({0, 1}, 0)},
                              ReleaseRequest{{0, 1}}, FlushRequest{}}));
  put("sessions", stream(kRoot, {hello(), SessionsRequest{}}));
  put("pages", stream(kRoot, {hello(), AllocRequest{3}, PublishRequest{publish_items({0}, 0)},
                              ReleaseRequest{{0}}, PagesRequest{}}));
  put("copy", stream(kRoot, {hello(), AllocRequest{4}, CopyRequest{{{0, 2}, {1, 3}}}}));
  put("copy-bf16", stream(kRoot, {hello("bf16"), AllocRequest{3}, CopyRequest{{{0, 1}, {0, 2}}}}));
  put("prefixes", stream(kRoot, {hello(), AllocRequest{2}, PublishRequest{publish_items({0, 1}, 0)},
                                 LookupRequest{chain(0, 2)}, PrefixesRequest{10}}));
  put("reload", stream(kRoot, {hello(), ReloadRequest{}}));
  put("subscribe-new", stream(kRoot, {hello(), SubscribeRequest{0}}));
  put("subscribe-replay",
      stream(kRoot, {hello(), AllocRequest{3}, PublishRequest{publish_items(p012, 0)},
                     ReleaseRequest{p012}, EvictRequest{1}, FlushRequest{}, SubscribeRequest{1}}));
  put("snapshot", stream(kRoot, {hello(), SnapshotRequest{}}));
  put("segments-resize", stream(kRoot, {hello(), SegmentsRequest{}, ResizeRequest{8},
                                        AllocRequest{2}, SegmentsRequest{}}));

  // Hints: priority classes and pins on every call that takes them, then what is refused: a
  // pin longer than limits.max_pin_ttl_ms, more pins than the tenant's share of the pool.
  put("hints-and-pins",
      stream(kRoot,
             {hello(), AllocRequest{3, PageHints{Priority::conversation, 1000}},
              PublishRequest{publish_items(p012, 0), PageHints{Priority::system, 0}},
              RetainRequest{{0, 1}, PageHints{Priority::none, 5000}}, ReleaseRequest{p012},
              ReleaseRequest{{0, 1}}, LookupRequest{chain(0, 3), PageHints{Priority::one_off, 10}},
              AllocRequest{2, PageHints{Priority::none, 4000000}},
              AllocRequest{15, PageHints{Priority::one_off, 100}}, FlushRequest{}}));

  // Order and session state.
  put("before-hello", stream(kRoot, {AllocRequest{1}, StatsRequest{}, hello(), StatsRequest{}}));
  put("hello-twice", stream(kRoot, {hello(), hello("bf16")}));
  put("after-subscribe", stream(kRoot, {hello(), SubscribeRequest{0}, StatsRequest{}}));
  put("subscribe-future", stream(kRoot, {hello(), SubscribeRequest{1000}, SubscribeRequest{0}}));

  // Pool operations' refusals.
  put("capacity-and-out-of-pages",
      stream(kRoot, {hello("bf16"), AllocRequest{17}, AllocRequest{10}, AllocRequest{10}}));
  put("publish-refusals",
      stream(kRoot,
             {hello(), AllocRequest{2},
              PublishRequest{{PublishItem{0, hash(1)}, PublishItem{0, hash(2)}}},
              PublishRequest{publish_items({0}, 1)}, PublishRequest{publish_items({0}, 2)},
              PublishRequest{publish_items({5}, 3)}, PublishRequest{publish_items({1}, 1)}}));
  put("release-refusals",
      stream(kRoot, {hello(), AllocRequest{1}, ReleaseRequest{{0, 0}}, ReleaseRequest{{7}},
                     ReleaseRequest{{0}}, ReleaseRequest{{0}}, RetainRequest{{0}}}));
  put("copy-refusals",
      stream(kRoot, {hello(), AllocRequest{3}, PublishRequest{publish_items({2}, 0)},
                     CopyRequest{{{0, 2}}}, CopyRequest{{{0, 0}}}, CopyRequest{{{0, 1000}}},
                     CopyRequest{{{0, 1}, {1, 0}}}, CopyRequest{{{0, 1}, {2, 1}}},
                     CopyRequest{{{0, 9}}}}));
  put("lookup-long", stream(kRoot, {hello(), AllocRequest{8},
                                    PublishRequest{publish_items({0, 1, 2, 3, 4, 5, 6, 7}, 0)},
                                    LookupRequest{chain(0, 64)}, LookupRequest{chain(4, 8)}}));
  put("prefixes-limits",
      stream(kRoot, {hello(), PrefixesRequest{0}, PrefixesRequest{10001}, PrefixesRequest{1}}));

  // Other credentials.
  put("alpha",
      stream(kAlpha, {hello(), AllocRequest{2}, PublishRequest{publish_items({0, 1}, 0)},
                      EvictRequest{1}, FlushRequest{}, PrefixesRequest{5}, SubscribeRequest{1}}));
  put("alpha-bf16-denied", stream(kAlpha, {hello("bf16"), hello()}));
  put("default-tenant-quotas",
      stream(kDefault, {hello(), AllocRequest{45}, AllocRequest{50}, AllocRequest{30},
                        AllocRequest{20}, FlushRequest{}, ReloadRequest{}, StatsRequest{}}));
  put("group-admin",
      stream(kGroupAdmin, {hello(), AllocRequest{2}, PublishRequest{publish_items({0, 1}, 0)},
                           ReleaseRequest{{1}}, EvictRequest{5}, FlushRequest{}, ReloadRequest{},
                           SessionsRequest{}}));

  // A long stream of everything.
  put("everything",
      stream(kRoot, {hello(), AllocRequest{6}, PublishRequest{publish_items({0, 1, 2}, 0)},
                     RetainRequest{{3, 4}}, CopyRequest{{{0, 3}, {1, 4}}}, ReleaseRequest{{3, 4}},
                     ReleaseRequest{{2, 1, 0}}, LookupRequest{chain(0, 5)}, StatsRequest{},
                     PagesRequest{}, SessionsRequest{}, PrefixesRequest{100}, SnapshotRequest{},
                     EvictRequest{1}, FlushRequest{}, ReloadRequest{}, AllocRequest{40},
                     PublishRequest{publish_items({10, 11}, 20)}, SubscribeRequest{1}}));

  // Malformed on purpose.
  const Bytes good = stream(kRoot, {hello(), AllocRequest{2}, StatsRequest{}});
  put("cut-short", Bytes(good.begin(), good.end() - 3));
  put("bad-magic", cat({stream(kRoot, {hello()}), raw(0x4C50564A, 0, kProtocolVersion, 7, 4, {}),
                        stream(kRoot, {StatsRequest{}})}));
  put("bad-version", cat({stream(kRoot, {hello()}), raw(kFrameMagic, 0, 1, 7, 4, {})}));
  put("too-large", cat({stream(kRoot, {hello()}),
                        raw(kFrameMagic, kMaxPayloadBytes + 1, kProtocolVersion, 2, 4, u32(1))}));
  put("unknown-opcodes-then-stats",
      cat({stream(kRoot, {hello()}), raw(kFrameMagic, 4, kProtocolVersion, 13, 4, u32(0)),
           raw(kFrameMagic, 0, kProtocolVersion, 24, 8, {}),
           raw(kFrameMagic, 0, kProtocolVersion, 7 | kReplyBit, 12, {}),
           stream(kRoot, {StatsRequest{}})}));
  put("trailing-bytes-then-stats",
      cat({stream(kRoot, {hello()}),
           raw(kFrameMagic, 8, kProtocolVersion, 2, 4, cat({u32(1), u32(0)})),
           raw(kFrameMagic, 1, kProtocolVersion, 7, 8, {std::byte{0}}),
           stream(kRoot, {StatsRequest{}})}));
  put("forged-counts", cat({stream(kRoot, {hello()}),
                            raw(kFrameMagic, 4, kProtocolVersion, 3, 4, u32(kMaxBatch + 1)),
                            raw(kFrameMagic, 8, kProtocolVersion, 5, 8, cat({u32(1000), u32(0)})),
                            raw(kFrameMagic, 4, kProtocolVersion, 2, 12, u32(kMaxBatch + 1)),
                            raw(kFrameMagic, 4, kProtocolVersion, 12, 16, u32(UINT32_MAX)),
                            stream(kRoot, {StatsRequest{}})}));
  put("long-name",
      cat({raw(kFrameMagic, 8 + kMaxNameBytes + 1, kProtocolVersion, 1, 0,
               cat({u32(kMaxNameBytes + 1), Bytes(kMaxNameBytes + 1, std::byte{'w'}), u32(0)})),
           stream(kRoot, {hello()})}));
  put("header-only", Bytes(good.begin(), good.begin() + kHeaderBytes));
  put("short", Bytes(good.begin(), good.begin() + 10));
  std::printf("kvpool_frame_corpus: %d streams in %s\n", n, dir.c_str());
  return 0;
}

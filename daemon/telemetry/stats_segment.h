// StatsSegment: the read-only shared-memory stats segment kvpoold publishes its snapshot into.
//
// Where readers find it: a file beside the socket, "<socket path>.stats" (DESIGN leaves this
// open; docs/ARCHITECTURE.md says why a file and not a descriptor passed by an op: a reader then
// needs no round trip through the event loop at all, not even a hello). The file is created
// fresh at start (a stale one, left by a daemon that was killed, is replaced: the socket check
// has already made sure no other daemon serves this path), with mode 0600 plus read for group
// and others where the socket grants them access, and the socket's group, so exactly the peers
// that may connect may read it; nobody but the daemon may write it. It is mapped shared and
// removed when the daemon stops. The layout and the seqlock are common/stats_layout.h.
//
// Without a file (metrics.stats_segment: false, or the file could not be created) an anonymous
// mapping takes its place, so the metrics endpoint still reads snapshots the same way.
//
// Thread-safety: publish() from one thread (the event loop); read() from any thread.
// Error policy: create_file() returns an Error naming the path and the failing call.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/wire/protocol.h"

namespace kvpool::daemon {

class StatsSegment {
 public:
  static std::string path_for(const std::string& socket_path) { return socket_path + ".stats"; }

  static wire::Result<std::unique_ptr<StatsSegment>> create_file(const std::string& path,
                                                                 size_t snapshot_bytes,
                                                                 uint32_t socket_mode,
                                                                 const std::string& group);
  static wire::Result<std::unique_ptr<StatsSegment>> create_anonymous(size_t snapshot_bytes);
  ~StatsSegment();  // unmaps, and removes the file
  StatsSegment(const StatsSegment&) = delete;
  StatsSegment& operator=(const StatsSegment&) = delete;

  // Publishes one snapshot of exactly the size given at creation.
  void publish(std::span<const std::byte> snapshot);
  // The newest snapshot; "" on success, else why there is none.
  std::string read(std::vector<std::byte>& snapshot) const;
  const std::string& path() const { return path_; }  // "" when anonymous

 private:
  StatsSegment(std::byte* base, size_t bytes, std::string path)
      : base_(base), bytes_(bytes), path_(std::move(path)) {}

  std::byte* base_;
  size_t bytes_;
  std::string path_;
};

}  // namespace kvpool::daemon

// ModelConnection: a worker's sessions with a hybrid model (a pool with KV groups, kvpoold's
// pools[].groups): one Connection per group, each mapping its group's pool, the later ones
// linked to the first in hello so that one lookup takes every group's pages (docs/
// ARCHITECTURE.md, "Hybrid models").
//
// Each group is a pool of its own (MODEL/GROUP): alloc, publish, release and the rest go to
// group(g) with that group's page ids. A block has one hash in every group (one chain per
// sequence); lookup() answers the longest prefix every group can serve, each group's pages held
// by its own session. A plain pool works too, as a model of one group.
//
// Thread-safety: as Connection (one call at a time). Errors: Connection's, naming the group.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/connection/connection.h"

namespace kvpool::client {

class ModelConnection {
 public:
  // Attaches to every group of `model` (a hybrid model's name, or any of its groups' pools),
  // each hello naming `hash_scheme` (Connection::attach).
  static Result<std::unique_ptr<ModelConnection>> attach(
      const std::string& socket_path, const std::string& worker_name, const std::string& model,
      Connection::Memory memory = Connection::Memory::map,
      const HashScheme& hash_scheme = default_hash_scheme());

  // Groups in the model's order; their names (group g's pool is model()/name).
  size_t num_groups() const { return groups_.size(); }
  Connection& group(size_t g) { return *groups_[g]; }
  const std::string& model() const { return model_; }
  const std::vector<std::string>& group_names() const { return names_; }

  // The longest prefix of `chain` every group can serve now, each group's part held by its
  // session (kNoPage where its window does not need the block). Each group's mapping covers its
  // pages when this returns.
  Result<wire::GroupLookupReply> lookup(std::span<const BlockHash> chain,
                                        const PageHints& hints = {});

 private:
  std::string model_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Connection>> groups_;
};

}  // namespace kvpool::client

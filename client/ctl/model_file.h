// A file of model geometries in the form of shared/data/models.yaml: `models:`, a list of
// {name, layers, groups: [{kind, layers, q_heads, kv_heads, head_dim, window, sinks} or
// {kind: latent, layers, q_heads, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim,
// v_head_dim}]}, the groups' layers adding up to the model's. Read by kvpoolctl plan --models.
#pragma once

#include <string>
#include <vector>

#include "common/kv_plan.h"

namespace kvpool::ctl {

struct ModelShape {
  std::string name;
  uint32_t layers = 0;
  std::vector<LayerGroup> groups;
};

// Reads `path` into `out`; on failure returns "PATH:LINE: what" (an unknown key, a missing or bad
// field, a group that does not fit its kind) and leaves `out` empty.
std::string load_model_file(const std::string& path, std::vector<ModelShape>& out);

}  // namespace kvpool::ctl

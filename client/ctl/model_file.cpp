#include "client/ctl/model_file.h"

#include <yaml-cpp/yaml.h>

#include <limits>
#include <set>

namespace kvpool::ctl {
namespace {

// A failure at a node: "PATH:LINE: where: what".
struct Failure {
  std::string message;
};

[[noreturn]] void fail(const std::string& path, const YAML::Node& n, const std::string& where,
                       const std::string& what) {
  throw Failure{path + ":" + std::to_string(n.Mark().line + 1) + ": " + where + ": " + what};
}

void only_keys(const std::string& path, const YAML::Node& n, const std::string& where,
               const std::set<std::string>& keys) {
  if (!n.IsMap()) fail(path, n, where, "expected a mapping");
  for (const auto& kv : n) {
    const std::string key = kv.first.as<std::string>();
    if (keys.count(key) == 0) fail(path, kv.first, where, "unknown key '" + key + "'");
  }
}

// A mapping's entry that must be a non-empty string.
std::string text(const std::string& path, const YAML::Node& map, const std::string& where,
                 const char* key) {
  const YAML::Node n = map[key];
  if (!n || !n.IsScalar() || n.Scalar().empty()) {
    fail(path, n ? n : map, where + "." + key, "expected a non-empty string");
  }
  return n.Scalar();
}

uint32_t count(const std::string& path, const YAML::Node& map, const std::string& where,
               const char* key, bool required) {
  const YAML::Node n = map[key];
  if (!n) {
    if (required) fail(path, map, where, std::string("missing ") + key);
    return 0;
  }
  try {
    const auto v = n.as<int64_t>();
    if (v < 0 || v > std::numeric_limits<uint32_t>::max()) throw YAML::BadConversion(n.Mark());
    return static_cast<uint32_t>(v);
  } catch (const YAML::BadConversion&) {
    fail(path, n, where + "." + key, "expected a whole number from 0 to 4294967295");
  }
}

LayerGroup read_group(const std::string& path, const YAML::Node& n, const std::string& where) {
  only_keys(path, n, where,
            {"kind", "layers", "q_heads", "kv_heads", "head_dim", "window", "sinks", "kv_lora_rank",
             "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"});
  LayerGroup g;
  if (!n["kind"]) fail(path, n, where, "missing kind (full, sliding, chunked or latent)");
  const std::string kind = text(path, n, where, "kind");
  const auto k = parse_attention_kind(kind);
  if (!k)
    fail(path, n["kind"], where + ".kind",
         "'" + kind + "' is not full, sliding, chunked or latent");
  g.kind = *k;
  g.layers = count(path, n, where, "layers", true);
  g.q_heads = count(path, n, where, "q_heads", false);
  g.kv_heads = count(path, n, where, "kv_heads", false);
  g.head_dim = count(path, n, where, "head_dim", false);
  g.window = count(path, n, where, "window", false);
  g.latent_dim = count(path, n, where, "kv_lora_rank", false);
  g.rope_dim = count(path, n, where, "qk_rope_head_dim", false);
  g.nope_dim = count(path, n, where, "qk_nope_head_dim", false);
  g.v_head_dim = count(path, n, where, "v_head_dim", false);
  if (n["sinks"]) {
    try {
      g.sinks = n["sinks"].as<bool>();
    } catch (const YAML::BadConversion&) {
      fail(path, n["sinks"], where + ".sinks", "expected true or false");
    }
  }
  if (const std::string e = validate_group(g); !e.empty()) fail(path, n, where, e);
  return g;
}

}  // namespace

std::string load_model_file(const std::string& path, std::vector<ModelShape>& out) {
  out.clear();
  try {
    const YAML::Node root = YAML::LoadFile(path);
    only_keys(path, root, "(top level)", {"models"});
    const YAML::Node models = root["models"];
    if (!models || !models.IsSequence()) fail(path, root, "models", "expected a list of models");
    std::vector<ModelShape> read;
    for (size_t i = 0; i < models.size(); ++i) {
      const YAML::Node m = models[i];
      const std::string where = "models[" + std::to_string(i) + "]";
      only_keys(path, m, where, {"name", "layers", "groups"});
      ModelShape s;
      if (!m["name"]) fail(path, m, where, "missing name");
      s.name = text(path, m, where, "name");
      s.layers = count(path, m, where, "layers", true);
      const YAML::Node groups = m["groups"];
      if (!groups || !groups.IsSequence() || groups.size() == 0) {
        fail(path, m, where + ".groups", "expected a list of at least one layer group");
      }
      uint64_t layers = 0;
      for (size_t j = 0; j < groups.size(); ++j) {
        s.groups.push_back(
            read_group(path, groups[j], where + ".groups[" + std::to_string(j) + "]"));
        layers += s.groups.back().layers;
      }
      if (layers != s.layers) {
        fail(path, m, where,
             "its groups have " + std::to_string(layers) + " layers, not the model's " +
                 std::to_string(s.layers));
      }
      read.push_back(std::move(s));
    }
    out = std::move(read);
    return {};
  } catch (const Failure& f) {
    return f.message;
  } catch (const YAML::BadFile&) {
    return path + ": cannot read the file";
  } catch (const YAML::Exception& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg;
  }
}

}  // namespace kvpool::ctl

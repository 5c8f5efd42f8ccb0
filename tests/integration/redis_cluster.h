// A real Redis Cluster for the remote tier's tests: scripts/redis-cluster.sh's 3 masters and 3
// replicas on loopback ports of the test's own, in a temporary directory, stopped and removed
// with the object.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/integration/daemon_harness.h"

namespace kvpool::testing {

class RedisCluster {
 public:
  // Ports base..base+5; `extra`: more redis-server arguments for every node (REDIS_EXTRA).
  explicit RedisCluster(uint16_t base, const std::string& extra = "") : base_(base) {
    dir_ = std::string("/tmp/kvpool-redis-test-") + std::to_string(::getpid()) + "-" +
           std::to_string(base);
    std::string out;
    const std::string env = extra.empty() ? "" : "REDIS_EXTRA='" + extra + "' ";
    started_ = run_command(env + "bash " + script() + " start " + dir_ + " " +
                               std::to_string(base) + " 2>&1",
                           out) == 0;
    output_ = out;
  }
  ~RedisCluster() { stop(); }
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  bool started() const { return started_; }
  const std::string& output() const { return output_; }
  uint16_t port(int i) const { return static_cast<uint16_t>(base_ + i); }
  // The YAML list of seed nodes (two of them: the client finds the rest).
  std::string seeds() const {
    return "[\"127.0.0.1:" + std::to_string(port(0)) +
           "\", \"127.0.0.1:" + std::to_string(port(1)) + "\"]";
  }
  // redis-cli against node i, in cluster mode (-c follows MOVED); its output.
  std::string cli(int i, const std::string& args) const {
    std::string out;
    (void)run_command("redis-cli -c -p " + std::to_string(port(i)) + " " + args + " 2>&1", out);
    return out;
  }
  // Every key of the cluster that starts with `prefix` (SCAN on each master).
  std::vector<std::string> keys(const std::string& prefix) const {
    std::vector<std::string> all;
    for (int i = 0; i < 6; ++i) {
      if (cli(i, "role").rfind("master", 0) != 0) continue;
      const std::string out = cli(i, "--scan --pattern '" + prefix + "*'");
      size_t at = 0;
      while (at < out.size()) {
        const size_t nl = out.find('\n', at);
        const std::string line = out.substr(at, nl - at);
        if (!line.empty()) all.push_back(line);
        if (nl == std::string::npos) break;
        at = nl + 1;
      }
    }
    return all;
  }
  // The pid of node i's redis-server.
  pid_t pid(int i) const {
    std::string out;
    (void)run_command("cat " + dir_ + "/" + std::to_string(port(i)) + "/redis.pid", out);
    return static_cast<pid_t>(std::atoi(out.c_str()));
  }
  void stop() {
    if (dir_.empty()) return;
    std::string out;
    (void)run_command("bash " + script() + " stop " + dir_ + " 2>&1", out);
    dir_.clear();
  }

 private:
  static std::string script() {
    return std::string(KVPOOL_SOURCE_DIR) + "/scripts/redis-cluster.sh";
  }

  uint16_t base_;
  std::string dir_;
  bool started_ = false;
  std::string output_;
};

// A base port for this test process's cluster: six ports of its own, apart from other tests'
// clusters running at once (ctest -j). Data ports stay in [10000, 16000) and so bus ports (data
// + 10000) in [20000, 26000): no cluster's bus meets another's data, and both stay below the
// kernel's ephemeral ports (32768 up), which outgoing connections take at random.
inline uint16_t cluster_base_port(int test_index) {
  return static_cast<uint16_t>(10000 + (::getpid() % 500) * 12 + (test_index % 2) * 6);
}

}  // namespace kvpool::testing

// What the pool checks share (tests/gpu/pool_check.cpp, tests/integration/device_pool_test.cpp):
// a prompt of kPromptTokens tokens whose K/V every worker computes the same way, appended into
// pool pages and decoded through PoolKernels, with staging through device memory when the pool
// is on a GPU, and page images read back to the host for byte comparisons.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/connection/connection.h"
#include "client/worker/pool_kernels.h"
#include "tests/integration/daemon_harness.h"

namespace kvpool::gpu_check {

inline constexpr uint32_t kLayers = 2;
inline constexpr uint32_t kKvHeads = 8;
inline constexpr uint32_t kHeadDim = 128;
inline constexpr uint32_t kTokensPerPage = 16;
inline constexpr uint32_t kQHeads = 32;         // groups of 4 query heads per KV head
inline constexpr uint32_t kPromptTokens = 100;  // 6 full pages and 4 tokens in a 7th
inline constexpr uint32_t kFullPages = kPromptTokens / kTokensPerPage;

// A kvpoold config of one pool of that geometry, 256 pages.
std::string pool_config(const std::string& backend, const std::string& dtype,
                        const std::string& extra = "");

BlockHash prompt_hash(uint32_t block);

// Appends prompt tokens [first, last) of every layer; `pages` holds the prompt from token
// first_page_token on (page i: tokens first_page_token + 16·i …).
std::string append_prompt(client::PoolKernels& k, const std::vector<PageId>& pages,
                          uint32_t first_page_token, uint32_t first, uint32_t last);
inline std::string append_prompt(client::PoolKernels& k, const std::vector<PageId>& pages,
                                 uint32_t first, uint32_t last) {
  return append_prompt(k, pages, first, first, last);
}

// Decode of one fixed query over the whole prompt (`table`: its pages) for every layer, with
// split-KV chunks of 32 tokens; the outputs of all layers, on the host. Sets err on failure.
std::vector<float> decode_prompt(client::PoolKernels& k, const std::vector<PageId>& table,
                                 std::string& err);

// The same decode with the CPU kernels over page images of `table` (page_major pools): what the
// pool's kernels must match within a few ulps of the output's range. Sets err on failure.
std::vector<float> decode_prompt_on_cpu(const client::Connection& c,
                                        const std::vector<PageId>& table, std::string& err);

// "" when the kFullPages pages `found` hold exactly what the CPU append of the prompt writes
// (data bytes equal, scales within 1e-6); else what differs. page_major pools.
std::string compare_with_cpu_append(const client::Connection& c, const std::vector<PageId>& found);

// Page p's bytes and, for 8-bit pools, its scales, copied to the host; empty when a copy from
// device memory failed.
std::vector<std::byte> page_image(const client::Connection& c, PageId p);

// Worker A of the checks: attaches to `socket`, appends the prompt into kFullPages + 1 new pages
// and publishes the full ones under prompt_hash(i); with `release`, lets its pages go after.
// Returns 0 or report()'s code.
int publish_prompt(const std::string& socket, bool release);

// Worker B's check of the prompt's kFullPages pages `found` (from a lookup): appends the tail
// into a page of its own, recomputes the whole prompt into pages of its own, and requires the
// found pages to equal the recomputed ones byte for byte and the decode over them (plus the tail)
// to equal the decode over the recomputation, finite, and the CPU kernels' decode over the same
// bytes within a few ulps; the pages must also equal the CPU append of the same tokens. Returns 0
// or report()'s code (3 to 11).
int check_reused_prompt(client::Connection& conn, const std::vector<PageId>& found);

// Prints "what" to stderr and returns code (for worker processes' exit codes).
int report(int code, const std::string& what);

// The command line the pool and tier checks share.
struct CheckOptions {
  std::string backend = "fake-device";
  std::string dtype = "bf16";
  std::string daemon_log;  // kvpoold's log is appended here at the end, when set
};
// Parses --kvpoold PATH (sets $KVPOOLD_BIN), --backend, --dtype, --daemon-log FILE, --version,
// --help. Returns -1 to go on, else the exit code (0 after --version/--help, 2 on bad usage).
int parse_check_options(int argc, char** argv, const char* tool, const char* backends,
                        CheckOptions& o);

// Starts `d` (60 s allowed on CUDA backends, whose first CUDA call can be slow). Returns 0 when
// it runs; else prints its log and returns 77 when a CUDA backend failed on a machine without an
// NVIDIA device node, 1 otherwise (a daemon that fails beside a GPU is a failure, not a skip).
int start_daemon(testing::Daemon& d, const std::string& backend);

// Appends the daemon's log, under a title line, to `path` (nothing when path is empty).
void keep_daemon_log(const testing::Daemon& d, const std::string& path, const std::string& title);

// The same if this process is ended by SIGTERM (a step's timeout): a hung check still leaves the
// daemon's log behind, then dies of the signal. Forked workers inherit the handler but do not
// copy. One daemon per process.
void keep_daemon_log_on_sigterm(const testing::Daemon& d, const std::string& path,
                                const std::string& title);

}  // namespace kvpool::gpu_check

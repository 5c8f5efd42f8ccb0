// CUDA implementations of the kvpool kernels (kernels/paged_kv.h for the arguments and layout).
//
// Every pointer in the args is device memory; every call launches asynchronously on `stream`
// (a cudaStream_t passed as void*, nullptr = the default stream) and returns "" or an error
// message naming the bad argument or the failed launch. Only scalar arguments can be checked on
// the host; page ids and lengths in device arrays are the caller's contract, as for any kernel.
//
// Design (sm_90a plus PTX):
//   decode   one thread block per (split chunk, KV head, sequence), serving that head's whole
//            query group: each warp walks a strided share of the chunk's tokens, reads each K and
//            V row once (lanes split head_dim, converted to fp32 in registers), keeps one online
//            softmax state per query head; the warps' states merge in shared memory. With more
//            than one chunk the chunk states go to a workspace and a merge kernel combines them.
//   extend   one warp per (new token, query head), causal over the cached prefix and itself.
//   append   16-bit pools: one block per token, converting and storing rows; 8-bit pools: one block
//            per (KV head, K|V) walking the tokens in order, so a page's scale rules hold.
//   copy     one block per (source, destination) pair, 16-byte vector copies.
// Instantiated for head dims 64, 128, 256 and the four KV dtypes; the query-group size is a
// runtime value up to kMaxGroup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/paged_kv.h"

namespace kvpool::kernels::cuda {

inline constexpr uint32_t kMaxGroup = 8;  // query heads per KV head

// Tokens per split chunk decode() will use for these args (args.split_tokens or its own plan).
uint32_t decode_split_tokens(const DecodeArgs& args, uint32_t max_context, int sm_count);
// Workspace bytes decode() needs (0 when nothing is split).
size_t decode_workspace_bytes(const DecodeArgs& args, uint32_t max_context, int sm_count);

// max_context: the largest context_lens[s] (the host knows it; the array is on the device).
// sm_count: the device's multiprocessors (cudaDevAttrMultiProcessorCount), for split planning.
std::string decode(const DecodeArgs& args, uint32_t max_context, int sm_count, void* workspace,
                   size_t workspace_bytes, void* stream);
std::string extend(const ExtendArgs& args, uint32_t total_new_tokens, void* stream);
std::string append_kv(const AppendArgs& args, void* stream);
std::string copy_pages(const CopyPagesArgs& args, void* stream);

}  // namespace kvpool::kernels::cuda

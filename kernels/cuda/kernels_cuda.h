// CUDA implementations of the kvpool kernels (kernels/paged_kv.h for the arguments and layout).
//
// Every pointer in the args is device memory; every call launches asynchronously on `stream`
// (a cudaStream_t passed as void*, nullptr = the default stream) and returns "" or an error
// message naming the bad argument or the failed launch. Only scalar arguments can be checked on
// the host; page ids and lengths in device arrays are the caller's contract, as for any kernel.
//
// Design (sm_90a plus PTX):
//   decode   one CTA (4 warps) per (split chunk, KV head × group slice, sequence), serving up to
//            8 query heads of that KV head's group. The chunk's K and V rows stream through shared
//            memory in tiles of 16 KiB (K + V) with a 3-stage cp.async pipeline (kv_tile.cuh): two
//            tiles in flight while the CTA computes on a third; positions past the chunk are
//            zero-filled, never read. Lane groups of D/8 lanes (8 elements per lane) take different
//            rows of a tile, score them against every query head of the group, and keep per-head
//            online-softmax states updated once per 4 rows (online_softmax.h:
//            softmax_block_scores); lane groups and warps merge with softmax_merge. With more than
//            one chunk the chunk states go to a workspace and a merge kernel combines them in chunk
//            order.
//   extend   one CTA per (tile of new tokens, KV head, slice of its query group): 16 to 64 query
//            vectors (token, head of the group) held by its lane groups, K/V tiles streamed once
//            per CTA through the same pipeline and used by all of them, causal mask (and the
//            AttentionMask's window or chunk) per query row, online softmax per row.
//   append   16-bit pools: one block per token, converting and storing rows; 8-bit pools: one block
//            per (KV head, K|V) walking the tokens in order, so a page's scale rules hold.
//   copy     one block per (source, destination) pair, 16-byte vector copies.
// Instantiated for head dims 64, 128, 256 and the four KV dtypes; decode also for query-group
// buckets 1, 4, 8 (a group of 2 or 3 runs in bucket 4 with zero query rows for the rest; a
// group wider than kMaxGroup runs in slices of 8, one CTA each, every slice reading the chunk's
// K/V). Sliding windows, chunks and sinks (AttentionMask) are taken by decode and extend; latent
// (MLA) pools go to latent.cu's plain kernel (one CTA per query token and 16 heads). decode and
// extend need kv.base and kv.page_stride to be multiples of 16 bytes and kv.scales of 8 (their
// 16-byte row copies); so does append_kv into a 16-bit pool (its 16-byte stores). Each is checked
// before the launch and named in the error.
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
// decode and extend over a latent (MLA) pool (latent.cu); decode() and extend() call them for
// such a pool, so callers need not.
std::string latent_decode(const DecodeArgs& args, void* stream);
std::string latent_extend(const ExtendArgs& args, uint32_t total_new_tokens, void* stream);
std::string copy_pages(const CopyPagesArgs& args, void* stream);
// One block per (pair, layer, KV head, K|V) tile; bit for bit the CPU kernel's encoding.
std::string convert_pages(const ConvertPagesArgs& args, void* stream);
// Mixed precision (DecodeArgs::mixed, ExtendArgs::mixed): decode reads a mixed block table in
// one launch per pool, the states merged (decode.cu); extend in one kernel that streams the
// older pool's tiles, then this pool's, into the same states (extend.cu: a 16-bit pool over an
// 8-bit one); a latent pool's decode and extend pick each key's pool as they load it (latent.cu:
// any pair of dtypes).

}  // namespace kvpool::kernels::cuda

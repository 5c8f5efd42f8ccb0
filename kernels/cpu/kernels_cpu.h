// CPU implementations of the kvpool kernels (kernels/paged_kv.h for the arguments and layout).
//
// Same math as the CUDA kernels: fp32 accumulation, the online softmax of
// kernels/online_softmax.h, split-KV merged as on the GPU, quantisation of kernels/kv_dtype.h.
// Work is spread over `threads` std::threads (0 = std::thread::hardware_concurrency()).
// Preconditions (checked, returning an error message; empty string = ok): geometry valid,
// num_q_heads a positive multiple of kv_heads, layer < layers, every page id in a block table
// or copy list below `num_pages`, context lengths ≥ 1 and within the block table.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/paged_kv.h"

namespace kvpool::kernels::cpu {

std::string decode(const DecodeArgs& args, uint32_t num_pages, unsigned threads = 0);
std::string extend(const ExtendArgs& args, uint32_t num_pages, unsigned threads = 0);
std::string append_kv(const AppendArgs& args, uint32_t num_pages);
std::string copy_pages(const CopyPagesArgs& args, uint32_t num_pages);

}  // namespace kvpool::kernels::cpu

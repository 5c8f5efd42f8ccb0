// CPU implementations of the kvpool kernels (kernels/paged_kv.h for the arguments and layout).
//
// Same math as the CUDA kernels: fp32 accumulation, the online softmax of
// kernels/online_softmax.h, split-KV merged as on the GPU, quantisation of kernels/kv_dtype.h.
// Work is spread over `threads` std::threads (0 = std::thread::hardware_concurrency()).
// Preconditions (checked, returning an error message; empty string = ok): geometry valid,
// num_q_heads a positive multiple of kv_heads, layer < layers, every page id a call reads below
// `num_pages` (block-table entries from the page of the first key the mask lets a query see;
// earlier ones are never read and may be kNoPage; every id of a copy list), context lengths ≥ 1
// and within the block table.
//
// Instruction sets: decode runs its inner loops either as portable C++ (`baseline`: what the
// compiler vectorises for the build's target, SSE2 on x86-64) or with AVX2 + FMA + F16C (`avx2`,
// x86-64 only), chosen per call at run time, so one binary serves old and new CPUs. `automatic`
// takes avx2 when the CPU supports it and head_dim (and a latent pool's value_dim) is a multiple
// of 8, else baseline; the others force one (tests and benchmarks compare them; forcing one the
// CPU or head_dim cannot run is an error). Both agree with each other to fp32 rounding, not bit for
// bit; each is deterministic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/paged_kv.h"

namespace kvpool::kernels::cpu {

enum class Isa : uint8_t { automatic, baseline, avx2 };
std::string_view isa_name(Isa isa);
// Whether this CPU and build can run `isa` (automatic and baseline: always).
bool isa_supported(Isa isa);

std::string decode(const DecodeArgs& args, uint32_t num_pages, unsigned threads = 0,
                   Isa isa = Isa::automatic);
std::string extend(const ExtendArgs& args, uint32_t num_pages, unsigned threads = 0);
std::string append_kv(const AppendArgs& args, uint32_t num_pages);
std::string copy_pages(const CopyPagesArgs& args, uint32_t num_pages);
// src_num_pages / dst_num_pages bound each pool's page ids; pairs run on up to `threads` threads.
std::string convert_pages(const ConvertPagesArgs& args, uint32_t src_num_pages,
                          uint32_t dst_num_pages, unsigned threads = 1);
// convert_pages' checks alone ("" = ok): the pools, their shapes and the id lists (host arrays),
// reading no pool memory; what a caller runs before staging the ids for the CUDA kernel.
std::string check_convert_pages(const ConvertPagesArgs& args, uint32_t src_num_pages,
                                uint32_t dst_num_pages);

}  // namespace kvpool::kernels::cpu

// CUDA paged decode attention; paged_attention_cpu.h defines its result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/paged_attention_cpu.h"

namespace beaconkv::kernels {

// Same arguments as PagedDecodeAttentionCpu, all pointers on the device. head_dim must be
// 32, 64, 128 or 256 (cudaErrorInvalidValue otherwise). Summation order differs from the
// CPU twin (split over warps, online softmax), so results agree to rounding, not bitwise.
// bias: as the twin's ([rows, num_kv_heads, max_blocks * block_size], logical slot order, on
// the device), or nullptr.
cudaError_t PagedDecodeAttention(const float* q, const float* k_cache, const float* v_cache,
                                 const int32_t* block_tables, const int32_t* lengths,
                                 const PagedAttentionShape& shape, float scale, float* out,
                                 cudaStream_t stream, const float* bias = nullptr);

}  // namespace beaconkv::kernels

// CUDA append of one step's K/V into the paged cache; append_kv_cpu.h defines the result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/append_kv_cpu.h"
#include "kernels/kv_dtype.h"

namespace beaconkv::kernels {

// Same arguments as AppendKvCpu, all arrays on the device; k_cache and v_cache hold `dtype`
// (16-bit caches receive new_k / new_v rounded to nearest even; fp32 as they are).
// cudaErrorInvalidValue for a bad shape or dtype. One warp per row.
cudaError_t AppendKv(const float* new_k, const float* new_v, const int32_t* new_positions,
                     const int32_t* table_of_row, const int32_t* block_tables,
                     const int32_t* lengths, const AppendShape& shape, void* k_cache, void* v_cache,
                     KvDtype dtype, int32_t* positions, cudaStream_t stream);

}  // namespace beaconkv::kernels

// CUDA append of one step's K/V into the paged cache; append_kv_cpu.h defines the result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/append_kv_cpu.h"

namespace beaconkv::kernels {

// Same arguments as AppendKvCpu, all arrays on the device. cudaErrorInvalidValue for a bad
// shape. One warp per row.
cudaError_t AppendKv(const float* new_k, const float* new_v, const int32_t* new_positions,
                     const int32_t* table_of_row, const int32_t* block_tables,
                     const int32_t* lengths, const AppendShape& shape, float* k_cache,
                     float* v_cache, int32_t* positions, cudaStream_t stream);

}  // namespace beaconkv::kernels

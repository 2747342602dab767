// CUDA R-KV redundancy over paged keys; redundancy_cpu.h defines the result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/kv_dtype.h"
#include "kernels/redundancy_cpu.h"

namespace beaconkv::kernels {

// Same arguments as PagedRedundancyScoresCpu, all arrays on the device, plus the keys'
// storage type and two-phase workspace (CUB style: with workspace == nullptr only
// *workspace_bytes is written, >= 16; it grows with the items and head_dim). One thread block
// per head: unit keys, then per row its newest near-duplicate (largest position with cosine
// above the threshold, the row's own zeroed diagonal included), per column the sum of the
// others' cosines, then a softmax of the column means. O(n^2 head_dim) per head, the same
// work as the CPU. Summation order and expf differ from the CPU, so values agree to rounding.
// cudaErrorInvalidValue for a bad shape or dtype, or a too small workspace.
cudaError_t PagedRedundancyScores(void* workspace, size_t* workspace_bytes, const void* k_cache,
                                  KvDtype dtype, const int32_t* block_tables,
                                  const int32_t* lengths, const int32_t* table_of_head,
                                  const int32_t* positions, const int32_t* score_offsets,
                                  int32_t num_items, const RedundancyShape& shape, float* out,
                                  cudaStream_t stream);

}  // namespace beaconkv::kernels

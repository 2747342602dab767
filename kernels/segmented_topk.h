// CUDA segmented top-k with protected elements; segmented_topk_cpu.h defines the result.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/segmented_topk_cpu.h"

namespace beaconkv::kernels {

enum class TopKAlgorithm : int32_t {
  kAuto = 0,            // block radix select when max_segment_len fits a tile, else segmented sort
  kBlockRadixSort = 1,  // one thread block per segment, the segment sorted in shared memory
  kSegmentedSort = 2,   // cub::DeviceSegmentedSort: the reference, and the path for long ones
  kBlockRadixSelect = 3,  // one thread block per segment, an 8-bit radix select of the k-th key
};

// Longest segment the block path takes (one tile of one thread block).
inline constexpr int32_t kMaxBlockTopKSegment = 4096;

// Same semantics as SegmentedTopKCpu, all arrays on the device. Two-phase temporary storage
// as in CUB: with temp == nullptr only *temp_bytes is written (always >= 16) and nothing
// runs. Returns cudaErrorInvalidValue for a bad shape (pool_kernel even or < 1, negative
// sizes, a block algorithm with max_segment_len > kMaxBlockTopKSegment) or a too small temp.
// A segment longer than max_segment_len on the block path traps the kernel.
// Every algorithm gives exactly the CPU twin's keep mask: the sort key (score, position)
// totally orders a segment's unprotected elements. shape.penalty.values and
// shape.reserve's arrays, if any, are device arrays; a reserved region runs the selection
// twice (the region's round, then the open one), and a mask without reserve.k is invalid.
cudaError_t SegmentedTopK(void* temp,                // [*temp_bytes] device scratch or nullptr
                          size_t* temp_bytes,        // in: size of temp; out: size needed
                          const int32_t* offsets,    // [num_segments + 1]
                          const float* scores,       // [num_items]
                          const int32_t* positions,  // [num_items]
                          const uint8_t* protect,    // [num_items]
                          const int32_t* k,          // [num_segments]
                          const SegmentedTopKShape& shape, TopKAlgorithm algorithm,
                          uint8_t* keep,  // [num_items]
                          cudaStream_t stream);

}  // namespace beaconkv::kernels

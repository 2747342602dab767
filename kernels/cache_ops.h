// Device twins of CpuKvStore's data movement (block_manager/kv_store.h defines the result):
// copy-on-write block copies and compaction slot moves. Raw pointers in, cudaError_t out.
// Keys and values hold `dtype` elements (kv_dtype.h); data movement copies their bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace beaconkv::kernels {

// Copies whole blocks: for each i, block dst[i] <- block src[i] (K, V and positions).
cudaError_t CopyBlocks(const int32_t* src,  // [num_copies] device
                       const int32_t* dst,  // [num_copies] device
                       int32_t num_copies,
                       void* keys,    // [num_blocks, block_size, head_dim] of dtype
                       void* values,  // [num_blocks, block_size, head_dim] of dtype
                       KvDtype dtype,
                       int32_t* positions,  // [num_blocks, block_size]
                       int32_t block_size, int32_t head_dim, cudaStream_t stream);

// Moves single slots: flat slot index = block * block_size + offset. No move may read a
// slot another move writes (compaction plans guarantee this).
cudaError_t MoveSlots(const int32_t* from_slot,  // [num_moves] device
                      const int32_t* to_slot,    // [num_moves] device
                      int32_t num_moves,
                      void* keys,    // [num_blocks, block_size, head_dim] of dtype
                      void* values,  // [num_blocks, block_size, head_dim] of dtype
                      KvDtype dtype,
                      int32_t* positions,  // [num_blocks, block_size]
                      int32_t head_dim, cudaStream_t stream);

}  // namespace beaconkv::kernels

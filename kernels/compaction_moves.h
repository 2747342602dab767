// CUDA keep mask -> compaction moves, and the moves applied; compaction_moves_cpu.h defines
// the moves, CpuKvStore::MoveSlots what applying them does.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/compaction_moves_cpu.h"
#include "kernels/kv_dtype.h"

namespace beaconkv::kernels {

// Same arguments and result as CompactionMovesCpu, all arrays on the device. One thread
// block per segment (any length). Entries of from_slot / to_slot past num_moves[s] are left
// as they were. cudaErrorInvalidValue for a bad shape.
cudaError_t CompactionMoves(const int32_t* offsets, const uint8_t* keep,
                            const int32_t* table_of_segment, const int32_t* block_tables,
                            const CompactionShape& shape, int32_t* from_slot, int32_t* to_slot,
                            int32_t* num_moves, int32_t* new_lengths, cudaStream_t stream);

// Carries out every segment's moves (K, V and position of each flat slot) in one launch:
// moves are independent (sources at or above the new length, targets below it).
cudaError_t ApplyCompactionMoves(const int32_t* offsets,    // [num_segments + 1]
                                 const int32_t* from_slot,  // [num_items]
                                 const int32_t* to_slot,    // [num_items]
                                 const int32_t* num_moves,  // [num_segments]
                                 int32_t num_segments,
                                 void* keys,    // [num_blocks, block_size, head_dim] of dtype
                                 void* values,  // [num_blocks, block_size, head_dim] of dtype
                                 KvDtype dtype,
                                 int32_t* positions,  // [num_blocks, block_size]
                                 int32_t head_dim, cudaStream_t stream);

}  // namespace beaconkv::kernels

// Keep masks to compaction moves: the CPU function that defines the result of the CUDA kernels
// in compaction_moves.cu. Segments are (sequence, layer, kv_head) heads as in
// segmented_topk_cpu.h; segment s reads block table table_of_segment[s].
//
// For each segment, block_manager's PlanHeadCompaction over the kept indexes (a head keeping
// k tokens ends as the dense prefix [0, k): holes below k are filled in ascending order by
// the survivors at or above k, in ascending order), with logical index j mapped to the flat
// slot table[j / block_size] * block_size + j % block_size. Segment s's moves go to
// [offsets[s], offsets[s] + num_moves[s]) of from_slot / to_slot; new_lengths[s] = k.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

struct CompactionShape {
  int32_t num_segments = 0;
  int32_t num_items = 0;  // offsets[num_segments]
  int32_t block_size = 0;
  int32_t max_blocks = 0;  // row stride of block_tables
};

void CompactionMovesCpu(const int32_t* offsets,           // [num_segments + 1]
                        const uint8_t* keep,              // [num_items]
                        const int32_t* table_of_segment,  // [num_segments]
                        const int32_t* block_tables,      // [num_tables, max_blocks]
                        const CompactionShape& shape,
                        int32_t* from_slot,     // [num_items]; per segment, moves first
                        int32_t* to_slot,       // [num_items]
                        int32_t* num_moves,     // [num_segments]
                        int32_t* new_lengths);  // [num_segments]

}  // namespace beaconkv::kernels

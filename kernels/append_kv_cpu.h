// Appending one decode step's K/V to the paged cache: the CPU function that defines the result
// of the CUDA kernel in append_kv.cu. A row is one (sequence, layer, kv_head) of the step.
//
// For row r with t = table_of_row[r] and j = lengths[t] (tokens the head held before this
// one), slot = block_tables[t, j / block_size] * block_size + j % block_size receives
// new_k[r], new_v[r] and new_positions[r]. Lengths are not changed: the block manager owns
// them (and has allocated the block the slot lies in). Rows must name distinct tables.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

struct AppendShape {
  int32_t rows = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks = 0;  // row stride of block_tables
};

void AppendKvCpu(const float* new_k,            // [rows, head_dim]
                 const float* new_v,            // [rows, head_dim]
                 const int32_t* new_positions,  // [rows]
                 const int32_t* table_of_row,   // [rows]
                 const int32_t* block_tables,   // [num_tables, max_blocks]
                 const int32_t* lengths,        // [num_tables]
                 const AppendShape& shape,
                 float* k_cache,       // [num_blocks, block_size, head_dim]
                 float* v_cache,       // [num_blocks, block_size, head_dim]
                 int32_t* positions);  // [num_blocks, block_size]

}  // namespace beaconkv::kernels

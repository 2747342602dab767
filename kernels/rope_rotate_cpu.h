// RoPE rotation of rows (BeaconKV's beacons) to given positions: the CPU functions that define
// the result of the CUDA kernel in rope_rotate.cu. The device kernel does not recompute
// angles: it reads the cos/sin table RopeAngleTable builds on the host with core Rope::Angles,
// so both sides rotate with the same float cos/sin values.
#pragma once

#include <cstdint>

#include "core/rope.h"

namespace beaconkv::kernels {

// table[i] = [cos of the head_dim/2 pair angles, sin of them] at positions[i].
void RopeAngleTable(const Rope& rope,
                    const int32_t* positions,  // [num_positions]
                    int32_t num_positions,
                    float* table);  // [num_positions, head_dim]

// dst[r] = rope.Rotate(src[r], positions[table_row[r]]): what RotateRows computes with the
// table RopeAngleTable(rope, positions, ...) built. src and dst may alias.
void RotateRowsCpu(const Rope& rope,
                   const float* src,          // [num_rows, head_dim]
                   const int32_t* table_row,  // [num_rows]
                   const int32_t* positions,  // [num_positions]
                   int32_t num_rows,
                   float* dst);  // [num_rows, head_dim]

}  // namespace beaconkv::kernels

// CUDA RoPE rotation of rows with a precomputed cos/sin table; rope_rotate_cpu.h defines the
// result (RotateRowsCpu, with the table from RopeAngleTable).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace beaconkv::kernels {

// dst[r] = rotate-half RoPE of src[r] with cos/sin row table_row[r] of `table`. Products and
// sums are rounded separately (no FMA), as core Rope::Rotate computes them. head_dim must be
// even and >= 2 (cudaErrorInvalidValue otherwise). src and dst may alias.
cudaError_t RotateRows(const float* src,          // [num_rows, head_dim] device
                       const int32_t* table_row,  // [num_rows] device
                       const float* table,        // [num_positions, head_dim] device: cos | sin
                       int32_t num_rows, int32_t head_dim,
                       float* dst,  // [num_rows, head_dim] device
                       cudaStream_t stream);

}  // namespace beaconkv::kernels

// CUDA cosine farthest-point sampling (BeaconKV's beacon draw and buffer reduction) for many
// query buffers in one launch; fps_cpu.h defines the result (core CosineFarthestPointOrder).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace beaconkv::kernels {

struct FpsShape {
  int32_t num_segments = 0;  // buffers, e.g. one per (sequence, layer, kv_head)
  int32_t max_points = 0;    // rows per buffer slot in `points` (n[s] <= max_points <= 4096)
  int32_t dim = 0;           // 1 <= dim <= 256
  int32_t max_count = 0;     // columns of `order` (count[s] <= max_count)
};

// Bytes of device scratch FarthestPointOrder needs for `shape` (the unit vectors, float and
// quantised).
size_t FarthestPointScratchBytes(const FpsShape& shape);

// For every segment s: order[s, 0:count[s]] = CosineFarthestPointOrder(points[s, 0:n[s]],
// n[s], dim, count[s]), bit for bit (the same double-precision normalisation, the same
// quantised unit vectors and exact integer dot products, ties to the earliest point);
// order[s, count[s]:] = -1.
// A bad shape is cudaErrorInvalidValue; an n[s] outside [0, max_points] or a count[s] outside
// [0, min(n[s], max_count)] is found on the device, and that segment's row is all -2.
cudaError_t FarthestPointOrder(const float* points,   // [num_segments, max_points, dim] device
                               const int32_t* n,      // [num_segments] device
                               const int32_t* count,  // [num_segments] device
                               const FpsShape& shape,
                               void* scratch,   // FarthestPointScratchBytes(shape) device
                               int32_t* order,  // [num_segments, max_count] device
                               cudaStream_t stream);

}  // namespace beaconkv::kernels

// The CPU twin of kernels/fps.cu: core CosineFarthestPointOrder over many buffers.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

// order[s, 0:count[s]] = CosineFarthestPointOrder(points + s * max_points * dim, n[s], dim,
// count[s]); the rest of the row is -1. Requires 0 <= count[s] <= n[s] <= max_points.
void FarthestPointOrderCpu(const float* points,   // [num_segments, max_points, dim]
                           const int32_t* n,      // [num_segments]
                           const int32_t* count,  // [num_segments]
                           int32_t num_segments, int32_t max_points, int32_t dim, int32_t max_count,
                           int32_t* order);  // [num_segments, max_count]

}  // namespace beaconkv::kernels

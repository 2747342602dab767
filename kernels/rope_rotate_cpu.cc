#include "kernels/rope_rotate_cpu.h"

namespace beaconkv::kernels {

void RopeAngleTable(const Rope& rope, const int32_t* positions, int32_t num_positions,
                    float* table) {
  const int32_t d = rope.head_dim();
  for (int32_t i = 0; i < num_positions; ++i) {
    float* row = table + int64_t{i} * d;
    rope.Angles(positions[i], row, row + d / 2);
  }
}

void RotateRowsCpu(const Rope& rope, const float* src, const int32_t* table_row,
                   const int32_t* positions, int32_t num_rows, float* dst) {
  const int64_t d = rope.head_dim();
  for (int32_t r = 0; r < num_rows; ++r) {
    rope.Rotate(src + r * d, positions[table_row[r]], dst + r * d);
  }
}

}  // namespace beaconkv::kernels

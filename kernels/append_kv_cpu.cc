#include "kernels/append_kv_cpu.h"

#include <algorithm>

namespace beaconkv::kernels {

void AppendKvCpu(const float* new_k, const float* new_v, const int32_t* new_positions,
                 const int32_t* table_of_row, const int32_t* block_tables, const int32_t* lengths,
                 const AppendShape& s, float* k_cache, float* v_cache, int32_t* positions) {
  const int64_t d = s.head_dim;
  for (int32_t r = 0; r < s.rows; ++r) {
    const int32_t t = table_of_row[r];
    const int32_t j = lengths[t];
    const int64_t slot =
        int64_t{block_tables[int64_t{t} * s.max_blocks + j / s.block_size]} * s.block_size +
        j % s.block_size;
    std::copy_n(new_k + r * d, d, k_cache + slot * d);
    std::copy_n(new_v + r * d, d, v_cache + slot * d);
    positions[slot] = new_positions[r];
  }
}

}  // namespace beaconkv::kernels

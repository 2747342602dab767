#include "kernels/redundancy_cpu.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/redundancy.h"

namespace beaconkv::kernels {

void PagedRedundancyScoresCpu(const float* k_cache, const int32_t* block_tables,
                              const int32_t* lengths, const int32_t* table_of_head,
                              const int32_t* positions, const int32_t* score_offsets,
                              const RedundancyShape& s, float* out) {
  const int64_t d = s.head_dim;
  std::vector<int32_t> order;  // [n] slot of the i-th oldest key
  std::vector<float> keys;     // [n, head_dim] in position order
  std::vector<float> red;      // [n] in position order
  for (int32_t h = 0; h < s.num_heads; ++h) {
    const int32_t t = table_of_head[h];
    const int32_t n = lengths[t];
    BKV_CHECK(score_offsets[h + 1] - score_offsets[h] == n);
    const int32_t* table = block_tables + int64_t{t} * s.max_blocks;
    const int32_t* pos = positions + score_offsets[h];
    order.resize(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return pos[a] < pos[b]; });
    keys.resize(static_cast<size_t>(n) * d);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t j = order[i];
      const int64_t slot = int64_t{table[j / s.block_size]} * s.block_size + j % s.block_size;
      std::copy_n(k_cache + slot * d, d, keys.data() + i * d);
    }
    red.resize(n);
    RedundancyScores(keys.data(), n, s.head_dim, s.threshold, red.data());
    for (int32_t i = 0; i < n; ++i) out[score_offsets[h] + order[i]] = red[i];
  }
}

}  // namespace beaconkv::kernels

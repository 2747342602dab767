#include "kernels/fps_cpu.h"

#include <algorithm>
#include <vector>

#include "core/beacon_bank.h"
#include "core/check.h"

namespace beaconkv::kernels {

void FarthestPointOrderCpu(const float* points, const int32_t* n, const int32_t* count,
                           int32_t num_segments, int32_t max_points, int32_t dim, int32_t max_count,
                           int32_t* order) {
  for (int32_t s = 0; s < num_segments; ++s) {
    BKV_CHECK(0 <= count[s] && count[s] <= n[s] && n[s] <= max_points && count[s] <= max_count);
    const std::vector<int32_t> o = CosineFarthestPointOrder(
        points + static_cast<size_t>(s) * max_points * dim, n[s], dim, count[s]);
    int32_t* row = order + static_cast<size_t>(s) * max_count;
    std::fill_n(row, max_count, -1);
    std::copy(o.begin(), o.end(), row);
  }
}

}  // namespace beaconkv::kernels

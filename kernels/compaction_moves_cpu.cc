#include "kernels/compaction_moves_cpu.h"

#include <vector>

#include "absl/status/status.h"
#include "block_manager/compaction_plan.h"
#include "core/check.h"

namespace beaconkv::kernels {

void CompactionMovesCpu(const int32_t* offsets, const uint8_t* keep,
                        const int32_t* table_of_segment, const int32_t* block_tables,
                        const CompactionShape& s, int32_t* from_slot, int32_t* to_slot,
                        int32_t* num_moves, int32_t* new_lengths) {
  std::vector<int32_t> kept;  // [k] kept indexes of one segment
  HeadCompaction plan;
  for (int32_t seg = 0; seg < s.num_segments; ++seg) {
    const int32_t begin = offsets[seg], n = offsets[seg + 1] - begin;
    kept.clear();
    for (int32_t i = 0; i < n; ++i)
      if (keep[begin + i]) kept.push_back(i);
    const absl::Status status = PlanHeadCompaction(seg, n, kept, &plan);
    BKV_CHECK(status.ok());  // indexes come from a mask: in range, never twice
    const int32_t* table = block_tables + int64_t{table_of_segment[seg]} * s.max_blocks;
    auto slot = [&](int32_t j) {
      return table[j / s.block_size] * s.block_size + j % s.block_size;
    };
    for (size_t m = 0; m < plan.moves.size(); ++m) {
      from_slot[begin + m] = slot(plan.moves[m].from);
      to_slot[begin + m] = slot(plan.moves[m].to);
    }
    num_moves[seg] = static_cast<int32_t>(plan.moves.size());
    new_lengths[seg] = plan.new_num_tokens;
  }
}

}  // namespace beaconkv::kernels

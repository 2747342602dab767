// Turning a keep-set into slot moves. Pure logic over logical slot indexes; the block
// manager maps indexes to physical slots and carries the plan out.
//
// Rule: a head keeping k of its n tokens ends as a dense prefix [0, k). Holes (evicted
// indexes below k) are filled, in ascending order, by the survivors at indexes >= k, also
// in ascending order, so survivors that move keep their relative order. Survivors below k
// never move. This needs exactly (number of holes) moves, the fewest possible.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace beaconkv {

struct IndexMove {
  int32_t from = 0;  // logical slot index, >= new_num_tokens
  int32_t to = 0;    // logical slot index, <  new_num_tokens
};

struct HeadCompaction {
  int32_t head = 0;  // flat (layer, kv_head) index
  int32_t old_num_tokens = 0;
  int32_t new_num_tokens = 0;
  std::vector<IndexMove> moves;
};

// Validates `keep` (any order; every index in [0, num_tokens), none twice) and plans the
// compaction. kInvalidArgument names the offending slot.
absl::Status PlanHeadCompaction(int32_t head, int32_t num_tokens, absl::Span<const int32_t> keep,
                                HeadCompaction* out);

}  // namespace beaconkv

#include "block_manager/compaction_plan.h"

#include "absl/strings/str_format.h"

namespace beaconkv {

absl::Status PlanHeadCompaction(int32_t head, int32_t num_tokens, absl::Span<const int32_t> keep,
                                HeadCompaction* out) {
  std::vector<char> kept(num_tokens, 0);  // [num_tokens]
  for (int32_t slot : keep) {
    if (slot < 0 || slot >= num_tokens) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keep-set for head %d names slot %d, outside [0, %d)", head, slot, num_tokens));
    }
    if (kept[slot]) {
      return absl::InvalidArgumentError(
          absl::StrFormat("keep-set for head %d names slot %d twice", head, slot));
    }
    kept[slot] = 1;
  }
  const int32_t k = static_cast<int32_t>(keep.size());
  out->head = head;
  out->old_num_tokens = num_tokens;
  out->new_num_tokens = k;
  out->moves.clear();
  int32_t survivor = k;
  for (int32_t hole = 0; hole < k; ++hole) {
    if (kept[hole]) continue;
    while (!kept[survivor]) ++survivor;  // a hole below k implies a survivor at or above k
    out->moves.push_back({survivor, hole});
    ++survivor;
  }
  return absl::OkStatus();
}

}  // namespace beaconkv

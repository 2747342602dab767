// Turning scores into keep-sets. One tie rule everywhere: among equal scores the more recent
// token (larger position) wins; in pooled selection a remaining tie goes to the lower kv_head.
// Indexes here are position-order indexes of an OrderedHead, not slots.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace beaconkv {

// One head's selection problem, position order.
struct HeadCandidates {
  absl::Span<const int32_t> positions;  // [n] ascending
  absl::Span<const uint8_t> protect;    // [n] 1 = always kept
  absl::Span<const float> scores;       // [n]; read only where protect == 0
};

// order = the indexes 0..n-1 sorted by positions[i] (ascending; equal positions, which a head
// does not hold, by index). A two-pass radix sort on 8-bit digits when the positions span
// fewer than 2^16 values (a compression's 160 tokens: a few hundred simple steps where a
// comparison sort mispredicts a branch per step), std::sort otherwise.
void PositionOrder(absl::Span<const int32_t> positions, std::vector<int32_t>* order);

// The `k` best unprotected indexes by (score desc, position desc), in no particular order.
std::vector<int32_t> TopKUnprotected(const HeadCandidates& head, int64_t k);

// An evenly spaced sample of the unprotected tokens: with lo / hi the first / last
// unprotected positions and span = hi - lo + 1, stratum j < k is [lo + j*span/k,
// lo + (j+1)*span/k) and contributes its first unprotected token (empty strata contribute
// none). Returns at most k ascending position-order indexes; all unprotected ones if there are
// at most k.
std::vector<int32_t> CoverageUnprotected(absl::Span<const int32_t> positions,
                                         absl::Span<const uint8_t> protect, int64_t k);

// Protected indexes plus the best unprotected ones until the head holds `budget` tokens
// (or all of them). Returns ascending position-order indexes. If the protected tokens alone
// exceed the budget they are all kept: callers validate budgets beforehand.
std::vector<int32_t> SelectUniform(const HeadCandidates& head, int64_t budget);

// Heads of one layer share `layer_budget` tokens: every head keeps its protected tokens,
// then the remaining capacity goes to the best unprotected tokens across all heads, compared
// on each head's scores divided by the sum of that head's unprotected scores (a head whose
// mass is spread thin wins many tokens; a peaked head wins few). Returns, per head,
// ascending position-order indexes.
std::vector<std::vector<int32_t>> SelectPooled(absl::Span<const HeadCandidates> heads,
                                               int64_t layer_budget);

}  // namespace beaconkv

#include "kernels/segmented_topk_cpu.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/types/span.h"
#include "core/check.h"
#include "core/scoring.h"
#include "core/selection.h"
#include "kernels/topk_key.h"

namespace beaconkv::kernels {
namespace {

Pooling ToCorePooling(TopKPooling p) {
  switch (p) {
    case TopKPooling::kMax:
      return Pooling::kMax;
    case TopKPooling::kAvg:
      return Pooling::kAvg;
    case TopKPooling::kNone:
      break;
  }
  return Pooling::kNone;
}

}  // namespace

void SegmentedTopKCpu(const int32_t* offsets, const float* scores, const int32_t* positions,
                      const uint8_t* protect, const int32_t* k, const SegmentedTopKShape& shape,
                      uint8_t* keep) {
  const Pooling pooling = ToCorePooling(shape.pooling);
  const bool pool = pooling != Pooling::kNone && shape.pool_kernel > 1;
  std::vector<int32_t> order;    // [n] element of the i-th oldest token
  std::vector<float> ordered;    // [n] scores in position order
  std::vector<float> pooled;     // [n] pooled scores in slot order
  std::vector<float> penalised;  // [n] after the penalty, slot order
  std::vector<uint8_t> outside;  // [n] protected or outside the reserved region
  for (int32_t s = 0; s < shape.num_segments; ++s) {
    const int32_t begin = offsets[s], n = offsets[s + 1] - offsets[s];
    BKV_CHECK(n >= 0);
    const float* seg_scores = scores + begin;
    if (pool) {
      order.resize(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(),
                [&](int32_t a, int32_t b) { return positions[begin + a] < positions[begin + b]; });
      ordered.resize(n);
      for (int32_t i = 0; i < n; ++i) ordered[i] = seg_scores[order[i]];
      Pool1d(pooling, shape.pool_kernel, absl::MakeSpan(ordered));
      pooled.resize(n);
      for (int32_t i = 0; i < n; ++i) pooled[order[i]] = ordered[i];
      seg_scores = pooled.data();
    }
    if (shape.penalty.values != nullptr) {
      penalised.resize(n);
      for (int32_t i = 0; i < n; ++i) {
        penalised[i] =
            PenalisedScore(seg_scores[i], shape.penalty.values[begin + i], shape.penalty.lambda);
      }
      seg_scores = penalised.data();
    }
    for (int32_t i = 0; i < n; ++i) keep[begin + i] = protect[begin + i] ? 1 : 0;
    int64_t picks = k[s];
    const uint8_t* taken = protect + begin;  // kept before the open selection
    if (shape.reserve.mask != nullptr) {
      BKV_CHECK(shape.reserve.k != nullptr && shape.reserve.k[s] >= 0);
      // The region first: everything outside it counts as taken for this round.
      outside.resize(n);
      for (int32_t i = 0; i < n; ++i)
        outside[i] = protect[begin + i] || !shape.reserve.mask[begin + i] ? 1 : 0;
      const HeadCandidates region{absl::MakeConstSpan(positions + begin, n), outside,
                                  absl::MakeConstSpan(seg_scores, n)};
      const std::vector<int32_t> reserved =
          TopKUnprotected(region, std::min<int64_t>(shape.reserve.k[s], picks));
      for (int32_t i : reserved) keep[begin + i] = 1;
      picks -= static_cast<int64_t>(reserved.size());
      taken = keep + begin;
    }
    const HeadCandidates head{absl::MakeConstSpan(positions + begin, n),
                              absl::MakeConstSpan(taken, n), absl::MakeConstSpan(seg_scores, n)};
    for (int32_t i : TopKUnprotected(head, picks)) keep[begin + i] = 1;
  }
}

}  // namespace beaconkv::kernels

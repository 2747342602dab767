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
    const HeadCandidates head{absl::MakeConstSpan(positions + begin, n),
                              absl::MakeConstSpan(protect + begin, n),
                              absl::MakeConstSpan(seg_scores, n)};
    for (int32_t i = 0; i < n; ++i) keep[begin + i] = protect[begin + i] ? 1 : 0;
    for (int32_t i : TopKUnprotected(head, k[s])) keep[begin + i] = 1;
  }
}

}  // namespace beaconkv::kernels

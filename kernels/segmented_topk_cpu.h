// Segmented top-k with protected elements: the CPU function that defines the result of the
// CUDA kernels in segmented_topk.cu. A segment is one (sequence, layer, kv_head); its
// elements are that head's cached tokens in slot order.
//
// For segment s (elements [offsets[s], offsets[s + 1])): optionally pool the scores over
// neighbouring tokens in position order (core Pool1d), optionally subtract a penalty
// (shape.penalty), then keep every protected element and the k[s] best unprotected ones by
// (score desc, position desc) -- core TopKUnprotected, so
// among equal scores the more recent token wins. keep[i] = 1 for kept elements, 0 otherwise.
// With a reserved region (shape.reserve), the k[s] picks start with the
// min(reserve.k[s], k[s]) best unprotected elements of the region, and the rest go to the
// best of the remaining unprotected elements, by the same order.
// Positions within a segment must be unique and >= 0; scores must not be NaN.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

// Mirrors core Pooling without pulling absl into device code.
enum class TopKPooling : int32_t { kNone = 0, kMax = 1, kAvg = 2 };

// An optional term subtracted after pooling: an element's rank score becomes
// lambda * pooled - (1 - lambda) * values[i] (R-KV's redundancy, PenalisedScore in
// topk_key.h). values: [num_items], on the same side as the other arrays; null = none.
struct TopKPenalty {
  const float* values = nullptr;
  float lambda = 1.0f;
};

// A region of each segment that is served first: reserve.mask[i] = 1 marks the region's
// elements, reserve.k[s] how many of segment s's k[s] picks go to it before any other
// element. Both arrays on the same side as the others; mask null = no region.
struct TopKReserve {
  const uint8_t* mask = nullptr;  // [num_items]
  const int32_t* k = nullptr;     // [num_segments], >= 0
};

struct SegmentedTopKShape {
  int32_t num_segments = 0;
  int32_t num_items = 0;        // offsets[num_segments]
  int32_t max_segment_len = 0;  // a bound on every segment's length, known to the host
  TopKPooling pooling = TopKPooling::kNone;
  int32_t pool_kernel = 1;  // odd, >= 1; 1 = no pooling
  TopKPenalty penalty;
  TopKReserve reserve;
};

void SegmentedTopKCpu(const int32_t* offsets,    // [num_segments + 1], offsets[0] == 0
                      const float* scores,       // [num_items]
                      const int32_t* positions,  // [num_items], unique within a segment
                      const uint8_t* protect,    // [num_items], 1 = always kept
                      const int32_t* k,          // [num_segments], unprotected picks
                      const SegmentedTopKShape& shape,
                      uint8_t* keep);  // [num_items]

}  // namespace beaconkv::kernels

// The kernels' shape structs for one ScoringBatch: shared by PagedTwinScorer and GpuScorer so
// that both run the same problem.
#pragma once

#include <algorithm>
#include <limits>

#include "kernels/paged_scores_cpu.h"
#include "kernels/redundancy_cpu.h"
#include "kernels/scorer.h"
#include "kernels/segmented_topk_cpu.h"

namespace beaconkv::internal_scorer {

struct KernelShapes {
  kernels::PagedScoresShape scores;
  // topk.penalty.values and topk.reserve: each scorer sets them (redundancy, a reserved region)
  kernels::SegmentedTopKShape topk;
  kernels::RedundancyShape redundancy;
};

// The scores kernel's exclusion mask for a batch: its protect mask when protected keys are
// unscored, else none.
inline const uint8_t* ExcludedKeys(const ScoringShape& shape, const uint8_t* protect) {
  return shape.protected_unscored ? protect : nullptr;
}

inline KernelShapes ToKernelShapes(const ScoringShape& shape, const ScoringBatch& batch) {
  KernelShapes out;
  out.scores.num_heads = batch.num_jobs;
  out.scores.head_dim = shape.head_dim;
  out.scores.block_size = shape.block_size;
  out.scores.max_blocks = batch.max_blocks;
  out.scores.group_size = shape.group_size;
  out.scores.gqa = shape.spec.gqa == GqaReduction::kMeanProbs   ? kernels::ScoreGqa::kMeanProbs
                   : shape.spec.gqa == GqaReduction::kMaxLogits ? kernels::ScoreGqa::kMaxLogits
                                                                : kernels::ScoreGqa::kMaxProbs;
  out.scores.query = shape.spec.query == QueryReduction::kMean  ? kernels::ScoreQuery::kMean
                     : shape.spec.query == QueryReduction::kSum ? kernels::ScoreQuery::kSum
                                                                : kernels::ScoreQuery::kMax;
  out.scores.bf16 = shape.spec.bf16;
  // Unscored (protected) keys score the pooling's padding, so that pooling all of a head's
  // scores in position order is core Pool1d over the scored ones (they precede the others).
  out.scores.excluded_score =
      shape.pooling == Pooling::kMax ? -std::numeric_limits<float>::infinity() : 0.0f;
  for (size_t h = 0; h + 1 < batch.query_offsets.size(); ++h) {
    out.scores.max_queries =
        std::max(out.scores.max_queries, batch.query_offsets[h + 1] - batch.query_offsets[h]);
  }
  out.topk.num_segments = batch.num_jobs;
  out.topk.num_items = batch.offsets.back();
  out.topk.max_segment_len = batch.max_len;
  out.topk.pooling = shape.pooling == Pooling::kMax   ? kernels::TopKPooling::kMax
                     : shape.pooling == Pooling::kAvg ? kernels::TopKPooling::kAvg
                                                      : kernels::TopKPooling::kNone;
  out.topk.pool_kernel = shape.pool_kernel;
  out.topk.penalty.lambda = shape.lambda;
  out.redundancy.num_heads = batch.num_jobs;
  out.redundancy.head_dim = shape.head_dim;
  out.redundancy.block_size = shape.block_size;
  out.redundancy.max_blocks = batch.max_blocks;
  out.redundancy.threshold = shape.redundancy_threshold;
  return out;
}

}  // namespace beaconkv::internal_scorer

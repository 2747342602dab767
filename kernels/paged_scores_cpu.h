// Attention scores of observation queries over the paged keys of many heads: the CPU function
// that defines the result of the CUDA kernel in paged_scores.cu. One "head" here is one
// (sequence, layer, kv_head) due for compression; its keys are the first lengths[t] slots of
// block table t = table_of_head[h], in slot order.
//
// scores of head h = core AttentionScores over those keys (all of them, slot order) with the
// head's queries [num_queries_h, group_size, head_dim]: softmax per query head over the keys
// of q.k / sqrt(head_dim), reduced over the GQA group, then over the queries. BeaconKV scores
// with group_size 1 (every recent query of every query head, and every beacon, is one query),
// kMaxProbs and kMax; SnapKV with its window's queries, kMaxLogits and kMean.
//
// excluded (optional, indexed like scores): keys marked 1 take no part in the softmax, as if
// the head did not hold them, and their score is shape.excluded_score. SnapKV's window scores
// only the keys before it; with the window's keys excluded and excluded_score the pooling's
// padding (-inf for max pooling, 0 for average), pooling a head's scores in position order
// gives what core Pool1d gives over the keys before the window.
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

// Mirrors core GqaReduction / QueryReduction without pulling absl into device code.
enum class ScoreGqa : int32_t { kMaxProbs = 0, kMeanProbs = 1, kMaxLogits = 2 };
enum class ScoreQuery : int32_t { kMax = 0, kMean = 1, kSum = 2 };

struct PagedScoresShape {
  int32_t num_heads = 0;  // heads scored in this call
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t max_blocks = 0;  // row stride of block_tables
  int32_t group_size = 1;  // query heads per query row
  ScoreGqa gqa = ScoreGqa::kMaxProbs;
  ScoreQuery query = ScoreQuery::kMax;
  float excluded_score = 0.0f;  // the score of an excluded key
  // The most queries any head has, if the caller knows it (0: unknown). The CUDA kernel uses it
  // to spread a head's query chunks over several thread blocks when query == kMax; any value
  // gives the same scores. The CPU twin ignores it.
  int32_t max_queries = 0;
  // CUDA only, group_size 1 only: the kernel that keeps the softmax statistics in registers
  // (same scores to rounding). Off until it has run on a GPU (docs/gpu.md).
  bool register_softmax = false;
  // Queries and keys rounded to bfloat16 before the products (core ScoreSpec::bf16).
  bool bf16 = false;
};

void PagedAttentionScoresCpu(const float* k_cache,          // [num_blocks, block_size, head_dim]
                             const int32_t* block_tables,   // [num_tables, max_blocks]
                             const int32_t* lengths,        // [num_tables]
                             const int32_t* table_of_head,  // [num_heads]
                             const float* queries,          // [total_queries, group_size, head_dim]
                             const int32_t* query_offsets,  // [num_heads + 1]
                             const int32_t* score_offsets,  // [num_heads + 1]; sizes = lengths
                             const uint8_t* excluded,       // [score_offsets[num_heads]] or null
                             const PagedScoresShape& shape,
                             float* scores);  // [score_offsets[num_heads]], slot order

}  // namespace beaconkv::kernels

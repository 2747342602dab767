#include "kernels/paged_scores_cpu.h"

#include <algorithm>
#include <vector>

#include "core/check.h"
#include "core/scoring.h"

namespace beaconkv::kernels {
namespace {

ScoreSpec ToCoreSpec(const PagedScoresShape& s) {
  ScoreSpec spec;
  spec.gqa = s.gqa == ScoreGqa::kMeanProbs   ? GqaReduction::kMeanProbs
             : s.gqa == ScoreGqa::kMaxLogits ? GqaReduction::kMaxLogits
                                             : GqaReduction::kMaxProbs;
  spec.query = s.query == ScoreQuery::kMean  ? QueryReduction::kMean
               : s.query == ScoreQuery::kSum ? QueryReduction::kSum
                                             : QueryReduction::kMax;
  spec.bf16 = s.bf16;
  return spec;
}

}  // namespace

void PagedAttentionScoresCpu(const float* k_cache, const int32_t* block_tables,
                             const int32_t* lengths, const int32_t* table_of_head,
                             const float* queries, const int32_t* query_offsets,
                             const int32_t* score_offsets, const uint8_t* excluded,
                             const PagedScoresShape& s, float* scores) {
  const ScoreSpec spec = ToCoreSpec(s);
  const int64_t d = s.head_dim;
  std::vector<float> keys;     // [m, head_dim] the head's scored keys gathered in slot order
  std::vector<int32_t> index;  // [m] their slot
  std::vector<float> out;      // [m] their scores
  ScoreScratch scratch;
  for (int32_t h = 0; h < s.num_heads; ++h) {
    const int32_t t = table_of_head[h];
    const int32_t n = lengths[t];
    BKV_CHECK(score_offsets[h + 1] - score_offsets[h] == n);
    const int32_t* table = block_tables + int64_t{t} * s.max_blocks;
    const uint8_t* skip = excluded == nullptr ? nullptr : excluded + score_offsets[h];
    index.clear();
    for (int32_t j = 0; j < n; ++j) {
      if (skip == nullptr || !skip[j]) index.push_back(j);
    }
    const int32_t m = static_cast<int32_t>(index.size());
    keys.resize(static_cast<size_t>(m) * d);
    for (int32_t i = 0; i < m; ++i) {
      const int32_t j = index[i];
      const int64_t slot = int64_t{table[j / s.block_size]} * s.block_size + j % s.block_size;
      std::copy_n(k_cache + slot * d, d, keys.data() + i * d);
    }
    const int32_t q0 = query_offsets[h], nq = query_offsets[h + 1] - q0;
    float* head_scores = scores + score_offsets[h];
    if (m == n) {  // nothing excluded: score in place
      AttentionScores(keys.data(), 0, n, s.head_dim, queries + int64_t{q0} * s.group_size * d, nq,
                      s.group_size, spec, head_scores, &scratch);
      continue;
    }
    out.assign(m, 0.0f);
    AttentionScores(keys.data(), 0, m, s.head_dim, queries + int64_t{q0} * s.group_size * d, nq,
                    s.group_size, spec, out.data(), &scratch);
    std::fill_n(head_scores, n, s.excluded_score);
    for (int32_t i = 0; i < m; ++i) head_scores[index[i]] = out[i];
  }
}

}  // namespace beaconkv::kernels

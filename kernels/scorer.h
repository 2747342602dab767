// Scoring and selection of many heads' compression at once, as the device runs them: the
// policy plans each head (PolicyState::PlanScoring: observation queries, protected slots, k),
// a Scorer scores the head's keys through its block table and keeps the protected slots plus
// the k best pooled scores. One call serves every due head of every sequence of a step
// (one kernel launch each for scores and top-k on the GPU).
//
// Two implementations share the batch layout built here: PagedTwinScorer runs the CPU twins
// (paged_scores_cpu, segmented_topk_cpu) over a CpuKvStore and is what tests and the engine's
// `scorer=paged` use on any machine; GpuScorer (gpu_scorer.h, CUDA builds) launches the
// kernels over a CudaKvStore. Both give the keep masks the twins define.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "block_manager/kv_store.h"
#include "core/policy.h"
#include "core/types.h"

namespace beaconkv {

// One planned head of one sequence: its block table and the plan's task for it.
struct ScoringJob {
  absl::Span<const BlockId> table;      // the head's block table (at least num_tokens() slots)
  absl::Span<const int32_t> positions;  // [task->num_tokens()] slot order
  const ScoringTask* task = nullptr;
};

// What every job of one Score call shares (jobs of different shapes go to separate calls).
struct ScoringShape {
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t group_size = 1;
  ScoreSpec spec;
  Pooling pooling = Pooling::kNone;
  int32_t pool_kernel = 1;
  bool protected_unscored = false;  // ScoringPlan::protected_unscored
  bool redundancy = false;          // ScoringPlan::redundancy, lambda, redundancy_threshold
  float lambda = 1.0f;
  float redundancy_threshold = 0.5f;
  double rope_theta = 0.0;  // ScoringPlan::rope_theta: RoPE of the tasks' rotated rows

  static ScoringShape Of(const ScoringPlan& plan, int32_t head_dim, int32_t block_size) {
    ScoringShape s;
    s.head_dim = head_dim;
    s.block_size = block_size;
    s.group_size = plan.group_size;
    s.spec = plan.spec;
    s.pooling = plan.pooling;
    s.pool_kernel = plan.pool_kernel;
    s.protected_unscored = plan.protected_unscored;
    s.redundancy = plan.redundancy;
    s.lambda = plan.lambda;
    s.redundancy_threshold = plan.redundancy_threshold;
    s.rope_theta = plan.rope_theta;
    return s;
  }
  bool operator==(const ScoringShape&) const = default;
};

// The flat arrays both scorers consume; built on the host.
struct ScoringBatch {
  int32_t num_jobs = 0;
  int32_t max_blocks = 0;              // row stride of tables
  int32_t max_len = 0;                 // longest job
  std::vector<int32_t> tables;         // [num_jobs, max_blocks], unused entries 0
  std::vector<int32_t> lengths;        // [num_jobs]
  std::vector<int32_t> table_of_head;  // [num_jobs], the identity
  std::vector<float> queries;          // [sum num_queries, group_size, head_dim]
  std::vector<int32_t> query_offsets;  // [num_jobs + 1] in query rows
  std::vector<int32_t> offsets;        // [num_jobs + 1] in tokens: scores / keep / positions
  std::vector<int32_t> positions;      // [offsets.back()]
  std::vector<uint8_t> protect;        // [offsets.back()]
  std::vector<int32_t> k;              // [num_jobs]
  // The tasks' reserved regions (ScoringTask::reserve), empty when no task has one.
  std::vector<uint8_t> reserve;    // [offsets.back()], 0 for tasks without a region
  std::vector<int32_t> reserve_k;  // [num_jobs]
  // RoPE of the tasks' pre-RoPE rows, per head_dim vector of `queries`: table row 0 is
  // position 0 (the identity: x * 1 - y * 0 == x), row r > 0 a rotate_to. Empty when no task
  // has rotated rows.
  std::vector<int32_t> rope_table_row;  // [sum num_queries * group_size]
  std::vector<int32_t> rope_positions;  // [rows of the table]
};

// Validates the jobs against the shape (queries sized to group_size * head_dim rows, tables
// long enough, sizes consistent, k within int32, rotated rows within the queries and a RoPE
// base for them) and lays them out. kInvalidArgument names
// the job and the problem.
absl::Status BuildScoringBatch(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                               ScoringBatch* batch);

// The result of one Score call, flat in the batch's offsets: job j's slots are
// [offsets[j], offsets[j + 1]).
struct ScoringResult {
  std::vector<int32_t> offsets;  // [num_jobs + 1]
  std::vector<float> scores;     // attention scores before pooling, slot order
  std::vector<float> penalty;    // redundancy per token when the shape asks for it, else empty
  std::vector<uint8_t> keep;     // 1 = kept
  absl::Span<const uint8_t> KeepOf(int32_t job) const {
    return absl::MakeConstSpan(keep).subspan(offsets[job], offsets[job + 1] - offsets[job]);
  }
  absl::Span<const float> ScoresOf(int32_t job) const {
    return absl::MakeConstSpan(scores).subspan(offsets[job], offsets[job + 1] - offsets[job]);
  }
};

// The store a scorer reads: its geometry and size.
struct StoreShape {
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;
};

// What every Scorer does first: checks the shape against the store, builds the batch
// (BuildScoringBatch) and checks every table entry against the store's blocks; sizes `result`
// (zero scores, no kept slot). kInvalidArgument names the problem, prefixed with `who`.
absl::Status PrepareScoring(const char* who, const StoreShape& store, const ScoringShape& shape,
                            absl::Span<const ScoringJob> jobs, ScoringBatch* batch,
                            ScoringResult* result);

class Scorer {
 public:
  virtual ~Scorer() = default;
  // Rotates the tasks' pre-RoPE rows, scores and selects every job; the jobs' tables refer
  // to this scorer's store.
  virtual absl::Status Score(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                             ScoringResult* result) = 0;
};

// The CPU twin of the device pipeline, over a host store. Not thread-safe (scratch).
class PagedTwinScorer final : public Scorer {
 public:
  explicit PagedTwinScorer(const CpuKvStore* store) : store_(store) {}
  absl::Status Score(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                     ScoringResult* result) override;

 private:
  const CpuKvStore* store_;
  ScoringBatch batch_;
};

}  // namespace beaconkv

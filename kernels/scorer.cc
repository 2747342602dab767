#include "kernels/scorer.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "kernels/paged_scores_cpu.h"
#include "kernels/redundancy_cpu.h"
#include "kernels/rope_rotate_cpu.h"
#include "kernels/scorer_shapes.h"
#include "kernels/segmented_topk_cpu.h"

namespace beaconkv {
namespace {

absl::Status JobError(size_t j, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("scoring job %d: %s", j, what));
}

}  // namespace

absl::Status BuildScoringBatch(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                               ScoringBatch* batch) {
  if (shape.head_dim < 1 || shape.block_size < 1 || shape.group_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scoring shape: head_dim=%d block_size=%d group_size=%d must all be >= 1",
                        shape.head_dim, shape.block_size, shape.group_size));
  }
  if (shape.pool_kernel < 1 || shape.pool_kernel % 2 == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("scoring shape: pool_kernel=%d must be odd and >= 1", shape.pool_kernel));
  }
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  ScoringBatch& b = *batch;
  b.num_jobs = static_cast<int32_t>(jobs.size());
  b.max_blocks = 1;
  b.max_len = 0;
  const int64_t row = int64_t{shape.group_size} * shape.head_dim;
  int64_t tokens = 0, rows = 0;
  bool any_rotated = false, any_reserve = false;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ScoringJob& job = jobs[j];
    if (job.task == nullptr) return JobError(j, "no task");
    const ScoringTask& t = *job.task;
    const int64_t n = static_cast<int64_t>(t.protect.size());
    if (n > kMax) return JobError(j, absl::StrFormat("%d tokens exceed 2^31 - 1", n));
    if (t.num_queries < 0 || static_cast<int64_t>(t.queries.size()) != t.num_queries * row) {
      return JobError(
          j, absl::StrFormat("%d queries of %d floats need %d floats, got %d", t.num_queries, row,
                             t.num_queries * row, t.queries.size()));
    }
    if (static_cast<int64_t>(job.positions.size()) != n) {
      return JobError(
          j, absl::StrFormat("positions of %d tokens for a task of %d", job.positions.size(), n));
    }
    if (static_cast<int64_t>(job.table.size()) * shape.block_size < n) {
      return JobError(j, absl::StrFormat("a table of %d blocks of %d cannot hold %d tokens",
                                         job.table.size(), shape.block_size, n));
    }
    if (t.k < 0 || t.k > kMax) return JobError(j, absl::StrFormat("k=%d out of range", t.k));
    if (!t.reserve.empty() && static_cast<int64_t>(t.reserve.size()) != n) {
      return JobError(
          j, absl::StrFormat("a reserved region of %d slots for %d tokens", t.reserve.size(), n));
    }
    if (t.reserve_k < 0 || t.reserve_k > kMax || (t.reserve_k > 0 && t.reserve.empty())) {
      return JobError(j, absl::StrFormat("reserve_k=%d with a region of %d slots", t.reserve_k,
                                         t.reserve.size()));
    }
    any_reserve |= t.reserve_k > 0;
    if (t.rotated_rows < 0 || t.rotated_rows > t.num_queries || t.rotate_to < 0) {
      return JobError(j, absl::StrFormat("%d rotated rows to position %d for %d queries",
                                         t.rotated_rows, t.rotate_to, t.num_queries));
    }
    if (t.rotated_rows > 0 && !(shape.rope_theta > 0.0)) {
      return JobError(j, "rotated rows need the shape's rope_theta");
    }
    any_rotated |= t.rotated_rows > 0;
    tokens += n;
    rows += t.num_queries;
    if (tokens > kMax || rows > kMax) return JobError(j, "the batch exceeds 2^31 tokens or rows");
    b.max_blocks = std::max<int32_t>(
        b.max_blocks, static_cast<int32_t>((n + shape.block_size - 1) / shape.block_size));
    b.max_len = std::max<int32_t>(b.max_len, static_cast<int32_t>(n));
  }
  b.tables.assign(static_cast<size_t>(b.num_jobs) * b.max_blocks, 0);
  b.lengths.resize(b.num_jobs);
  b.table_of_head.resize(b.num_jobs);
  b.k.resize(b.num_jobs);
  b.query_offsets.assign(1, 0);
  b.offsets.assign(1, 0);
  b.queries.clear();
  b.queries.reserve(static_cast<size_t>(rows * row));
  b.positions.clear();
  b.positions.reserve(tokens);
  b.protect.clear();
  b.protect.reserve(tokens);
  b.reserve.clear();
  b.reserve_k.clear();
  if (any_reserve) {
    b.reserve.reserve(tokens);
    b.reserve_k.reserve(b.num_jobs);
  }
  b.rope_table_row.clear();
  b.rope_positions.clear();
  if (any_rotated) {
    b.rope_table_row.reserve(static_cast<size_t>(rows) * shape.group_size);
    b.rope_positions.push_back(0);
  }
  for (int32_t j = 0; j < b.num_jobs; ++j) {
    const ScoringJob& job = jobs[j];
    const ScoringTask& t = *job.task;
    const int32_t used = (t.num_tokens() + shape.block_size - 1) / shape.block_size;
    std::copy_n(job.table.begin(), used,
                b.tables.begin() + static_cast<ptrdiff_t>(j) * b.max_blocks);
    b.lengths[j] = t.num_tokens();
    b.table_of_head[j] = j;
    b.k[j] = static_cast<int32_t>(t.k);
    b.queries.insert(b.queries.end(), t.queries.begin(), t.queries.end());
    b.query_offsets.push_back(b.query_offsets.back() + t.num_queries);
    if (any_rotated) {
      const int32_t row = t.rotated_rows > 0 ? static_cast<int32_t>(b.rope_positions.size()) : 0;
      if (t.rotated_rows > 0) b.rope_positions.push_back(t.rotate_to);
      const int64_t plain = int64_t{t.num_queries - t.rotated_rows} * shape.group_size;
      b.rope_table_row.insert(b.rope_table_row.end(), plain, 0);
      b.rope_table_row.insert(b.rope_table_row.end(), int64_t{t.rotated_rows} * shape.group_size,
                              row);
    }
    b.positions.insert(b.positions.end(), job.positions.begin(), job.positions.end());
    b.protect.insert(b.protect.end(), t.protect.begin(), t.protect.end());
    if (any_reserve) {
      if (t.reserve_k > 0) {
        b.reserve.insert(b.reserve.end(), t.reserve.begin(), t.reserve.end());
      } else {
        b.reserve.insert(b.reserve.end(), t.protect.size(), 0);
      }
      b.reserve_k.push_back(static_cast<int32_t>(t.reserve_k));
    }
    b.offsets.push_back(b.offsets.back() + t.num_tokens());
  }
  return absl::OkStatus();
}

absl::Status PrepareScoring(const char* who, const StoreShape& store, const ScoringShape& shape,
                            absl::Span<const ScoringJob> jobs, ScoringBatch* batch,
                            ScoringResult* result) {
  if (shape.head_dim != store.head_dim || shape.block_size != store.block_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: shape head_dim=%d block_size=%d, the store has %d / %d", who,
                        shape.head_dim, shape.block_size, store.head_dim, store.block_size));
  }
  if (absl::Status s = BuildScoringBatch(shape, jobs, batch); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", who, s.message()));
  }
  for (int32_t id : batch->tables) {
    if (id < 0 || id >= store.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: block %d outside the store's %d", who, id, store.num_blocks));
    }
  }
  const int32_t items = batch->offsets.back();
  result->offsets = batch->offsets;
  result->scores.assign(items, 0.0f);
  result->penalty.assign(shape.redundancy ? items : 0, 0.0f);
  result->keep.assign(items, 0);
  return absl::OkStatus();
}

absl::Status PagedTwinScorer::Score(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                                    ScoringResult* result) {
  const StoreShape store{store_->head_dim(), store_->block_size(), store_->num_blocks()};
  if (absl::Status s = PrepareScoring("scorer", store, shape, jobs, &batch_, result); !s.ok())
    return s;
  internal_scorer::KernelShapes ks = internal_scorer::ToKernelShapes(shape, batch_);
  if (!batch_.rope_table_row.empty()) {
    absl::StatusOr<Rope> rope = Rope::Create({shape.head_dim, shape.rope_theta});
    if (!rope.ok()) return rope.status();
    kernels::RotateRowsCpu(
        *rope, batch_.queries.data(), batch_.rope_table_row.data(), batch_.rope_positions.data(),
        static_cast<int32_t>(batch_.rope_table_row.size()), batch_.queries.data());
  }
  kernels::PagedAttentionScoresCpu(store_->keys_data(), batch_.tables.data(), batch_.lengths.data(),
                                   batch_.table_of_head.data(), batch_.queries.data(),
                                   batch_.query_offsets.data(), batch_.offsets.data(),
                                   internal_scorer::ExcludedKeys(shape, batch_.protect.data()),
                                   ks.scores, result->scores.data());
  if (shape.redundancy) {
    kernels::PagedRedundancyScoresCpu(store_->keys_data(), batch_.tables.data(),
                                      batch_.lengths.data(), batch_.table_of_head.data(),
                                      batch_.positions.data(), batch_.offsets.data(), ks.redundancy,
                                      result->penalty.data());
    ks.topk.penalty.values = result->penalty.data();
  }
  if (!batch_.reserve.empty()) ks.topk.reserve = {batch_.reserve.data(), batch_.reserve_k.data()};
  kernels::SegmentedTopKCpu(batch_.offsets.data(), result->scores.data(), batch_.positions.data(),
                            batch_.protect.data(), batch_.k.data(), ks.topk, result->keep.data());
  return absl::OkStatus();
}

}  // namespace beaconkv

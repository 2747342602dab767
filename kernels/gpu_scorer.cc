#include "kernels/gpu_scorer.h"

#include <string>

#include "absl/strings/str_format.h"
#include "kernels/paged_scores.h"
#include "kernels/redundancy.h"
#include "kernels/rope_rotate.h"
#include "kernels/rope_rotate_cpu.h"
#include "kernels/scorer_shapes.h"
#include "kernels/segmented_topk.h"

namespace beaconkv::kernels {
namespace {

enum Buf {
  kTables,
  kLengths,
  kTableOfHead,
  kQueries,
  kQueryOffsets,
  kOffsets,
  kPositions,
  kProtect,
  kK,
  kScores,
  kKeep,
  kTemp,
  kPenalty,
  kWork,
  kRopeTable,
  kRopeRow,
  kReserve,
  kReserveK,
  kBufCount,
};

absl::Status CudaError(cudaError_t e, const char* what) {
  return absl::InternalError(
      absl::StrFormat("GpuScorer: %s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
}

}  // namespace

static_assert(kBufCount == GpuScorer::NumBuffers(), "one device buffer per Buf");

GpuScorer::GpuScorer(const CudaKvStore* store, cudaStream_t stream)
    : store_(store), stream_(stream) {}

GpuScorer::~GpuScorer() {
  for (void* p : buffers_) cudaFree(p);
}

void* GpuScorer::Buffer(int which, size_t bytes, cudaError_t* error) {
  if (bytes == 0) bytes = 16;
  if (bytes > sizes_[which]) {
    cudaFree(buffers_[which]);
    buffers_[which] = nullptr;
    sizes_[which] = 0;
    // Only a failure is written: an earlier call's error is kept for the caller to report.
    if (const cudaError_t e = cudaMalloc(&buffers_[which], bytes); e != cudaSuccess) {
      *error = e;
      return nullptr;
    }
    sizes_[which] = bytes;
  }
  return buffers_[which];
}

absl::Status GpuScorer::Score(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                              ScoringResult* result) {
  const StoreShape store{store_->head_dim(), store_->block_size(), store_->num_blocks()};
  if (absl::Status s = PrepareScoring("GpuScorer", store, shape, jobs, &batch_, result); !s.ok())
    return s;
  const int32_t items = batch_.offsets.back();
  if (batch_.num_jobs == 0) return absl::OkStatus();
  internal_scorer::KernelShapes ks = internal_scorer::ToKernelShapes(shape, batch_);

  cudaError_t e = cudaSuccess;
  // Uploads a host vector into buffer `which`; returns its device copy (null on error).
  // After a failure it does nothing, so `e` keeps the first error.
  auto up = [&](int which, const auto& v) -> decltype(v.data()) {
    if (e != cudaSuccess) return nullptr;
    const size_t bytes = v.size() * sizeof(v[0]);
    void* d = Buffer(which, bytes, &e);
    if (d == nullptr) return nullptr;
    if (bytes > 0 &&
        (e = cudaMemcpyAsync(d, v.data(), bytes, cudaMemcpyHostToDevice, stream_)) != cudaSuccess)
      return nullptr;
    return static_cast<decltype(v.data())>(d);
  };
  const int32_t* tables = up(kTables, batch_.tables);
  const int32_t* lengths = up(kLengths, batch_.lengths);
  const int32_t* table_of_head = up(kTableOfHead, batch_.table_of_head);
  up(kQueries, batch_.queries);
  auto* queries = static_cast<float*>(buffers_[kQueries]);  // rotated in place below
  const int32_t* query_offsets = up(kQueryOffsets, batch_.query_offsets);
  const int32_t* offsets = up(kOffsets, batch_.offsets);
  const int32_t* positions = up(kPositions, batch_.positions);
  const uint8_t* protect = up(kProtect, batch_.protect);
  const int32_t* k = up(kK, batch_.k);
  if (e != cudaSuccess) return CudaError(e, "upload");
  if (!batch_.rope_table_row.empty()) {
    absl::StatusOr<Rope> rope = Rope::Create({shape.head_dim, shape.rope_theta});
    if (!rope.ok()) return rope.status();
    rope_table_.resize(batch_.rope_positions.size() * shape.head_dim);
    kernels::RopeAngleTable(*rope, batch_.rope_positions.data(),
                            static_cast<int32_t>(batch_.rope_positions.size()), rope_table_.data());
    const float* table = up(kRopeTable, rope_table_);
    const int32_t* table_row = up(kRopeRow, batch_.rope_table_row);
    if (e != cudaSuccess) return CudaError(e, "upload (RoPE)");
    if ((e = RotateRows(queries, table_row, table,
                        static_cast<int32_t>(batch_.rope_table_row.size()), shape.head_dim, queries,
                        stream_)) != cudaSuccess)
      return CudaError(e, "RotateRows");
  }
  auto* scores = static_cast<float*>(Buffer(kScores, items * sizeof(float), &e));
  auto* keep = static_cast<uint8_t*>(Buffer(kKeep, items, &e));
  if (e != cudaSuccess) return CudaError(e, "cudaMalloc");

  if ((e = PagedAttentionScores(
           store_->keys(), store_->dtype(), tables, lengths, table_of_head, queries, query_offsets,
           offsets, internal_scorer::ExcludedKeys(shape, protect), ks.scores, scores, stream_)) !=
      cudaSuccess) {
    return e == cudaErrorInvalidValue
               ? absl::InvalidArgumentError(absl::StrFormat(
                     "GpuScorer: PagedAttentionScores does not take head_dim=%d group_size=%d",
                     shape.head_dim, shape.group_size))
               : CudaError(e, "PagedAttentionScores");
  }
  float* penalty = nullptr;
  if (shape.redundancy) {
    size_t work_bytes = 0;
    if ((e = PagedRedundancyScores(nullptr, &work_bytes, store_->keys(), store_->dtype(), tables,
                                   lengths, table_of_head, positions, offsets, items, ks.redundancy,
                                   nullptr, stream_)) != cudaSuccess)
      return CudaError(e, "PagedRedundancyScores (size)");
    void* work = Buffer(kWork, work_bytes, &e);
    penalty = static_cast<float*>(Buffer(kPenalty, items * sizeof(float), &e));
    if (work == nullptr || penalty == nullptr) return CudaError(e, "cudaMalloc (redundancy)");
    work_bytes = sizes_[kWork];
    if ((e = PagedRedundancyScores(work, &work_bytes, store_->keys(), store_->dtype(), tables,
                                   lengths, table_of_head, positions, offsets, items, ks.redundancy,
                                   penalty, stream_)) != cudaSuccess)
      return CudaError(e, "PagedRedundancyScores");
    ks.topk.penalty.values = penalty;
  }
  if (!batch_.reserve.empty()) {
    ks.topk.reserve.mask = up(kReserve, batch_.reserve);
    ks.topk.reserve.k = up(kReserveK, batch_.reserve_k);
    if (e != cudaSuccess) return CudaError(e, "upload (reserved region)");
  }
  size_t temp_bytes = 0;
  if ((e = SegmentedTopK(nullptr, &temp_bytes, offsets, scores, positions, protect, k, ks.topk,
                         TopKAlgorithm::kAuto, keep, stream_)) != cudaSuccess)
    return CudaError(e, "SegmentedTopK (size)");
  void* temp = Buffer(kTemp, temp_bytes, &e);
  if (temp == nullptr) return CudaError(e, "cudaMalloc (top-k scratch)");
  temp_bytes = sizes_[kTemp];
  if ((e = SegmentedTopK(temp, &temp_bytes, offsets, scores, positions, protect, k, ks.topk,
                         TopKAlgorithm::kAuto, keep, stream_)) != cudaSuccess)
    return CudaError(e, "SegmentedTopK");
  if ((e = cudaMemcpyAsync(result->scores.data(), scores, items * sizeof(float),
                           cudaMemcpyDeviceToHost, stream_)) != cudaSuccess ||
      (e = cudaMemcpyAsync(result->keep.data(), keep, items, cudaMemcpyDeviceToHost, stream_)) !=
          cudaSuccess ||
      (penalty != nullptr &&
       (e = cudaMemcpyAsync(result->penalty.data(), penalty, items * sizeof(float),
                            cudaMemcpyDeviceToHost, stream_)) != cudaSuccess) ||
      (e = cudaStreamSynchronize(stream_)) != cudaSuccess)
    return CudaError(e, "download");
  return absl::OkStatus();
}

}  // namespace beaconkv::kernels

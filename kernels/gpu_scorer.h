// The Scorer on the device: PagedAttentionScores then SegmentedTopK over a CudaKvStore's keys,
// one launch each for every job of a call. PagedTwinScorer (scorer.h) defines the result up
// to the scores' rounding: the keep masks are exactly SegmentedTopKCpu of the device scores.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda_kv_store.h"
#include "kernels/scorer.h"

namespace beaconkv::kernels {

class GpuScorer final : public Scorer {
 public:
  // The store's keys are read in place; `store` must outlive the scorer. Each call runs on
  // `stream` and returns when the scores and masks are back on the host.
  GpuScorer(const CudaKvStore* store, cudaStream_t stream = nullptr);
  ~GpuScorer() override;
  GpuScorer(const GpuScorer&) = delete;
  GpuScorer& operator=(const GpuScorer&) = delete;

  // kInvalidArgument for bad jobs (BuildScoringBatch) or a shape the kernels do not take
  // (head_dim other than 32/64/128/256); kInternal with the CUDA error's name.
  absl::Status Score(const ScoringShape& shape, absl::Span<const ScoringJob> jobs,
                     ScoringResult* result) override;

  static constexpr int NumBuffers() { return kNumBuffers; }

 private:
  // Device buffer `which`, at least `bytes` long (grown, never shrunk); null with *error set
  // when cudaMalloc fails (a success leaves *error as it was).
  void* Buffer(int which, size_t bytes, cudaError_t* error);

  static constexpr int kNumBuffers = 18;  // gpu_scorer.cc checks it against its list
  const CudaKvStore* store_;
  cudaStream_t stream_;
  ScoringBatch batch_;
  std::vector<float> rope_table_;  // host cos/sin table of the batch's rotations
  void* buffers_[kNumBuffers] = {};
  size_t sizes_[kNumBuffers] = {};
};

}  // namespace beaconkv::kernels

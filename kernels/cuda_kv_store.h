// A KvStore over device memory: the block manager's data movement (copy-on-write copies,
// compaction moves, positions, swap to and from a host CpuKvStore) carried out with the cache
// kernels of cache_ops.h. CpuKvStore (block_manager/kv_store.h) defines every result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "block_manager/kv_store.h"

namespace beaconkv::kernels {

class CudaKvStore final : public KvStore {
 public:
  // Wraps device memory its owner allocated: keys and values [num_blocks, block_size,
  // head_dim] float32, positions [num_blocks, block_size] int32. Every call is ordered on
  // `stream` and returns after its work is done (the block manager reuses slots right away).
  // A CUDA error is a broken device or a bug here, not user input: it aborts with its name.
  CudaKvStore(float* keys, float* values, int32_t* positions, int32_t num_blocks,
              int32_t block_size, int32_t head_dim, cudaStream_t stream = nullptr);
  ~CudaKvStore() override;
  CudaKvStore(const CudaKvStore&) = delete;
  CudaKvStore& operator=(const CudaKvStore&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t head_dim() const { return head_dim_; }
  float* keys() const { return keys_; }
  float* values() const { return values_; }
  int32_t* positions() const { return positions_; }

  void CopyBlocks(absl::Span<const BlockCopy> copies) override;
  void MoveSlots(absl::Span<const SlotMove> moves) override;
  void SetPosition(SlotRef slot, int32_t position) override;
  void SwapOut(absl::Span<const BlockCopy> copies, CpuKvStore& host) override;
  void SwapIn(absl::Span<const BlockCopy> copies, const CpuKvStore& host) override;

 private:
  // Device int32 staging for index lists (grown as needed, reused).
  int32_t* Stage(const int32_t* host, int64_t n, int which);
  // Stages two equal-length index lists, runs `launch(a, b, n)` on the stream and waits.
  void RunIndexed(
      const std::vector<int32_t>& a, const std::vector<int32_t>& b, const char* what,
      const std::function<cudaError_t(const int32_t*, const int32_t*, int32_t)>& launch);
  void CheckBlock(BlockId b) const;
  void CheckSlot(SlotRef s) const;
  int64_t Slot(SlotRef s) const { return int64_t{s.block} * block_size_ + s.offset; }

  float* keys_;
  float* values_;
  int32_t* positions_;
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t head_dim_;
  cudaStream_t stream_;
  int32_t* staging_[2] = {nullptr, nullptr};
  int64_t staging_size_[2] = {0, 0};
};

}  // namespace beaconkv::kernels

// A KvStore over device memory: the block manager's data movement (copy-on-write copies,
// compaction moves, positions, swap to and from a host CpuKvStore) carried out with the cache
// kernels of cache_ops.h. CpuKvStore (block_manager/kv_store.h) defines every result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "block_manager/kv_store.h"
#include "kernels/kv_dtype.h"

namespace beaconkv::kernels {

class CudaKvStore final : public KvStore {
 public:
  // Wraps device memory its owner allocated: keys and values [num_blocks, block_size,
  // head_dim] of `dtype`, positions [num_blocks, block_size] int32. Every call is ordered on
  // `stream` and returns after its work is done (the block manager reuses slots right away).
  // Swaps convert to and from the host store's float32 (16-bit: round to nearest even).
  // A CUDA error is a broken device or a bug here, not user input: it aborts with its name.
  CudaKvStore(void* keys, void* values, int32_t* positions, int32_t num_blocks, int32_t block_size,
              int32_t head_dim, KvDtype dtype = KvDtype::kFloat32, cudaStream_t stream = nullptr);
  ~CudaKvStore() override;
  CudaKvStore(const CudaKvStore&) = delete;
  CudaKvStore& operator=(const CudaKvStore&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t head_dim() const { return head_dim_; }
  KvDtype dtype() const { return dtype_; }
  void* keys() const { return keys_; }
  void* values() const { return values_; }
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

  // Copies `elems` stored elements at device `src` into host floats, and back.
  void ToHostFloats(const void* src, int64_t elems, float* dst, const char* what);
  void FromHostFloats(const float* src, int64_t elems, void* dst, const char* what);
  char* KeyBytes(BlockId b) const {
    return static_cast<char*>(keys_) + int64_t{b} * block_size_ * head_dim_ * elem_bytes_;
  }
  char* ValueBytes(BlockId b) const {
    return static_cast<char*>(values_) + int64_t{b} * block_size_ * head_dim_ * elem_bytes_;
  }

  void* keys_;
  void* values_;
  int32_t* positions_;
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t head_dim_;
  KvDtype dtype_;
  int32_t elem_bytes_;
  cudaStream_t stream_;
  std::vector<uint16_t> bits_;  // host staging of 16-bit swaps
  int32_t* staging_[2] = {nullptr, nullptr};
  int64_t staging_size_[2] = {0, 0};
};

}  // namespace beaconkv::kernels

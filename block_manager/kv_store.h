// Where K/V bytes live. The block manager decides which slot holds which token; a KvStore
// carries out the data movement those decisions imply (copy-on-write, compaction, swap).
// CpuKvStore keeps everything in host memory and is the reference every device store
// must match; a device store wraps memory its owner allocated.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/types.h"

namespace beaconkv {

// Compaction moves one token from a tail slot into a hole: key, value and position.
struct SlotMove {
  SlotRef from;
  SlotRef to;
};

struct BlockCopy {
  BlockId src = kNullBlock;
  BlockId dst = kNullBlock;
};

class CpuKvStore;

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Copies every slot (K, V, position) of block `src` into block `dst`.
  virtual void CopyBlocks(absl::Span<const BlockCopy> copies) = 0;
  // Moves are independent: no move reads a slot another move writes.
  virtual void MoveSlots(absl::Span<const SlotMove> moves) = 0;
  virtual void SetPosition(SlotRef slot, int32_t position) = 0;
  // Swap: `src` ids are in this store, `dst` ids in `host` (out), or the reverse (in).
  virtual void SwapOut(absl::Span<const BlockCopy> copies, CpuKvStore& host) = 0;
  virtual void SwapIn(absl::Span<const BlockCopy> copies, const CpuKvStore& host) = 0;
};

class CpuKvStore final : public KvStore {
 public:
  CpuKvStore(int32_t num_blocks, int32_t block_size, int32_t head_dim);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t head_dim() const { return head_dim_; }

  float* key(SlotRef s) { return keys_.data() + SlotOffset(s) * head_dim_; }
  float* value(SlotRef s) { return values_.data() + SlotOffset(s) * head_dim_; }
  const float* key(SlotRef s) const { return keys_.data() + SlotOffset(s) * head_dim_; }
  const float* value(SlotRef s) const { return values_.data() + SlotOffset(s) * head_dim_; }
  int32_t position(SlotRef s) const { return positions_[SlotOffset(s)]; }
  // A hint that position(s) will be read soon (any SlotRef; nothing is read or checked).
  void PrefetchPosition(SlotRef s) const { __builtin_prefetch(positions_.data() + SlotOffset(s)); }
  const float* keys_data() const { return keys_.data(); }      // [num_blocks, block_size, head_dim]
  const float* values_data() const { return values_.data(); }  // [num_blocks, block_size, head_dim]

  void CopyBlocks(absl::Span<const BlockCopy> copies) override;
  void MoveSlots(absl::Span<const SlotMove> moves) override;
  void SetPosition(SlotRef slot, int32_t position) override {
    positions_[SlotOffset(slot)] = position;
  }
  void SwapOut(absl::Span<const BlockCopy> copies, CpuKvStore& host) override;
  void SwapIn(absl::Span<const BlockCopy> copies, const CpuKvStore& host) override;

 private:
  int64_t SlotOffset(SlotRef s) const {
    return static_cast<int64_t>(s.block) * block_size_ + s.offset;
  }
  static void CopyBlockBetween(const CpuKvStore& from, BlockId src, CpuKvStore& to, BlockId dst);

  int32_t num_blocks_;
  int32_t block_size_;
  int32_t head_dim_;
  std::vector<float> keys_;         // [num_blocks, block_size, head_dim]
  std::vector<float> values_;       // [num_blocks, block_size, head_dim]
  std::vector<int32_t> positions_;  // [num_blocks, block_size]; original token positions
};

}  // namespace beaconkv

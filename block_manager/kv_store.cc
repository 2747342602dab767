#include "block_manager/kv_store.h"

#include <algorithm>

#include "core/check.h"

namespace beaconkv {

CpuKvStore::CpuKvStore(int32_t num_blocks, int32_t block_size, int32_t head_dim)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      head_dim_(head_dim),
      keys_(static_cast<size_t>(num_blocks) * block_size * head_dim, 0.0f),
      values_(static_cast<size_t>(num_blocks) * block_size * head_dim, 0.0f),
      positions_(static_cast<size_t>(num_blocks) * block_size, -1) {
  BKV_CHECK(num_blocks >= 1 && block_size >= 1 && head_dim >= 1);
}

void CpuKvStore::CopyBlockBetween(const CpuKvStore& from, BlockId src, CpuKvStore& to,
                                  BlockId dst) {
  BKV_CHECK(from.block_size_ == to.block_size_ && from.head_dim_ == to.head_dim_);
  BKV_CHECK(src >= 0 && src < from.num_blocks_ && dst >= 0 && dst < to.num_blocks_);
  const int64_t slots = from.block_size_;
  const int64_t elems = slots * from.head_dim_;
  std::copy_n(from.keys_.begin() + src * elems, elems, to.keys_.begin() + dst * elems);
  std::copy_n(from.values_.begin() + src * elems, elems, to.values_.begin() + dst * elems);
  std::copy_n(from.positions_.begin() + src * slots, slots, to.positions_.begin() + dst * slots);
}

void CpuKvStore::CopyBlocks(absl::Span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies) CopyBlockBetween(*this, c.src, *this, c.dst);
}

void CpuKvStore::MoveSlots(absl::Span<const SlotMove> moves) {
  for (const SlotMove& m : moves) {
    std::copy_n(key(m.from), head_dim_, key(m.to));
    std::copy_n(value(m.from), head_dim_, value(m.to));
    positions_[SlotOffset(m.to)] = positions_[SlotOffset(m.from)];
  }
}

void CpuKvStore::SwapOut(absl::Span<const BlockCopy> copies, CpuKvStore& host) {
  for (const BlockCopy& c : copies) CopyBlockBetween(*this, c.src, host, c.dst);
}

void CpuKvStore::SwapIn(absl::Span<const BlockCopy> copies, const CpuKvStore& host) {
  for (const BlockCopy& c : copies) CopyBlockBetween(host, c.src, *this, c.dst);
}

}  // namespace beaconkv

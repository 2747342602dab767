#include "block_manager/block_pool.h"

#include "absl/strings/str_format.h"
#include "core/check.h"

namespace beaconkv {

BlockPool::BlockPool(int32_t num_blocks) : refcount_(num_blocks < 1 ? 1 : num_blocks, 0) {
  BKV_CHECK_MSG(num_blocks >= 1, "a pool needs at least the null block");
  free_stack_.reserve(num_blocks - 1);
  for (BlockId b = num_blocks - 1; b >= 1; --b) free_stack_.push_back(b);
}

absl::StatusOr<BlockId> BlockPool::Take() {
  if (free_stack_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out of KV blocks: needed 1, 0 free of %d", num_usable()));
  }
  return TakeReserved();
}

BlockId BlockPool::TakeReserved() {
  BKV_CHECK(!free_stack_.empty());
  const BlockId b = free_stack_.back();
  free_stack_.pop_back();
  BKV_CHECK(refcount_[b] == 0);
  refcount_[b] = 1;
  return b;
}

absl::Status BlockPool::TakeMany(int32_t n, std::vector<BlockId>* out) {
  BKV_CHECK(n >= 0);
  if (n > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("out of KV blocks: needed %d, %d free of %d", n, num_free(), num_usable()));
  }
  out->reserve(out->size() + n);
  for (int32_t i = 0; i < n; ++i) out->push_back(TakeReserved());
  return absl::OkStatus();
}

void BlockPool::AddRef(BlockId block) {
  BKV_CHECK(block > kNullBlock && block < num_blocks());
  BKV_CHECK_MSG(refcount_[block] > 0, "AddRef on a free block");
  if (++refcount_[block] == 2) ++num_shared_;
}

bool BlockPool::Release(BlockId block) {
  BKV_CHECK(block > kNullBlock && block < num_blocks());
  BKV_CHECK_MSG(refcount_[block] > 0, "double free of a KV block");
  const int32_t left = --refcount_[block];
  if (left == 1) --num_shared_;
  if (left > 0) return false;
  free_stack_.push_back(block);
  return true;
}

std::vector<BlockId> BlockPool::FreeList() const {
  return std::vector<BlockId>(free_stack_.rbegin(), free_stack_.rend());
}

absl::Status BlockPool::VerifyIntegrity() const {
  if (refcount_[kNullBlock] != 0) return absl::InternalError("the null block has a refcount");
  std::vector<char> seen(refcount_.size(), 0);
  for (BlockId b : free_stack_) {
    if (b <= kNullBlock || b >= num_blocks())
      return absl::InternalError(absl::StrFormat("free list holds invalid block %d", b));
    if (seen[b]) return absl::InternalError(absl::StrFormat("block %d is free twice", b));
    seen[b] = 1;
    if (refcount_[b] != 0)
      return absl::InternalError(
          absl::StrFormat("block %d is free but has refcount %d", b, refcount_[b]));
  }
  int32_t shared = 0;
  for (BlockId b = 1; b < num_blocks(); ++b) {
    if (refcount_[b] < 0)
      return absl::InternalError(absl::StrFormat("block %d has negative refcount", b));
    if (refcount_[b] == 0 && !seen[b])
      return absl::InternalError(absl::StrFormat("block %d is lost: refcount 0, not free", b));
    if (refcount_[b] > 1) ++shared;
  }
  if (shared != num_shared_)
    return absl::InternalError(
        absl::StrFormat("shared-block count %d, but %d blocks are shared", num_shared_, shared));
  return absl::OkStatus();
}

}  // namespace beaconkv

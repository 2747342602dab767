// A fixed pool of physical KV blocks with reference counts and an O(1) free list.
//
// Free-list order (deterministic, asserted in tests): the free list is a stack. A fresh pool
// hands out blocks in ascending id order 1, 2, 3, ...; a block given back is the next one
// taken (last in, first out), which reuses the most recently touched memory first. Block 0
// is the null block: it is never handed out and never freed.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/types.h"

namespace beaconkv {

class BlockPool {
 public:
  // `num_blocks` counts the null block, so num_blocks - 1 blocks are usable.
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t num_usable() const { return num_blocks() - 1; }
  int32_t num_free() const { return static_cast<int32_t>(free_stack_.size()); }
  int32_t num_used() const { return num_usable() - num_free(); }
  // Blocks whose refcount is above one (shared by forked sequences).
  int32_t num_shared() const { return num_shared_; }

  // Takes one block with refcount 1.
  absl::StatusOr<BlockId> Take();
  // Takes `n` blocks, appending them to `out` in take order; all or nothing: on
  // kResourceExhausted the pool and `out` are unchanged.
  absl::Status TakeMany(int32_t n, std::vector<BlockId>* out);
  // Unchecked single take for callers that already reserved (checked num_free()).
  BlockId TakeReserved();

  void AddRef(BlockId block);
  // Drops one reference; returns true when the block went back to the free list.
  bool Release(BlockId block);
  int32_t RefCount(BlockId block) const { return refcount_[block]; }

  // The free list from the next block to be taken to the last.
  std::vector<BlockId> FreeList() const;
  // Free list and refcounts agree; no block is free twice; the null block is untouched.
  absl::Status VerifyIntegrity() const;

 private:
  std::vector<BlockId> free_stack_;  // [num_free]; back() is taken next
  std::vector<int32_t> refcount_;    // [num_blocks]; 0 = free (or the null block)
  int32_t num_shared_ = 0;
};

}  // namespace beaconkv

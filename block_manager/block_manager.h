// The head-granular paged KV cache: per sequence, one block table per (layer, kv_head), all
// drawing from one pool of physical blocks. Heads of one sequence may hold different
// numbers of tokens, so eviction in one head frees real blocks for any other sequence.
//
// Data movement goes through an optional KvStore: with one attached, copy-on-write,
// compaction and swap move the bytes; without one (metadata only) the manager still
// returns every plan so a caller can move device memory itself.
//
// Thread safety: every public method takes an internal mutex, so one manager may be called
// from several threads; each call is atomic. Two results are views, not copies, and are only
// valid until the next call that changes what they show: the span from BlockTable() (until
// that sequence changes) and pool() / host_store() (unsynchronized, for single-threaded
// callers and tests). Under concurrent use, copy a table while no other thread changes that
// sequence and use FreeList() rather than pool().FreeList(). docs/reliability.md.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "block_manager/block_pool.h"
#include "block_manager/compaction_plan.h"
#include "block_manager/kv_store.h"
#include "core/policy_types.h"
#include "core/types.h"

namespace beaconkv {

struct BlockManagerConfig {
  KvShape shape;
  int32_t num_blocks = 0;       // device pool size, counting the null block 0
  int32_t num_host_blocks = 0;  // host (swap) pool size, counting its null block; 0 = no swap
};

// What ApplyKeepSets did, in the order it did it: copy-on-write of shared blocks that
// received survivors, then the slot moves, then the tail blocks released.
struct CompactionPlan {
  std::vector<HeadCompaction> heads;
  std::vector<BlockCopy> copies;
  std::vector<SlotMove> moves;
  int32_t blocks_released = 0;  // references dropped on emptied tail blocks
  int32_t blocks_freed = 0;     // of those, blocks that went back to the free list
  int64_t tokens_evicted = 0;
};

class BlockManager {
 public:
  // `store` (device data, may be null) must have at least num_blocks blocks of the shape's
  // block_size and head_dim and outlive the manager. Host swap memory is owned here.
  static absl::StatusOr<std::unique_ptr<BlockManager>> Create(const BlockManagerConfig& config,
                                                              KvStore* store);
  static absl::Status ValidateConfig(const BlockManagerConfig& config);

  const KvShape& shape() const { return shape_; }

  // Allocates ceil(prompt_len / block_size) blocks in every (layer, kv_head), all or nothing,
  // and records positions 0 .. prompt_len-1.
  absl::Status AddSequence(SequenceId id, int32_t prompt_len);
  // Appends one token (the next position) to every head of `id`. A head takes a new block
  // only when its tail block is full, and copies a shared tail block before writing.
  // `slots_out`, if not empty, receives the written slot of each head: [num_heads_total].
  absl::Status AppendToken(SequenceId id, absl::Span<SlotRef> slots_out = {});
  // Blocks AppendToken(id) would take now.
  absl::StatusOr<int32_t> BlocksNeededToAppend(SequenceId id) const;
  // `child` shares all of `parent`'s blocks; the first write into a shared block copies it.
  absl::Status Fork(SequenceId parent, SequenceId child);
  absl::Status FreeSequence(SequenceId id);
  // Moves every block of `id` to host memory (bit-exact) and back.
  absl::Status SwapOut(SequenceId id);
  absl::Status SwapIn(SequenceId id);
  // Compacts the named heads to their keep-sets and frees emptied blocks at once.
  absl::StatusOr<CompactionPlan> ApplyKeepSets(SequenceId id, absl::Span<const KeepSet> keep);

  // Queries.
  int32_t NumFreeBlocks() const;
  int32_t NumUsedBlocks() const;
  int32_t NumUsableBlocks() const { return pool_.num_usable(); }  // fixed at creation
  int32_t NumFreeHostBlocks() const;
  double Usage() const;
  int32_t NumSequences() const;
  bool HasSequence(SequenceId id) const;
  // The device free list from the next block to be taken to the last (a copy).
  std::vector<BlockId> FreeList() const;
  absl::StatusOr<bool> IsSwappedOut(SequenceId id) const;
  absl::StatusOr<int32_t> NumBlocksOf(SequenceId id) const;
  absl::StatusOr<int32_t> RetainedTokens(SequenceId id, int32_t layer, int32_t kv_head) const;
  // Every head's retained tokens, in HeadIndex order (layer-major), under one lock: `out` must
  // hold shape().num_heads_total() counts (kInvalidArgument otherwise, out untouched).
  absl::Status RetainedTokensOfHeads(SequenceId id, absl::Span<int32_t> out) const;
  // Total tokens ever appended to `id` (prompt included): the next token's position.
  absl::StatusOr<int32_t> NextPosition(SequenceId id) const;
  absl::StatusOr<int32_t> PromptLength(SequenceId id) const;
  absl::StatusOr<absl::Span<const BlockId>> BlockTable(SequenceId id, int32_t layer,
                                                       int32_t kv_head) const;
  absl::StatusOr<SlotRef> Slot(SequenceId id, int32_t layer, int32_t kv_head, int32_t index) const;
  // (allocated slots - retained tokens) / allocated slots over device blocks; 0 when empty.
  double Fragmentation() const;
  std::vector<SequenceId> SequenceIds() const;  // ascending
  const BlockPool& pool() const { return pool_; }
  const CpuKvStore* host_store() const { return host_store_.get(); }

  // Every invariant: pool consistent, refcounts equal the references in the tables, every
  // block owned by one (layer, kv_head), each head a dense prefix of its block list.
  absl::Status VerifyIntegrity() const;

 private:
  struct Sequence {
    int32_t prompt_len = 0;
    int32_t next_position = 0;
    bool swapped = false;                      // blocks live in the host pool
    std::vector<int32_t> num_tokens;           // [num_heads_total]
    std::vector<std::vector<BlockId>> blocks;  // [num_heads_total][blocks of that head]
  };

  BlockManager(const BlockManagerConfig& config, KvStore* store);
  absl::StatusOr<Sequence*> Find(SequenceId id);
  absl::StatusOr<const Sequence*> Find(SequenceId id) const;
  absl::StatusOr<Sequence*> FindResident(SequenceId id, const char* op);
  absl::Status CheckHead(int32_t layer, int32_t kv_head) const;
  int32_t CountAppendBlocks(const Sequence& seq) const;
  // n % block_size without a division when block_size is a power of two (the usual case):
  // the decode-step loop runs this for every head of every sequence.
  int32_t OffsetInBlock(int32_t n) const {
    return block_mask_ >= 0 ? (n & block_mask_) : n % shape_.block_size;
  }
  void ReleaseAll(Sequence& seq, BlockPool& pool);
  // Swap out (to_host) or in: every block of `seq` moves to the other pool. All destination
  // blocks are taken first (kResourceExhausted, nothing changed, when they are not there),
  // then the data is copied and the source blocks are released, newest first.
  absl::Status MoveBetweenPools(SequenceId id, Sequence& seq, bool to_host);

  KvShape shape_;
  int32_t block_mask_;  // block_size - 1 if block_size is a power of two, else -1
  KvStore* store_;      // may be null
  BlockPool pool_;
  BlockPool host_pool_;
  std::unique_ptr<CpuKvStore> host_store_;  // null when there is no host pool
  absl::flat_hash_map<SequenceId, Sequence> sequences_;
  // Guards everything above except the constants (shape_, block_mask_, store_, pool sizes);
  // taken once per public call, never re-entered.
  mutable std::mutex mu_;
};

}  // namespace beaconkv

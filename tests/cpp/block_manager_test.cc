#include "block_manager/block_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

namespace beaconkv {
namespace {

// Every token's key/value encodes (sequence, head, position) so tests can check bytes.
float KeyOf(SequenceId s, int head, int pos, int d) {
  return s * 1e6f + head * 1e4f + pos + d * 1e-3f;
}
float ValueOf(SequenceId s, int head, int pos, int d) { return -KeyOf(s, head, pos, d); }

class BlockManagerTest : public ::testing::Test {
 protected:
  void Make(int layers, int heads, int block_size, int num_blocks, int host_blocks = 0) {
    BlockManagerConfig c;
    c.shape = {layers, heads, /*head_dim=*/3, block_size};
    c.num_blocks = num_blocks;
    c.num_host_blocks = host_blocks;
    store_ = std::make_unique<CpuKvStore>(num_blocks, block_size, 3);
    auto bm = BlockManager::Create(c, store_.get());
    ASSERT_TRUE(bm.ok()) << bm.status();
    bm_ = std::move(*bm);
  }
  const KvShape& shape() const { return bm_->shape(); }

  void WriteToken(SequenceId s, int layer, int head, int index) {
    const SlotRef slot = *bm_->Slot(s, layer, head, index);
    const int pos = store_->position(slot);
    const int h = shape().HeadIndex(layer, head);
    for (int d = 0; d < 3; ++d) {
      store_->key(slot)[d] = KeyOf(s, h, pos, d);
      store_->value(slot)[d] = ValueOf(s, h, pos, d);
    }
  }
  void Add(SequenceId s, int prompt) {
    ASSERT_TRUE(bm_->AddSequence(s, prompt).ok());
    for (int l = 0; l < shape().num_layers; ++l)
      for (int h = 0; h < shape().num_kv_heads; ++h)
        for (int i = 0; i < prompt; ++i) WriteToken(s, l, h, i);
  }
  void Append(SequenceId s, int count) {
    for (int c = 0; c < count; ++c) {
      std::vector<SlotRef> slots(shape().num_heads_total());
      ASSERT_TRUE(bm_->AppendToken(s, absl::MakeSpan(slots)).ok());
      for (int l = 0; l < shape().num_layers; ++l)
        for (int h = 0; h < shape().num_kv_heads; ++h) {
          const int n = *bm_->RetainedTokens(s, l, h);
          ASSERT_EQ(slots[shape().HeadIndex(l, h)], *bm_->Slot(s, l, h, n - 1));
          WriteToken(s, l, h, n - 1);
        }
    }
  }
  // Positions held by a head, in slot order; checks every byte matches its position.
  // `origin`: the sequence that wrote the bytes (a fork's parent).
  std::vector<int> Positions(SequenceId s, int layer, int head, SequenceId origin = -1) {
    if (origin < 0) origin = s;
    std::vector<int> out;
    const int h = shape().HeadIndex(layer, head);
    for (int i = 0; i < *bm_->RetainedTokens(s, layer, head); ++i) {
      const SlotRef slot = *bm_->Slot(s, layer, head, i);
      const int pos = store_->position(slot);
      for (int d = 0; d < 3; ++d) {
        EXPECT_EQ(store_->key(slot)[d], KeyOf(origin, h, pos, d)) << "slot " << i;
        EXPECT_EQ(store_->value(slot)[d], ValueOf(origin, h, pos, d)) << "slot " << i;
      }
      out.push_back(pos);
    }
    return out;
  }
  std::vector<BlockId> Table(SequenceId s, int layer, int head) const {
    absl::StatusOr<absl::Span<const BlockId>> t = bm_->BlockTable(s, layer, head);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::vector<BlockId>(t->begin(), t->end()) : std::vector<BlockId>{};
  }
  void ExpectIntegrity() {
    absl::Status s = bm_->VerifyIntegrity();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<CpuKvStore> store_;
  std::unique_ptr<BlockManager> bm_;
};

TEST_F(BlockManagerTest, AddSequenceAllocatesEveryHeadAndRecordsPositions) {
  Make(2, 3, 4, 64);
  Add(7, 10);
  EXPECT_EQ(*bm_->NumBlocksOf(7), 2 * 3 * 3);
  EXPECT_EQ(bm_->NumUsedBlocks(), 18);
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 3; ++h) {
      EXPECT_EQ(*bm_->RetainedTokens(7, l, h), 10);
      std::vector<int> want(10);
      for (int i = 0; i < 10; ++i) want[i] = i;
      EXPECT_EQ(Positions(7, l, h), want);
    }
  // Layer-major, head-minor, ascending ids from a fresh pool.
  EXPECT_EQ(Table(7, 0, 0), (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(Table(7, 1, 2), (std::vector<BlockId>{16, 17, 18}));
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, OutOfBlocksLeavesThePoolExactlyAsBefore) {
  Make(2, 2, 4, 12);  // 11 usable
  Add(1, 8);          // 8 blocks
  const std::vector<BlockId> free_before = bm_->pool().FreeList();
  absl::Status s = bm_->AddSequence(2, 5);  // needs 4 * 2 = 8, 3 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("needed 8, 3 free of 11"), std::string::npos) << s;
  EXPECT_FALSE(bm_->HasSequence(2));
  EXPECT_EQ(bm_->pool().FreeList(), free_before);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, AppendTakesABlockOnlyWhenTheTailIsFull) {
  Make(1, 2, 4, 32);
  Add(1, 3);
  EXPECT_EQ(bm_->NumUsedBlocks(), 2);
  EXPECT_EQ(*bm_->BlocksNeededToAppend(1), 0);
  Append(1, 1);  // 4 tokens: tails full, no new block
  EXPECT_EQ(bm_->NumUsedBlocks(), 2);
  EXPECT_EQ(*bm_->BlocksNeededToAppend(1), 2);
  Append(1, 1);  // 5 tokens: one new block per head
  EXPECT_EQ(bm_->NumUsedBlocks(), 4);
  EXPECT_EQ(*bm_->NextPosition(1), 5);
  EXPECT_EQ(Positions(1, 0, 1), (std::vector<int>{0, 1, 2, 3, 4}));
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, AppendOutOfBlocksIsAllOrNothing) {
  Make(1, 2, 2, 4);                      // 3 usable
  Add(1, 2);                             // 2 blocks, both tails full
  absl::Status s = bm_->AppendToken(1);  // needs 2, 1 free
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("needed 2, 1 free"), std::string::npos) << s;
  EXPECT_EQ(*bm_->RetainedTokens(1, 0, 0), 2);
  EXPECT_EQ(*bm_->RetainedTokens(1, 0, 1), 2);
  EXPECT_EQ(*bm_->NextPosition(1), 2);
  EXPECT_EQ(bm_->NumFreeBlocks(), 1);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, FreeReturnsBlocksSoTheSameShapeGetsThemInOrder) {
  Make(2, 2, 4, 32);
  Add(1, 6);
  Add(2, 3);
  std::vector<BlockId> first;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      for (BlockId b : Table(1, l, h)) first.push_back(b);
  ASSERT_TRUE(bm_->FreeSequence(1).ok());
  // The freed blocks come first on the free list, in sequence 1's table order.
  std::vector<BlockId> free_list = bm_->pool().FreeList();
  EXPECT_EQ(std::vector<BlockId>(free_list.begin(), free_list.begin() + 8), first);
  Add(3, 6);
  std::vector<BlockId> again;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h)
      for (BlockId b : Table(3, l, h)) again.push_back(b);
  EXPECT_EQ(again, first);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, ForkSharesBlocksAndCopiesOnWrite) {
  Make(1, 1, 4, 16);
  Add(1, 6);  // blocks [1, 2], tail half full
  ASSERT_TRUE(bm_->Fork(1, 2).ok());
  EXPECT_EQ(bm_->NumUsedBlocks(), 2);
  EXPECT_EQ(bm_->pool().RefCount(1), 2);
  Append(2, 1);  // writes into shared block 2: copy first
  EXPECT_EQ(bm_->NumUsedBlocks(), 3);
  EXPECT_EQ(bm_->pool().RefCount(2), 1);
  EXPECT_EQ(Table(2, 0, 0).at(0), 1);  // full block stays shared
  EXPECT_NE(Table(2, 0, 0).at(1), 2);
  EXPECT_EQ(Positions(1, 0, 0), (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // Sequence 2's copied block carries sequence 1's bytes for the shared tokens; compare.
  for (int i = 0; i < 6; ++i) {
    const SlotRef a = *bm_->Slot(1, 0, 0, i), b = *bm_->Slot(2, 0, 0, i);
    EXPECT_EQ(store_->key(a)[0], store_->key(b)[0]);
    EXPECT_EQ(store_->position(a), store_->position(b));
  }
  Append(1, 1);  // parent's tail is no longer shared: no copy
  EXPECT_EQ(bm_->NumUsedBlocks(), 3);
  ASSERT_TRUE(bm_->FreeSequence(1).ok());
  EXPECT_EQ(bm_->pool().RefCount(1), 1);
  ASSERT_TRUE(bm_->FreeSequence(2).ok());
  EXPECT_EQ(bm_->NumUsedBlocks(), 0);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, SwapOutAndInIsBitExact) {
  Make(2, 2, 4, 40, /*host_blocks=*/40);
  Add(1, 9);
  Append(1, 4);
  std::vector<std::vector<int>> before;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) before.push_back(Positions(1, l, h));
  ASSERT_TRUE(bm_->SwapOut(1).ok());
  EXPECT_EQ(bm_->NumUsedBlocks(), 0);
  EXPECT_TRUE(*bm_->IsSwappedOut(1));
  EXPECT_EQ(bm_->AppendToken(1).code(), absl::StatusCode::kFailedPrecondition);
  Add(2, 30);  // reuse the device memory meanwhile
  ASSERT_TRUE(bm_->FreeSequence(2).ok());
  ASSERT_TRUE(bm_->SwapIn(1).ok());
  std::vector<std::vector<int>> after;
  for (int l = 0; l < 2; ++l)
    for (int h = 0; h < 2; ++h) after.push_back(Positions(1, l, h));  // checks bytes too
  EXPECT_EQ(after, before);
  EXPECT_EQ(bm_->NumFreeHostBlocks(), 39);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, SwapFailuresNameTheLimit) {
  Make(1, 1, 4, 8, /*host_blocks=*/2);
  Add(1, 8);  // 2 blocks, host has 1 usable
  absl::Status s = bm_->SwapOut(1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("host blocks"), std::string::npos) << s;
  EXPECT_FALSE(*bm_->IsSwappedOut(1));
  EXPECT_EQ(bm_->SwapIn(1).code(), absl::StatusCode::kFailedPrecondition);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, RetainedTokensOfHeadsListsEveryHeadLayerMajor) {
  Make(2, 2, 4, 32);
  Add(1, 4);
  Append(1, 8);  // 12 tokens per head
  std::vector<KeepSet> keep = {{0, 1, {2, 3}}, {1, 0, {0, 5, 6, 7, 11}}};
  ASSERT_TRUE(bm_->ApplyKeepSets(1, keep).ok());
  std::vector<int32_t> heads(4, -1);
  ASSERT_TRUE(bm_->RetainedTokensOfHeads(1, absl::MakeSpan(heads)).ok());
  EXPECT_EQ(heads, (std::vector<int32_t>{12, 2, 5, 12}));
  for (int32_t l = 0, i = 0; l < 2; ++l)
    for (int32_t h = 0; h < 2; ++h, ++i) EXPECT_EQ(heads[i], *bm_->RetainedTokens(1, l, h));
  // Wrong room or an unknown sequence: an error naming it, and the output untouched.
  std::vector<int32_t> small(3, -1);
  const absl::Status room = bm_->RetainedTokensOfHeads(1, absl::MakeSpan(small));
  EXPECT_EQ(room.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(room.message().find("room for 3 heads, the shape has 4"), std::string::npos);
  EXPECT_EQ(small, (std::vector<int32_t>(3, -1)));
  const absl::Status unknown = bm_->RetainedTokensOfHeads(9, absl::MakeSpan(heads));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.message().find("unknown sequence id 9"), std::string::npos);
  EXPECT_EQ(heads, (std::vector<int32_t>{12, 2, 5, 12}));
}

TEST_F(BlockManagerTest, KeepSetsCompactEachHeadAndFreeEmptiedBlocks) {
  Make(1, 2, 4, 32);
  Add(1, 4);
  Append(1, 8);  // 12 tokens = 3 blocks per head
  std::vector<KeepSet> keep = {{0, 0, {0, 1, 9, 10, 11}}, {0, 1, {2, 3}}};
  absl::StatusOr<CompactionPlan> plan = bm_->ApplyKeepSets(1, keep);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->tokens_evicted, 7 + 10);
  EXPECT_EQ(plan->blocks_freed, 1 + 2);
  EXPECT_EQ(*bm_->RetainedTokens(1, 0, 0), 5);
  EXPECT_EQ(*bm_->RetainedTokens(1, 0, 1), 2);
  EXPECT_EQ(bm_->NumUsedBlocks(), 3);
  // Head 0: holes 2, 3, 4 filled by survivors 9, 10, 11.
  EXPECT_EQ(Positions(1, 0, 0), (std::vector<int>{0, 1, 9, 10, 11}));
  EXPECT_EQ(Positions(1, 0, 1), (std::vector<int>{2, 3}));
  // Appending continues at the sequence's next position, per head.
  Append(1, 1);
  EXPECT_EQ(Positions(1, 0, 0), (std::vector<int>{0, 1, 9, 10, 11, 12}));
  EXPECT_EQ(Positions(1, 0, 1), (std::vector<int>{2, 3, 12}));
  EXPECT_GT(bm_->Fragmentation(), 0.0);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, KeepSetErrorsChangeNothing) {
  Make(2, 2, 4, 32);
  Add(1, 8);
  const std::vector<BlockId> free_before = bm_->pool().FreeList();
  auto code = [&](std::vector<KeepSet> k) { return bm_->ApplyKeepSets(1, k).status(); };
  EXPECT_EQ(code({{0, 0, {1, 1}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{0, 0, {8}}}).code(), absl::StatusCode::kInvalidArgument);
  absl::Status head = code({{2, 0, {1}}});
  EXPECT_EQ(head.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(head.message().find("layer 2"), std::string::npos) << head;
  EXPECT_EQ(code({{0, 0, {1}}, {0, 0, {2}}}).code(), absl::StatusCode::kInvalidArgument);
  // A valid head listed before an invalid one is not applied either.
  EXPECT_EQ(code({{0, 1, {0}}, {1, 1, {0, 0}}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*bm_->RetainedTokens(1, 0, 1), 8);
  EXPECT_EQ(bm_->ApplyKeepSets(9, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->pool().FreeList(), free_before);
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, KeepSetsOnAForkedSequenceCopyOnlyTheBlocksTheyWrite) {
  Make(1, 1, 4, 16);
  Add(1, 12);  // blocks 1, 2, 3
  ASSERT_TRUE(bm_->Fork(1, 2).ok());
  // Sequence 2 keeps {0, 1, 10}: survivor 10 moves into slot 2 of block 1 (shared) -> copy.
  absl::StatusOr<CompactionPlan> plan = bm_->ApplyKeepSets(2, {{{0, 0, {0, 1, 10}}}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->copies.size(), 1u);
  EXPECT_EQ(plan->blocks_released, 2);
  EXPECT_EQ(plan->blocks_freed, 0);  // still held by sequence 1
  EXPECT_EQ(Positions(2, 0, 0, /*origin=*/1), (std::vector<int>{0, 1, 10}));
  std::vector<int> all(12);
  for (int i = 0; i < 12; ++i) all[i] = i;
  EXPECT_EQ(Positions(1, 0, 0), all);  // the parent is untouched
  ExpectIntegrity();
}

TEST_F(BlockManagerTest, UnknownSequenceAndBadArgumentsAreInvalidArgument) {
  Make(1, 1, 4, 8);
  EXPECT_EQ(bm_->AppendToken(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bm_->AppendToken(3).message().find("unknown sequence id 3"), std::string::npos);
  EXPECT_EQ(bm_->FreeSequence(3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->Fork(3, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->AddSequence(1, 0).code(), absl::StatusCode::kInvalidArgument);
  Add(1, 2);
  EXPECT_EQ(bm_->AddSequence(1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->Fork(1, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->RetainedTokens(1, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bm_->Slot(1, 0, 0, 2).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectIntegrity();
}

TEST(BlockManagerCreateTest, RejectsBadConfigurations) {
  BlockManagerConfig c;
  c.shape = {1, 1, 8, 16};
  c.num_blocks = 1;
  EXPECT_EQ(BlockManager::Create(c, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  c.num_blocks = 8;
  c.shape.block_size = 0;
  EXPECT_EQ(BlockManager::Create(c, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  c.shape.block_size = 16;
  CpuKvStore small(4, 16, 8);
  EXPECT_EQ(BlockManager::Create(c, &small).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(BlockManager::Create(c, nullptr).ok());
}

TEST(BlockManagerMetadataOnlyTest, WorksWithoutAStoreAndReportsUsage) {
  BlockManagerConfig c;
  c.shape = {2, 2, 64, 16};
  c.num_blocks = 101;
  auto bm = *BlockManager::Create(c, nullptr);
  ASSERT_TRUE(bm->AddSequence(1, 17).ok());  // 2 blocks per head
  EXPECT_DOUBLE_EQ(bm->Usage(), 8.0 / 100.0);
  // 8 blocks * 16 slots = 128 allocated, 68 retained.
  EXPECT_DOUBLE_EQ(bm->Fragmentation(), (128.0 - 68.0) / 128.0);
  EXPECT_TRUE(bm->VerifyIntegrity().ok());
}

}  // namespace
}  // namespace beaconkv

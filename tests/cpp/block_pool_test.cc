#include "block_manager/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace beaconkv {
namespace {

TEST(BlockPoolTest, FreshPoolHandsOutAscendingIdsAndNeverTheNullBlock) {
  BlockPool pool(5);
  EXPECT_EQ(pool.num_usable(), 4);
  EXPECT_EQ(pool.FreeList(), (std::vector<BlockId>{1, 2, 3, 4}));
  for (BlockId want = 1; want <= 4; ++want) EXPECT_EQ(*pool.Take(), want);
  absl::StatusOr<BlockId> none = pool.Take();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("needed 1, 0 free of 4"), std::string::npos);
}

TEST(BlockPoolTest, FreeListOrderAfterScriptedFreesIsLastInFirstOut) {
  BlockPool pool(9);
  std::vector<BlockId> taken;
  ASSERT_TRUE(pool.TakeMany(6, &taken).ok());
  EXPECT_EQ(taken, (std::vector<BlockId>{1, 2, 3, 4, 5, 6}));
  pool.Release(3);
  pool.Release(1);
  pool.Release(6);
  // Most recently given back first, then the never-used blocks in ascending order.
  EXPECT_EQ(pool.FreeList(), (std::vector<BlockId>{6, 1, 3, 7, 8}));
  EXPECT_EQ(*pool.Take(), 6);
  EXPECT_EQ(*pool.Take(), 1);
  pool.Release(2);
  EXPECT_EQ(pool.FreeList(), (std::vector<BlockId>{2, 3, 7, 8}));
  EXPECT_TRUE(pool.VerifyIntegrity().ok());
}

TEST(BlockPoolTest, TakeManyIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<BlockId> out = {42};
  absl::Status s = pool.TakeMany(4, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("needed 4, 3 free of 3"), std::string::npos) << s;
  EXPECT_EQ(out, (std::vector<BlockId>{42}));
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.FreeList(), (std::vector<BlockId>{1, 2, 3}));
}

TEST(BlockPoolTest, RefcountsKeepSharedBlocksUntilLastRelease) {
  BlockPool pool(3);
  const BlockId b = *pool.Take();
  pool.AddRef(b);
  pool.AddRef(b);
  EXPECT_EQ(pool.RefCount(b), 3);
  EXPECT_EQ(pool.num_shared(), 1);
  EXPECT_FALSE(pool.Release(b));
  EXPECT_FALSE(pool.Release(b));
  EXPECT_EQ(pool.num_shared(), 0);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_TRUE(pool.Release(b));
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_TRUE(pool.VerifyIntegrity().ok());
}

TEST(BlockPoolDeathTest, DoubleFreeIsACheckFailure) {
  BlockPool pool(3);
  const BlockId b = *pool.Take();
  pool.Release(b);
  EXPECT_DEATH(pool.Release(b), "double free");
}

TEST(BlockPoolDeathTest, ReleasingTheNullBlockIsACheckFailure) {
  BlockPool pool(3);
  EXPECT_DEATH(pool.Release(kNullBlock), "CHECK failed");
}

}  // namespace
}  // namespace beaconkv

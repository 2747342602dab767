#include "block_manager/compaction_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace beaconkv {
namespace {

std::vector<std::pair<int, int>> Moves(const HeadCompaction& hc) {
  std::vector<std::pair<int, int>> out;
  for (const IndexMove& m : hc.moves) out.push_back({m.from, m.to});
  return out;
}

TEST(CompactionPlanTest, TailSurvivorsFillHolesInAscendingOrder) {
  // 10 tokens, keep {0, 2, 5, 7, 9}: holes below 5 are 1, 3, 4; survivors >= 5 are 5, 7, 9.
  HeadCompaction hc;
  ASSERT_TRUE(PlanHeadCompaction(3, 10, {9, 0, 5, 2, 7}, &hc).ok());
  EXPECT_EQ(hc.head, 3);
  EXPECT_EQ(hc.old_num_tokens, 10);
  EXPECT_EQ(hc.new_num_tokens, 5);
  EXPECT_EQ(Moves(hc), (std::vector<std::pair<int, int>>{{5, 1}, {7, 3}, {9, 4}}));
}

TEST(CompactionPlanTest, KeepingAPrefixOrEverythingMovesNothing) {
  HeadCompaction hc;
  ASSERT_TRUE(PlanHeadCompaction(0, 6, {0, 1, 2}, &hc).ok());
  EXPECT_TRUE(hc.moves.empty());
  ASSERT_TRUE(PlanHeadCompaction(0, 6, {0, 1, 2, 3, 4, 5}, &hc).ok());
  EXPECT_TRUE(hc.moves.empty());
  ASSERT_TRUE(PlanHeadCompaction(0, 6, {}, &hc).ok());
  EXPECT_EQ(hc.new_num_tokens, 0);
}

TEST(CompactionPlanTest, RejectsDuplicateAndOutOfRangeSlots) {
  HeadCompaction hc;
  absl::Status dup = PlanHeadCompaction(2, 8, {1, 4, 1}, &hc);
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("slot 1 twice"), std::string::npos) << dup;
  absl::Status range = PlanHeadCompaction(2, 8, {8}, &hc);
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(range.message().find("slot 8, outside [0, 8)"), std::string::npos) << range;
  EXPECT_EQ(PlanHeadCompaction(2, 8, {-1}, &hc).code(), absl::StatusCode::kInvalidArgument);
}

// Applying the moves to an array of token ids leaves exactly the kept ids in [0, k).
class CompactionPlanRandomTest : public ::testing::TestWithParam<int> {};

TEST_P(CompactionPlanRandomTest, ResultIsTheKeptSetAsADensePrefix) {
  const int n = GetParam();
  for (uint32_t seed = 0; seed < 50; ++seed) {
    std::mt19937 rng(seed);
    std::vector<int> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    const int k = n == 0 ? 0 : static_cast<int>(rng() % (n + 1));
    std::vector<int32_t> keep(all.begin(), all.begin() + k);
    HeadCompaction hc;
    ASSERT_TRUE(PlanHeadCompaction(0, n, keep, &hc).ok());
    std::vector<int> slots(n);
    for (int i = 0; i < n; ++i) slots[i] = i;
    for (const IndexMove& m : hc.moves) {
      ASSERT_GE(m.from, k);
      ASSERT_LT(m.to, k);
      slots[m.to] = slots[m.from];
    }
    std::vector<int> got(slots.begin(), slots.begin() + k);
    std::sort(got.begin(), got.end());
    std::sort(keep.begin(), keep.end());
    ASSERT_EQ(got, std::vector<int>(keep.begin(), keep.end())) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CompactionPlanRandomTest, ::testing::Values(0, 1, 3, 17, 64, 129));

}  // namespace
}  // namespace beaconkv

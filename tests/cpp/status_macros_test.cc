// BKV_RETURN_IF_ERROR, BKV_ASSIGN_OR_RETURN and BKV_CHECK_VALUE.
#include "core/status_macros.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace beaconkv {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd: " + std::to_string(x));
  return x / 2;
}

absl::Status Steps(int x, int* calls) {
  ++*calls;
  BKV_RETURN_IF_ERROR(Half(x).status());
  ++*calls;
  BKV_RETURN_IF_ERROR(Half(x / 2).status());
  ++*calls;
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int x) {
  BKV_ASSIGN_OR_RETURN(int half, Half(x));
  int quarter = 0;
  BKV_ASSIGN_OR_RETURN(quarter, Half(half));  // assigns an existing variable too
  return quarter;
}

absl::StatusOr<std::unique_ptr<int>> Boxed(int x) {
  BKV_ASSIGN_OR_RETURN(int half, Half(x));
  return std::make_unique<int>(half);
}

absl::StatusOr<int> Unboxed(int x) {
  BKV_ASSIGN_OR_RETURN(std::unique_ptr<int> box, Boxed(x));  // move-only values
  return *box;
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtTheFirstError) {
  int calls = 0;
  EXPECT_TRUE(Steps(8, &calls).ok());
  EXPECT_EQ(calls, 3);
  calls = 0;
  const absl::Status s = Steps(6, &calls);  // 6 / 2 = 3 is odd
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
  EXPECT_EQ(calls, 2);
}

TEST(StatusMacrosTest, AssignOrReturnAssignsOrPassesTheStatusOn) {
  EXPECT_EQ(*Quarter(12), 3);
  EXPECT_EQ(Quarter(6).status().message(), "odd: 3");
  EXPECT_EQ(Quarter(5).status().message(), "odd: 5");
  EXPECT_EQ(*Unboxed(10), 5);
  EXPECT_FALSE(Unboxed(3).ok());
}

TEST(StatusMacrosTest, CheckValueReturnsTheValueOrDies) {
  EXPECT_EQ(BKV_CHECK_VALUE(Half(4)), 2);
  EXPECT_DEATH(BKV_CHECK_VALUE(Half(3)), "odd: 3");
}

}  // namespace
}  // namespace beaconkv

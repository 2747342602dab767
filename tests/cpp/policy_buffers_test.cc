// The per-sequence policy buffers whose knobs have no upper bound: the query ring
// (core/policy_internal.h) and the beacon buffer (core/beacon_bank.h).
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/beacon_bank.h"
#include "core/policy_internal.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

// Rings and buffers sized by unbounded knobs hold what was pushed, not their capacity
// (before 2026-12-06 both were allocated full, 32 GB and more for these sizes), and keep
// their contents: a ring returns its newest rows in order, wrapping at a small capacity, and
// a buffer reduces at buffer_max as before.
TEST(PolicyBuffersTest, HoldWhatWasPushedUpToTheirCapacity) {
  constexpr int32_t kHuge = std::numeric_limits<int32_t>::max();
  internal::QueryRing huge(kHuge, 4), small(3, 4);
  std::vector<float> rows;
  for (int32_t i = 0; i < 5; ++i) {
    const std::vector<float> row = {float(i), 1.0f, 2.0f, 3.0f};
    huge.Push(row.data());
    small.Push(row.data());
    rows.insert(rows.end(), row.begin(), row.end());
  }
  EXPECT_EQ(huge.size(), 5);
  EXPECT_LE(huge.HeldBytes(), int64_t{2 * 5 * 4} * 4);
  EXPECT_EQ(huge.Bytes(), int64_t{kHuge} * 4 * 4);  // the bound StateBytes reports
  std::vector<float> out;
  EXPECT_EQ(huge.CopyOrdered(&out), 5);
  EXPECT_EQ(out, rows);
  EXPECT_EQ(small.CopyOrdered(&out), 3);
  EXPECT_EQ(out, std::vector<float>(rows.begin() + 8, rows.end()));  // rows 2, 3, 4
  EXPECT_EQ(small.HeldBytes(), int64_t{3 * 4} * 4);

  BeaconBank bank(4, kHuge - 1, kHuge);
  for (int32_t i = 0; i < 5; ++i) bank.Append(rows.data() + 4 * i);
  EXPECT_EQ(bank.size(), 5);
  EXPECT_LE(bank.HeldBytes(), int64_t{2 * 5 * 4} * 4);
  EXPECT_EQ(bank.Rows(), rows);
  BeaconBank full(4, 2, 4);  // reduces to 2 at the 4th append, as with a preallocated buffer
  for (int32_t i = 0; i < 4; ++i) full.Append(rows.data() + 4 * i);
  EXPECT_EQ(full.size(), 2);
  EXPECT_LE(full.HeldBytes(), full.CapacityBytes());
}

// A bfloat16 ring (beacon's recent queries with score_bf16) holds each row rounded
// (RoundToBf16) in half the bytes, and returns the newest rows in order as a float ring fed
// the rounded rows does, through the wrap.
TEST(PolicyBuffersTest, Bf16RingIsAFloatRingOfTheRoundedRows) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  internal::QueryRing half(5, 8, /*bf16=*/true), full(5, 8);
  EXPECT_EQ(half.Bytes() * 2, full.Bytes());
  std::vector<float> got, want;
  for (int32_t step = 0; step < 13; ++step) {
    std::vector<float> row(8), rounded(8);
    for (float& x : row) x = dist(rng);
    for (int32_t i = 0; i < 8; ++i) rounded[i] = RoundToBf16(row[i]);
    half.Push(row.data());
    full.Push(rounded.data());
    ASSERT_EQ(half.CopyOrdered(&got), full.CopyOrdered(&want));
    ASSERT_EQ(got, want) << "step " << step;
    EXPECT_NE(got.back(), row.back());  // rounded (a normal float is rarely a bfloat16)
  }
  EXPECT_EQ(half.HeldBytes() * 2, full.HeldBytes());
}

}  // namespace
}  // namespace beaconkv

// LinearGemm (the engine's fast path) against Linear (the batch-invariant definition).
#include <cmath>
#include <random>
#include <tuple>
#include <vector>

#include "engine/tensor_ops.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

class LinearGemmTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool, int>> {};

TEST_P(LinearGemmTest, MatchesLinearUpToRounding) {
  const auto [rows, in, out, with_bias, threads] = GetParam();
  const uint32_t seed = static_cast<uint32_t>(rows * 131 + in * 17 + out);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(rows * in), w(out * in), bias(out);
  for (float& v : x) v = normal(rng);
  for (float& v : w) v = normal(rng);
  for (float& v : bias) v = normal(rng);
  std::vector<float> want(rows * out), got(rows * out, std::nanf(""));
  SetBlasSingleThreaded();
  Linear(x.data(), w.data(), with_bias ? bias.data() : nullptr, rows, in, out, want.data(), 1);
  LinearGemm(x.data(), w.data(), with_bias ? bias.data() : nullptr, rows, in, out, got.data(),
             threads);
  for (int64_t i = 0; i < rows * out; ++i) {
    // Sums of `in` products of unit normals: rounding error grows like sqrt(in) ulps.
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::sqrt(static_cast<float>(in)) * 4)
        << "element " << i << " seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LinearGemmTest,
    ::testing::Values(std::make_tuple(1, 1, 1, false, 1), std::make_tuple(1, 33, 7, true, 1),
                      std::make_tuple(3, 128, 73, true, 2), std::make_tuple(17, 5, 70, false, 2),
                      // Large enough for the threaded split, with a ragged last slice.
                      std::make_tuple(64, 384, 129, true, 2),
                      std::make_tuple(64, 128, 384, false, 3)));

}  // namespace
}  // namespace beaconkv

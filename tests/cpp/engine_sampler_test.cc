// Sampling over logits that are not all numbers (a model loaded with allow_nonfinite): NaN
// logits are never chosen and never reach the probability sort, whose comparison must stay a
// strict weak order; +inf wins; finite logits sample as before.
#include <cmath>
#include <limits>
#include <vector>

#include "engine/sampler.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ArgmaxTest, FirstLargestWithNanSkipped) {
  EXPECT_EQ(Argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{kNan, 1.0f, 3.0f, kNan, 3.0f}), 2);
  EXPECT_EQ(Argmax(std::vector<float>{kNan, kNan}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{kNan, -kInf, kInf, 5.0f}), 2);
}

TEST(SamplerTest, NanLogitsAreNeverSampled) {
  // Many NaNs among few numbers: the sort of the old code saw mostly incomparable values.
  std::vector<float> logits(257, kNan);
  logits[7] = 0.0f;
  logits[100] = std::log(3.0f);
  SamplingParams params;
  params.temperature = 1.0f;
  params.seed = 11;
  Sampler sampler(params);
  int first = 0, second = 0;
  for (int i = 0; i < 4000; ++i) {
    const int32_t t = sampler.Sample(logits);
    ASSERT_TRUE(t == 7 || t == 100) << t;
    (t == 7 ? first : second) += 1;
  }
  // Probabilities 1/4 and 3/4: 1,000 expected, sd ~27.
  EXPECT_NEAR(first, 1000, 150);
  EXPECT_EQ(first + second, 4000);
}

TEST(SamplerTest, InfinityOrNoNumberFallsBackToTheArgmax) {
  SamplingParams params;
  params.temperature = 0.7f;
  Sampler sampler(params);
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, kNan, kInf, 1.0f}), 2);
  EXPECT_EQ(sampler.Sample(std::vector<float>{kNan, kNan, kNan}), 0);
  EXPECT_EQ(sampler.Sample(std::vector<float>{kNan, -kInf, 2.0f}), 2);
}

}  // namespace
}  // namespace beaconkv

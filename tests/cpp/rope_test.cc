// RoPE in the HF rotate-half layout, checked against a plain double-precision formula and
// against its defining properties.
#include "core/rope.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace beaconkv {
namespace {

std::vector<float> RandomVec(std::mt19937& rng, int32_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// HF: q * cos + rotate_half(q) * sin, cos/sin = cat(freqs, freqs), rotate_half = (-x2, x1).
std::vector<double> NaiveRope(const std::vector<float>& x, int64_t pos, double theta) {
  const int32_t d = static_cast<int32_t>(x.size());
  const int32_t half = d / 2;
  std::vector<double> out(d);
  for (int32_t i = 0; i < d; ++i) {
    const int32_t f = i % half;
    const double inv = 1.0 / std::pow(theta, 2.0 * f / d);
    const double ang = static_cast<double>(pos) * inv;
    const double rot = i < half ? -static_cast<double>(x[i + half]) : x[i - half];
    out[i] = x[i] * std::cos(ang) + rot * std::sin(ang);
  }
  return out;
}

class RopeTest : public ::testing::TestWithParam<std::tuple<int32_t, double>> {};

TEST_P(RopeTest, MatchesRotateHalfFormula) {
  const auto [head_dim, theta] = GetParam();
  const uint32_t seed = 1000 + head_dim;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto rope = Rope::Create({head_dim, theta});
  ASSERT_TRUE(rope.ok());
  for (int64_t pos : {0, 1, 7, 255, 4097}) {
    const std::vector<float> x = RandomVec(rng, head_dim);
    std::vector<float> y(head_dim);
    rope->Rotate(x.data(), pos, y.data());
    const std::vector<double> ref = NaiveRope(x, pos, theta);
    for (int32_t i = 0; i < head_dim; ++i) {
      // Angles are rounded to float32 as in HF, so allow |pos| * eps of angle error.
      EXPECT_NEAR(y[i], ref[i], 1e-6 * (1.0 + static_cast<double>(pos))) << "i=" << i;
    }
  }
}

TEST_P(RopeTest, ZeroIsIdentityAndNormIsKept) {
  const auto [head_dim, theta] = GetParam();
  std::mt19937 rng(7);
  auto rope = Rope::Create({head_dim, theta});
  ASSERT_TRUE(rope.ok());
  const std::vector<float> x = RandomVec(rng, head_dim);
  std::vector<float> y(head_dim);
  rope->Rotate(x.data(), 0, y.data());
  EXPECT_EQ(x, y);
  rope->Rotate(x.data(), 1234, y.data());
  double nx = 0, ny = 0;
  for (int32_t i = 0; i < head_dim; ++i) {
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
}

TEST_P(RopeTest, DotProductDependsOnlyOnDistance) {
  const auto [head_dim, theta] = GetParam();
  std::mt19937 rng(11);
  auto rope = Rope::Create({head_dim, theta});
  ASSERT_TRUE(rope.ok());
  const std::vector<float> q = RandomVec(rng, head_dim);
  const std::vector<float> k = RandomVec(rng, head_dim);
  auto dot_at = [&](int64_t m, int64_t n) {
    std::vector<float> a(head_dim), b(head_dim);
    rope->Rotate(q.data(), m, a.data());
    rope->Rotate(k.data(), n, b.data());
    double s = 0;
    for (int32_t i = 0; i < head_dim; ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
  };
  EXPECT_NEAR(dot_at(100, 40), dot_at(60, 0), 1e-3);
  EXPECT_NEAR(dot_at(17, 17), dot_at(0, 0), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeTest,
                         ::testing::Combine(::testing::Values(2, 6, 64, 128),
                                            ::testing::Values(10000.0, 1e6)));

TEST(RopeConfigTest, RejectsOddHeadDimAndBadTheta) {
  EXPECT_EQ(Rope::Create({7, 1e4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rope::Create({0, 1e4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rope::Create({8, 0.5}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RopeTest, RotateManyAndInPlace) {
  auto rope = Rope::Create({4, 1e4});
  ASSERT_TRUE(rope.ok());
  std::vector<float> xs = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> many(8), one(4);
  rope->RotateMany(xs.data(), 2, 9, many.data());
  rope->Rotate(xs.data() + 4, 9, one.data());
  EXPECT_EQ(std::vector<float>(many.begin() + 4, many.end()), one);
  rope->Rotate(xs.data() + 4, 9, xs.data() + 4);  // aliasing
  EXPECT_EQ(std::vector<float>(xs.begin() + 4, xs.end()), one);
}

// RotateMany's vector path (head_dim a multiple of 32 on AVX-512 machines) and its scalar
// loop (other sizes) give, bit for bit, the float products and sums of the rotate-half
// formula with the Angles table, each rounded on its own (no fused multiply-add): the model's
// queries and keys, and the beacons, rotate the same on every machine. Out of place and in
// place, many vectors at once.
TEST(RopeTest, RotateManyIsTheRoundedFormulaBitForBit) {
  std::mt19937 rng(21);
  for (const int32_t d : {32, 64, 128, 48, 6}) {
    auto rope = Rope::Create({d, 1e5});
    ASSERT_TRUE(rope.ok());
    const int32_t half = d / 2;
    constexpr int32_t kVectors = 37;
    for (const int64_t pos : {0, 3, 1000, 70001}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << " pos " << pos);
      const std::vector<float> x = RandomVec(rng, kVectors * d);
      std::vector<float> cs(half), sn(half);
      rope->Angles(pos, cs.data(), sn.data());
      std::vector<float> ref(x.size());
      for (int32_t v = 0; v < kVectors; ++v) {
        for (int32_t i = 0; i < half; ++i) {
          const float x1 = x[v * d + i], x2 = x[v * d + i + half];
          // volatile: each product rounded to float before the sum, as the core does.
          volatile float a = x1 * cs[i], b = x2 * sn[i], c = x2 * cs[i], e = x1 * sn[i];
          ref[v * d + i] = a - b;
          ref[v * d + i + half] = c + e;
        }
      }
      std::vector<float> out(x.size());
      rope->RotateMany(x.data(), kVectors, pos, out.data());
      EXPECT_EQ(out, ref);
      std::vector<float> in_place = x;
      rope->RotateMany(in_place.data(), kVectors, pos, in_place.data());
      EXPECT_EQ(in_place, ref);
    }
  }
}

}  // namespace
}  // namespace beaconkv

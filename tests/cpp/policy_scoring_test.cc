// The shared scoring pipeline against plain double-precision references: attention scores
// under every GQA/query reduction, pooling, R-KV redundancy, selection and its tie rule.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/capped_growth.h"
#include "core/redundancy.h"
#include "core/scoring.h"
#include "core/selection.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

std::vector<float> Random(std::mt19937& rng, size_t n, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<double> NaiveSoftmax(std::vector<double> x) {
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0;
  for (double& v : x) s += (v = std::exp(v - m));
  for (double& v : x) v /= s;
  return x;
}

std::vector<double> NaiveScores(const std::vector<float>& keys, int32_t begin, int32_t end,
                                int32_t d, const std::vector<float>& q, int32_t nq, int32_t g,
                                GqaReduction gqa, QueryReduction qr) {
  const int32_t n = end - begin;
  std::vector<double> out(n, 0.0);
  for (int32_t r = 0; r < nq; ++r) {
    std::vector<std::vector<double>> logits(g, std::vector<double>(n));
    for (int32_t h = 0; h < g; ++h) {
      for (int32_t j = 0; j < n; ++j) {
        double s = 0;
        for (int32_t x = 0; x < d; ++x)
          s += double(q[(r * g + h) * d + x]) * keys[(begin + j) * d + x];
        logits[h][j] = s / std::sqrt(double(d));
      }
    }
    std::vector<double> red(
        n, gqa == GqaReduction::kMaxLogits || gqa == GqaReduction::kMaxProbs ? -1e300 : 0.0);
    if (gqa == GqaReduction::kMaxLogits) {
      for (int32_t h = 0; h < g; ++h)
        for (int32_t j = 0; j < n; ++j) red[j] = std::max(red[j], logits[h][j]);
      red = NaiveSoftmax(red);
    } else {
      for (int32_t h = 0; h < g; ++h) {
        const std::vector<double> p = NaiveSoftmax(logits[h]);
        for (int32_t j = 0; j < n; ++j) {
          red[j] = gqa == GqaReduction::kMaxProbs ? std::max(red[j], p[j]) : red[j] + p[j] / g;
        }
      }
    }
    for (int32_t j = 0; j < n; ++j) {
      out[j] = qr == QueryReduction::kMax ? std::max(out[j], red[j]) : out[j] + red[j];
    }
  }
  if (qr == QueryReduction::kMean)
    for (double& v : out) v /= nq;
  return out;
}

class AttentionScoresTest
    : public ::testing::TestWithParam<std::tuple<int32_t, int32_t, int32_t, int32_t>> {};

TEST_P(AttentionScoresTest, MatchesNaive) {
  const auto [n, d, g, nq] = GetParam();
  const uint32_t seed = n * 1000 + d * 10 + g;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
  const std::vector<float> q = Random(rng, static_cast<size_t>(nq) * g * d, 2.0f);
  for (GqaReduction gqa :
       {GqaReduction::kMaxLogits, GqaReduction::kMaxProbs, GqaReduction::kMeanProbs}) {
    for (QueryReduction qr : {QueryReduction::kMax, QueryReduction::kMean, QueryReduction::kSum}) {
      for (auto [begin, end] : {std::pair{0, n}, std::pair{n / 3, n - n / 4}}) {
        if (end <= begin) continue;
        std::vector<float> out(end - begin);
        ScoreScratch scratch;
        AttentionScores(keys.data(), begin, end, d, q.data(), nq, g, {gqa, qr}, out.data(),
                        &scratch);
        const std::vector<double> ref = NaiveScores(keys, begin, end, d, q, nq, g, gqa, qr);
        for (int32_t j = 0; j < end - begin; ++j) {
          ASSERT_NEAR(out[j], ref[j], 2e-5 * std::max(1.0, ref[j]))
              << GqaReductionName(gqa) << " / " << QueryReductionName(qr) << " j=" << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OddSizes, AttentionScoresTest,
                         ::testing::Combine(::testing::Values(1, 3, 17, 130),
                                            ::testing::Values(2, 6, 64), ::testing::Values(1, 3, 4),
                                            ::testing::Values(1, 5)));

// AttentionScores' max-of-probabilities scores within 2e-5 (relative past 1) of the double
// reference's, every key.
void ExpectMaxProbsMatchNaive(const std::vector<float>& keys, int32_t n, int32_t d,
                              const std::vector<float>& q, int32_t nq, int32_t g) {
  std::vector<float> out(n);
  ScoreScratch scratch;
  AttentionScores(keys.data(), 0, n, d, q.data(), nq, g,
                  {GqaReduction::kMaxProbs, QueryReduction::kMax}, out.data(), &scratch);
  const std::vector<double> ref =
      NaiveScores(keys, 0, n, d, q, nq, g, GqaReduction::kMaxProbs, QueryReduction::kMax);
  for (int32_t j = 0; j < n; ++j) ASSERT_NEAR(out[j], ref[j], 2e-5 * std::max(1.0, ref[j])) << j;
}

// The max-of-probabilities path on either side of the size where the fused AVX-512 kernel
// hands over to the blocked GEMM (256 KB of keys): 300 x 128 floats is fused, 1,100 x 64 is
// not; rows 4k+3 and key counts off the 16-lane grid exercise the tails.
TEST(AttentionScoresTest, MaxProbsMatchesNaiveAcrossTheFusedKernelsReach) {
  for (const auto& [n, d, g, nq] : {std::tuple{300, 128, 1, 7}, std::tuple{1100, 64, 2, 3},
                                    std::tuple{16, 32, 1, 4}, std::tuple{65, 32, 1, 11}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << " g " << g << " nq " << nq);
    std::mt19937 rng(n + d);
    const std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
    const std::vector<float> q = Random(rng, static_cast<size_t>(nq) * g * d, 2.0f);
    ExpectMaxProbsMatchNaive(keys, n, d, q, nq, g);
  }
}

// The fused kernel's scores relative to the reference's, also for the small probabilities
// (where the absolute bound above says little): the exp and log approximations and the
// float32 logits keep each score within 1e-5 of itself, at the beacon scorer's shape (352
// rows, 160 keys, d 32), with logits spread over tens (queries of scale 4), with float32
// products and with bfloat16 ones (against the reference of the rounded inputs).
TEST(AttentionScoresTest, MaxProbsAreRelativelyPrecise) {
  constexpr int32_t n = 160, d = 32, nq = 352;
  for (const bool bf16 : {false, true}) {
    for (const float scale : {1.0f, 4.0f}) {
      SCOPED_TRACE(::testing::Message() << "scale " << scale << " bf16 " << bf16);
      std::mt19937 rng(13);
      std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
      std::vector<float> q = Random(rng, static_cast<size_t>(nq) * d, scale);
      std::vector<float> out(n);
      ScoreScratch scratch;
      AttentionScores(keys.data(), 0, n, d, q.data(), nq, 1,
                      {GqaReduction::kMaxProbs, QueryReduction::kMax, bf16}, out.data(), &scratch);
      if (bf16) {
        std::transform(keys.begin(), keys.end(), keys.begin(), RoundToBf16);
        std::transform(q.begin(), q.end(), q.begin(), RoundToBf16);
      }
      const std::vector<double> ref =
          NaiveScores(keys, 0, n, d, q, nq, 1, GqaReduction::kMaxProbs, QueryReduction::kMax);
      double worst = 0.0;
      for (int32_t j = 0; j < n; ++j) {
        ASSERT_GT(ref[j], 1e-30) << j;
        worst = std::max(worst, std::abs(out[j] - ref[j]) / ref[j]);
      }
      EXPECT_LT(worst, 1e-5);  // at most 2.5e-6 on this CPU
    }
  }
}

// A NaN key: in the fused kernel it makes every row's normaliser NaN, so no row scores any
// key, and each key gets the floor, e^-87 (its 2^x floored as ExpApprox clamps the other
// paths'), not NaN, so that the selections still rank on it (the coverage sample's bonus
// adds to it). The blocked GEMM path weighs a NaN logit as nothing instead
// (docs/reliability.md): finite scores there too.
TEST(AttentionScoresTest, MaxProbsWithANanKeyAreTheFloor) {
  for (const int32_t n : {40, 1100}) {  // the fused kernel and the blocked GEMM (d = 64)
    SCOPED_TRACE(::testing::Message() << "n " << n);
    constexpr int32_t d = 64, nq = 6;
    std::mt19937 rng(19);
    std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
    keys[static_cast<size_t>(n / 2) * d + 5] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> q = Random(rng, static_cast<size_t>(nq) * d);
    for (const bool bf16 : {false, true}) {
      std::vector<float> out(n);
      ScoreScratch scratch;
      AttentionScores(keys.data(), 0, n, d, q.data(), nq, 1,
                      {GqaReduction::kMaxProbs, QueryReduction::kMax, bf16}, out.data(), &scratch);
      for (int32_t j = 0; j < n; ++j) {
        ASSERT_TRUE(std::isfinite(out[j])) << j;
        if (n == 40) {
          ASSERT_NEAR(out[j], std::exp(-87.0), 1e-3 * std::exp(-87.0)) << j;
        }
      }
    }
  }
}

// The fused kernel's exp and log at the ends of their ranges: rows whose logits spread over
// hundreds (most terms of a row's sum underflow to zero), rows of equal logits over many keys
// (a sum of ~n, its log far from 0), and a zero query (every logit 0). The scores stay those
// of the double-precision reference.
TEST(AttentionScoresTest, MaxProbsMatchesNaiveAtExtremeLogits) {
  constexpr int32_t d = 32;
  std::mt19937 rng(7);
  for (const auto& [n, nq, scale] : {std::tuple{200, 9, 40.0f}, std::tuple{77, 4, 150.0f},
                                     std::tuple{1000, 5, 0.01f}, std::tuple{33, 6, 0.0f}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " queries " << nq << " scale " << scale);
    std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
    for (int32_t j = 1; j < n; j += 3) {  // repeated keys: equal logits in every row
      std::copy_n(keys.begin(), d, keys.begin() + static_cast<size_t>(j) * d);
    }
    // (A normal distribution needs a positive deviation: the zero query is written out.)
    const std::vector<float> q = scale > 0.0f ? Random(rng, static_cast<size_t>(nq) * d, scale)
                                              : std::vector<float>(static_cast<size_t>(nq) * d);
    ExpectMaxProbsMatchNaive(keys, n, d, q, nq, 1);
  }
}

// Query rows with zero dimensions, in the fused kernel's groups of four rows. Each row is full
// ('f'), blurred ('b': RoPE pairs (i, i + d / 2), i < 6, zeroed, as a blurred beacon row) or
// zero ('z'): groups of blurred rows after full ones, groups mixing the kinds in either order,
// a group of rows that are all zero. The scores stay those of the double-precision reference
// (a kernel that skipped a group's zero dimensions, and got the group wrong, fails here).
TEST(AttentionScoresTest, MaxProbsMatchesNaiveWithZeroDimensions) {
  constexpr int32_t d = 32;
  std::mt19937 rng(11);
  for (const auto& [n, kinds] :
       {std::pair{300, std::string("fffffbbbbbb")}, std::pair{70, std::string("ffffbbbbzzzz")},
        std::pair{129, std::string("bbbb")}, std::pair{45, std::string("bfbbzbbfb")}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " rows " << kinds);
    const auto nq = static_cast<int32_t>(kinds.size());
    const std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
    std::vector<float> q = Random(rng, static_cast<size_t>(nq) * d, 2.0f);
    for (int32_t r = 0; r < nq; ++r) {
      float* row = q.data() + static_cast<size_t>(r) * d;
      if (kinds[r] == 'z') std::fill_n(row, d, 0.0f);
      if (kinds[r] == 'b') {
        std::fill_n(row, 6, 0.0f);
        std::fill_n(row + d / 2, 6, 0.0f);
      }
    }
    ExpectMaxProbsMatchNaive(keys, n, d, q, nq, 1);
  }
}

// RoundToBf16: nearest bfloat16 with ties to even, the special values as the AVX-512 BF16
// conversion treats them.
TEST(RoundToBf16Test, NearestEvenAndSpecialValues) {
  auto f = [](uint32_t bits) { return std::bit_cast<float>(bits); };
  auto bits = [](float x) { return std::bit_cast<uint32_t>(x); };
  EXPECT_EQ(RoundToBf16(1.0f), 1.0f);
  EXPECT_EQ(RoundToBf16(f(0x3F808000)), 1.0f);               // halfway, kept lsb 0: down
  EXPECT_EQ(bits(RoundToBf16(f(0x3F818000))), 0x3F820000u);  // halfway, kept lsb 1: up
  EXPECT_EQ(bits(RoundToBf16(f(0x3F808001))), 0x3F810000u);  // past halfway: up
  EXPECT_EQ(bits(RoundToBf16(f(0x3F807FFF))), 0x3F800000u);  // below halfway: down
  EXPECT_EQ(bits(RoundToBf16(f(0xBF818000))), 0xBF820000u);  // the sign plays no part
  EXPECT_EQ(bits(RoundToBf16(f(0x3FFFFFFF))), 0x40000000u);  // a carry into the exponent
  EXPECT_TRUE(std::isinf(RoundToBf16(std::numeric_limits<float>::max())));  // past the largest
  EXPECT_EQ(RoundToBf16(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(RoundToBf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(RoundToBf16(f(0x7F800001))));       // a NaN whose payload rounds away
  EXPECT_EQ(bits(RoundToBf16(f(0x00000001))), 0x00000000u);  // denormals: zeros of their sign
  EXPECT_EQ(bits(RoundToBf16(f(0x807FFFFF))), 0x80000000u);
  EXPECT_EQ(bits(RoundToBf16(f(0x00800000))), 0x00800000u);  // the smallest normal stays
}

// RoundToBf16 is the CPU's own conversion bit for bit (where it has AVX-512 BF16), on random
// bit patterns: normals, denormals, zeros, infinities and NaNs.
TEST(RoundToBf16Test, IsTheCpusConversion) {
  if (!internal::HasBf16Conversion()) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  std::mt19937 rng(5);
  std::vector<float> x(1 << 16), hw(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u = rng();
    if (i % 4 == 0) u &= 0x807FFFFFu;   // denormals and zeros
    if (i % 97 == 0) u |= 0x7F800000u;  // infinities and NaNs
    x[i] = std::bit_cast<float>(u);
  }
  internal::ConvertToBf16WithTheCpu(x.data(), static_cast<int32_t>(x.size()), hw.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float mine = RoundToBf16(x[i]);
    if (std::isnan(hw[i])) {
      ASSERT_TRUE(std::isnan(mine)) << std::bit_cast<uint32_t>(x[i]);
      continue;
    }
    ASSERT_EQ(std::bit_cast<uint32_t>(mine), std::bit_cast<uint32_t>(hw[i]))
        << std::bit_cast<uint32_t>(x[i]);
  }
}

// RoundToBf16Bits (rows: 16 at a time with the CPU's conversion where it has one, the rest
// by a branch-free loop) gives RoundToBf16's bits for every value, NaN as a NaN, whatever
// the row's length and offset.
TEST(RoundToBf16Test, RowsAreEachValuesRounding) {
  std::mt19937 rng(8);
  std::vector<float> x((1 << 16) + 7);
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u = rng();
    if (i % 4 == 0) u &= 0x807FFFFFu;                  // denormals and zeros
    if (i % 97 == 0) u |= 0x7F800000u;                 // infinities and NaNs
    if (i % 89 == 0) u = (u & 0xFFFF0000u) | 0x8000u;  // ties
    x[i] = std::bit_cast<float>(u);
  }
  for (const int32_t offset : {0, 3}) {
    const auto n = static_cast<int32_t>(x.size()) - offset;
    std::vector<uint16_t> bits(n);
    RoundToBf16Bits(x.data() + offset, n, bits.data());
    for (int32_t i = 0; i < n; ++i) {
      const float want = RoundToBf16(x[offset + i]), got = FromBf16Bits(bits[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << i;
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << std::bit_cast<uint32_t>(x[offset + i]);
    }
  }
}

// StreamBf16Bits (non-temporal stores into 32-byte-aligned rows, ordinary stores elsewhere)
// writes RoundToBf16Bits' bits, into aligned and unaligned rows, of whole and partial vectors.
TEST(RoundToBf16Test, StreamedRowsAreTheRoundedRows) {
  std::mt19937 rng(9);
  std::vector<float> x(4096 + 5);
  for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  std::vector<uint16_t, internal::CacheAlignedRows<uint16_t>> streamed(x.size() + 16);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(streamed.data()) % 64, 0u);
  for (const auto& [offset, n] : {std::pair{0, 64}, std::pair{0, 4096}, std::pair{16, 2048},
                                  std::pair{3, 1000}, std::pair{0, 4101}, std::pair{5, 7}}) {
    std::vector<uint16_t> want(n);
    RoundToBf16Bits(x.data(), n, want.data());
    StreamBf16Bits(x.data(), n, streamed.data() + offset);
    StreamFence();
    for (int32_t i = 0; i < n; ++i)
      ASSERT_EQ(streamed[offset + i], want[i]) << "offset " << offset << " n " << n << " i " << i;
  }
}

// StreamRow copies a row, with non-temporal stores into 64-byte-aligned rows.
TEST(StreamRowTest, CopiesTheRow) {
  std::mt19937 rng(10);
  const std::vector<float> x = Random(rng, 1000);
  std::vector<float, internal::CacheAlignedRows<float>> out(x.size() + 16);
  for (const auto& [offset, n] : {std::pair{0, 32}, std::pair{0, 1000}, std::pair{16, 64},
                                  std::pair{3, 100}, std::pair{0, 7}}) {
    StreamRow(x.data(), n, out.data() + offset);
    StreamFence();
    for (int32_t i = 0; i < n; ++i) ASSERT_EQ(out[offset + i], x[i]) << offset << " " << i;
  }
}

// ScoreSpec::bf16: every path (the AVX-512 BF16 products where the CPU has them, the rounded
// copies elsewhere: GEMM shapes, head_dim 48, the reductions) gives the double reference's
// scores of the rounded queries and keys, and those differ from the float32 scores.
TEST(AttentionScoresTest, Bf16ScoresAreThoseOfTheRoundedInputs) {
  for (const auto& [n, d, g, nq] :
       {std::tuple{300, 32, 1, 23}, std::tuple{65, 64, 1, 6}, std::tuple{130, 128, 1, 5},
        std::tuple{1100, 64, 1, 3}, std::tuple{70, 48, 1, 9}, std::tuple{90, 32, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << " g " << g << " nq " << nq);
    std::mt19937 rng(n * 7 + d);
    const std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
    const std::vector<float> q = Random(rng, static_cast<size_t>(nq) * g * d, 2.0f);
    std::vector<float> rounded_keys(keys.size()), rounded_q(q.size());
    std::transform(keys.begin(), keys.end(), rounded_keys.begin(), RoundToBf16);
    std::transform(q.begin(), q.end(), rounded_q.begin(), RoundToBf16);
    for (const auto& [gqa, qr] : {std::pair{GqaReduction::kMaxProbs, QueryReduction::kMax},
                                  std::pair{GqaReduction::kMeanProbs, QueryReduction::kSum},
                                  std::pair{GqaReduction::kMaxLogits, QueryReduction::kMean}}) {
      std::vector<float> out(n), plain(n);
      ScoreScratch scratch;
      AttentionScores(keys.data(), 0, n, d, q.data(), nq, g, {gqa, qr, /*bf16=*/true}, out.data(),
                      &scratch);
      AttentionScores(keys.data(), 0, n, d, q.data(), nq, g, {gqa, qr}, plain.data(), &scratch);
      const std::vector<double> ref = NaiveScores(rounded_keys, 0, n, d, rounded_q, nq, g, gqa, qr);
      double moved = 0.0;
      for (int32_t j = 0; j < n; ++j) {
        ASSERT_NEAR(out[j], ref[j], 2e-5 * std::max(1.0, ref[j]))
            << GqaReductionName(gqa) << " / " << QueryReductionName(qr) << " j=" << j;
        moved = std::max(moved, std::abs(double(plain[j]) - ref[j]) / std::max(1e-3, ref[j]));
      }
      EXPECT_GT(moved, 1e-4) << "the rounding changed no score: was it applied?";
    }
  }
}

TEST(SoftmaxTest, StableForLargeAndEqualLogits) {
  std::vector<float> x = {1000.0f, 1000.0f, -1000.0f};
  SoftmaxInPlace(x.data(), 3);
  EXPECT_FLOAT_EQ(x[0], 0.5f);
  EXPECT_FLOAT_EQ(x[1], 0.5f);
  EXPECT_EQ(x[2], x[2]);  // not NaN
  EXPECT_LT(x[2], 1e-30f);
  std::mt19937 rng(3);
  std::vector<float> y = Random(rng, 1001, 30.0f);
  std::vector<double> yd(y.begin(), y.end());
  SoftmaxInPlace(y.data(), 1001);
  const std::vector<double> ref = NaiveSoftmax(yd);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], ref[i], 1e-6 + 1e-5 * ref[i]);
}

// A NaN logit (a query or key the model filled with NaN) weighs as nothing: the others keep
// their softmax, and no NaN reaches the exponential's integer step (UBSan, in the sanitized
// build, reported that conversion before the clamp took NaN to its lower bound; found by
// tests/fuzz/policy_fuzz.cc through h2o's Observe).
TEST(SoftmaxTest, NanLogitWeighsNothing) {
  for (const int32_t n : {3, 37}) {  // the scalar tail and whole vectors of lanes
    std::vector<float> x(n, 0.0f);
    x[0] = 1.0f;
    x[1] = std::numeric_limits<float>::quiet_NaN();
    SoftmaxInPlace(x.data(), n);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(x[i])) << i;
      sum += x[i];
    }
    EXPECT_LT(x[1], 1e-30f);
    EXPECT_NEAR(sum, 1.0, 1e-6);
    EXPECT_NEAR(x[0] / x[2], std::exp(1.0), 1e-5);
  }
}

TEST(Pool1dTest, MatchesTorchSemantics) {
  // max_pool1d(kernel 3, padding 1): -inf padding; avg_pool1d: zero padding counted.
  std::vector<float> a = {1, 5, 2, 0, 3};
  std::vector<float> m = a;
  Pool1d(Pooling::kMax, 3, absl::MakeSpan(m));
  EXPECT_EQ(m, (std::vector<float>{5, 5, 5, 3, 3}));
  std::vector<float> v = a;
  Pool1d(Pooling::kAvg, 3, absl::MakeSpan(v));
  const std::vector<float> expect = {6.0f / 3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 3.0f / 3};
  for (size_t i = 0; i < v.size(); ++i) EXPECT_FLOAT_EQ(v[i], expect[i]);
  std::vector<float> one = {4};
  Pool1d(Pooling::kAvg, 7, absl::MakeSpan(one));
  EXPECT_FLOAT_EQ(one[0], 4.0f / 7);
  std::vector<float> same = a;
  Pool1d(Pooling::kMax, 1, absl::MakeSpan(same));
  EXPECT_EQ(same, a);
  EXPECT_FALSE(ValidatePoolKernel(4, "x").ok());
  EXPECT_TRUE(ValidatePoolKernel(7, "x").ok());
}

TEST(RedundancyTest, MatchesNaiveRkv) {
  for (int32_t n : {1, 3, 17, 300, 513}) {
    for (int32_t d : {2, 6, 64}) {
      const uint32_t seed = n * 100 + d;
      SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << n << " d " << d);
      std::mt19937 rng(seed);
      // Low-dimensional structure so that many pairs exceed the 0.5 threshold.
      std::vector<float> keys = Random(rng, static_cast<size_t>(n) * d);
      for (int32_t i = 0; i < n; ++i) keys[i * d] += 2.0f;
      std::vector<float> out(n);
      RedundancyScores(keys.data(), n, d, 0.5f, out.data());
      std::vector<std::vector<double>> s(n, std::vector<double>(n));
      std::vector<double> norm(n);
      for (int32_t i = 0; i < n; ++i) {
        double sq = 0;
        for (int32_t x = 0; x < d; ++x) sq += double(keys[i * d + x]) * keys[i * d + x];
        norm[i] = std::sqrt(sq) + 1e-8;
      }
      for (int32_t i = 0; i < n; ++i) {
        for (int32_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int32_t x = 0; x < d; ++x) dot += double(keys[i * d + x]) * keys[j * d + x];
          s[i][j] = i == j ? 0.0 : dot / (norm[i] * norm[j]);
        }
        for (int32_t j = n - 1; j >= 0; --j) {
          if (s[i][j] > 0.5) {
            s[i][j] = 0;
            break;
          }
        }
      }
      std::vector<double> mean(n, 0.0);
      for (int32_t i = 0; i < n; ++i)
        for (int32_t j = 0; j < n; ++j) mean[j] += s[i][j] / n;
      const std::vector<double> ref = NaiveSoftmax(mean);
      for (int32_t j = 0; j < n; ++j) ASSERT_NEAR(out[j], ref[j], 1e-5 * ref[j] + 1e-7) << j;
    }
  }
}

TEST(CoverageTest, OneTokenPerStratumFirstInEach) {
  std::vector<int32_t> pos(20);
  for (int32_t i = 0; i < 20; ++i) pos[i] = i;
  std::vector<uint8_t> protect(20, 0);
  protect[0] = protect[18] = protect[19] = 1;  // a sink and the recent window
  // Free positions 1..17 in 4 strata of 17/4 positions.
  EXPECT_EQ(CoverageUnprotected(pos, protect, 4), (std::vector<int32_t>{1, 6, 10, 14}));
  EXPECT_EQ(CoverageUnprotected(pos, protect, 50).size(), 17u);  // all of them
  EXPECT_TRUE(CoverageUnprotected(pos, protect, 0).empty());
  // Strata [0, 10.25) [10.25, 20.5) [20.5, 30.75) [30.75, 41): the gap empties stratum 1.
  const std::vector<int32_t> gap = {0, 1, 2, 3, 30, 31, 32, 33, 40};
  EXPECT_EQ(CoverageUnprotected(gap, std::vector<uint8_t>(9, 0), 4),
            (std::vector<int32_t>{0, 4, 5}));
}

TEST(CoverageTest, SampleIsEvenlySpreadOverTheRange) {
  // 1,000 consecutive positions, 50 strata: consecutive picks are 20 apart.
  std::vector<int32_t> pos(1000);
  for (int32_t i = 0; i < 1000; ++i) pos[i] = 100 + i;
  const std::vector<int32_t> got = CoverageUnprotected(pos, std::vector<uint8_t>(1000, 0), 50);
  ASSERT_EQ(got.size(), 50u);
  for (size_t j = 0; j < got.size(); ++j) EXPECT_EQ(got[j], static_cast<int32_t>(20 * j));
}

// PositionOrder is a stable sort of the indexes by position, on both of its paths: the radix
// sort (positions spanning < 2^16 values, negative ones included, and a compacted head's
// shape: a sorted run with the newest tokens moved into its holes) and the comparison sort
// (wider spans); equal positions keep index order. OrderedHead puts keys in that order.
TEST(SelectionTest, PositionOrderIsAStableSortByPosition) {
  std::mt19937 rng(17);
  auto check = [](const std::vector<int32_t>& positions) {
    std::vector<int32_t> expected(positions.size());
    std::iota(expected.begin(), expected.end(), 0);
    std::stable_sort(expected.begin(), expected.end(),
                     [&](int32_t a, int32_t b) { return positions[a] < positions[b]; });
    std::vector<int32_t> order = {7};  // overwritten
    PositionOrder(positions, &order);
    EXPECT_EQ(order, expected);
  };
  check({});
  check({5});
  check({3, -2, 3, 1, -2});
  for (const int64_t span : {int64_t{200}, int64_t{1} << 16, int64_t{1} << 31}) {
    for (const int32_t n : {2, 160, 1000}) {
      SCOPED_TRACE(::testing::Message() << "span " << span << " n " << n);
      std::uniform_int_distribution<int64_t> pos(-(span / 2), span / 2 - 1);
      std::vector<int32_t> positions(n);
      for (int32_t& p : positions) p = static_cast<int32_t>(pos(rng));
      check(positions);
    }
  }
  // A compacted head: 0..159 in slot order, whose tokens at slots 0, 5, 10, ... were evicted
  // and their slots filled with the newest positions 160..191.
  std::vector<int32_t> head(160);
  std::iota(head.begin(), head.end(), 0);
  for (int32_t j = 0; j < 32; ++j) head[static_cast<size_t>(j) * 5] = 160 + j;
  check(head);
  // OrderedHead gathers the keys in that order.
  std::vector<float> keys(head.size() * 2);
  for (size_t i = 0; i < head.size(); ++i) keys[2 * i] = static_cast<float>(head[i]);
  const OrderedHead ordered(HeadKeys{keys.data(), head.data(), 160}, 2);
  std::vector<int32_t> sorted = head;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t i = 0; i < 160; ++i) {
    ASSERT_EQ(ordered.positions()[i], sorted[i]);
    ASSERT_EQ(ordered.keys()[2 * i], static_cast<float>(sorted[i]));
    ASSERT_EQ(head[ordered.slot(i)], sorted[i]);
  }
}

TEST(SelectionTest, TiesGoToTheMoreRecentToken) {
  const std::vector<int32_t> pos = {0, 3, 5, 9, 11, 20};
  const std::vector<uint8_t> protect = {1, 0, 0, 0, 0, 1};
  const std::vector<float> scores = {0, 0.5f, 0.5f, 0.1f, 0.5f, 0};
  // budget 4: protected {0, 5}; 2 more among the three 0.5s -> indexes 4 and 2.
  EXPECT_EQ(SelectUniform({pos, protect, scores}, 4), (std::vector<int32_t>{0, 2, 4, 5}));
  EXPECT_EQ(SelectUniform({pos, protect, scores}, 100), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(SelectUniform({pos, protect, scores}, 2), (std::vector<int32_t>{0, 5}));
}

// TopKUnprotected against a comparison-sort reference of its order (score desc, then
// position desc), on slot-ordered positions (the segmented top-k twin passes them so), with
// ties everywhere: +0 and -0 equal, NaN ranked as -inf and tied with it, repeated scores; every
// k.
TEST(SelectionTest, TopKMatchesTheScorePositionOrder) {
  std::mt19937 rng(23);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {0.0f, -0.0f, nan, -inf, inf, 0.5f, -0.5f, 1e-30f, -3.0f};
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 40);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), -5);
    std::shuffle(pos.begin(), pos.end(), rng);
    std::vector<float> scores(n);
    std::vector<uint8_t> protect(n);
    for (int32_t i = 0; i < n; ++i) {
      scores[i] = values[rng() % values.size()];
      protect[i] = rng() % 4 == 0 ? 1 : 0;
    }
    auto rank = [&](int32_t i) { return std::isnan(scores[i]) ? -inf : scores[i]; };
    std::vector<int32_t> free;
    for (int32_t i = 0; i < n; ++i) {
      if (!protect[i]) free.push_back(i);
    }
    std::sort(free.begin(), free.end(), [&](int32_t a, int32_t b) {
      if (rank(a) != rank(b)) return rank(a) > rank(b);
      return pos[a] > pos[b];
    });
    for (int64_t k = 0; k <= n; ++k) {
      std::vector<int32_t> got = TopKUnprotected({pos, protect, scores}, k);
      std::vector<int32_t> want(free.begin(), free.begin() + std::min<int64_t>(k, free.size()));
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      ASSERT_EQ(got, want) << "trial " << trial << " k " << k;
    }
  }
}

TEST(SelectionTest, PooledNormalisesPerHeadAndMeetsTheLayerBudget) {
  const std::vector<int32_t> pos = {0, 1, 2, 3};
  const std::vector<uint8_t> protect = {0, 0, 0, 1};
  const std::vector<float> a = {0.9f, 0.05f, 0.05f, 0};  // normalised 0.9, .05, .05
  const std::vector<float> b = {0.2f, 0.2f, 0.2f, 0};    // normalised 1/3 each
  const std::vector<HeadCandidates> heads = {{pos, protect, a}, {pos, protect, b}};
  const auto keep = SelectPooled(heads, 5);  // 2 protected + 3 free
  EXPECT_EQ(keep[0], (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(keep[1], (std::vector<int32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace beaconkv

// BeaconKV specifics: the FPS query buffer keeps a planted rare cluster and drops
// near-duplicates of the majority; beacons are exactly RoPE at the current position; and a
// key only the planted cluster attends to survives under beacon but not under snapkv.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "core/beacon_bank.h"
#include "core/policy.h"
#include "core/rope.h"
#include "core/scoring.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

std::vector<float> Unit(std::mt19937& rng, int32_t d) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(d);
  double sq = 0;
  for (float& x : v) {
    x = dist(rng);
    sq += x * x;
  }
  for (float& x : v) x /= static_cast<float>(std::sqrt(sq));
  return v;
}

std::vector<float> Near(std::mt19937& rng, const std::vector<float>& center, float noise,
                        float scale) {
  std::normal_distribution<float> dist(0.0f, noise);
  std::vector<float> v(center.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (center[i] + dist(rng));
  return v;
}

double Cos(const float* a, const float* b, int32_t d) {
  double ab = 0, aa = 0, bb = 0;
  for (int32_t i = 0; i < d; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

TEST(CosineFpsTest, TiesGoToTheEarliestPoint) {
  const std::vector<float> same = {1, 0, 1, 0, 1, 0, 1, 0};  // 4 identical points
  EXPECT_EQ(CosineFarthestPointOrder(same.data(), 4, 2, 4), (std::vector<int32_t>{0, 1, 2, 3}));
  // Seed: farthest from the mean direction; then farthest from the chosen set.
  const std::vector<float> pts = {1, 0, 1, 0.1f, 0, 1, 1, -0.1f, -1, 0};
  EXPECT_EQ(CosineFarthestPointOrder(pts.data(), 5, 2, 3), (std::vector<int32_t>{4, 0, 2}));
}

// The brute-force definition: each row normalised (squared norm in double from four
// interleaved partial sums, 1 / norm rounded to float, components multiplied in float) and
// quantised to round(u * 2^14); the seed direction is the double mean of the unit rows
// (summed 64 rows at a time), normalised, rounded to float and quantised; distances are
// 2^28 - the integer dot product; then a chosen-flag scan for the farthest unchosen point.
// stop_below > 0: the ordering ends before the first pick whose distance is below it
// (copies can be a little below 0: quantised unit vectors have q . q near, not at, 2^28).
std::vector<int32_t> SlowFps(const std::vector<float>& pts, int32_t n, int32_t d, int32_t count,
                             int64_t stop_below = 0) {
  std::vector<std::vector<int64_t>> q(n, std::vector<int64_t>(d));
  std::vector<double> mean(d, 0.0), part(d, 0.0);
  for (int32_t i = 0; i < n; ++i) {
    const float* p = &pts[static_cast<size_t>(i) * d];
    double s[4] = {0, 0, 0, 0};
    for (int32_t k = 0; k < d; ++k) s[k < d - d % 4 ? k % 4 : 0] += double(p[k]) * p[k];
    const double sq = (s[0] + s[1]) + (s[2] + s[3]);
    const float inv = sq > 0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
    for (int32_t k = 0; k < d; ++k) {
      const float u = p[k] * inv;
      part[k] += u;
      q[i][k] = std::llrint(double(u) * 16384.0);
    }
    if (i % 64 == 63 || i == n - 1) {
      for (int32_t k = 0; k < d; ++k) mean[k] += part[k], part[k] = 0.0;
    }
  }
  double msq = 0;
  for (double x : mean) msq += x * x;
  std::vector<int64_t> qm(d, 0);
  for (int32_t k = 0; k < d && msq > 0; ++k) {
    qm[k] = std::llrint(double(static_cast<float>(mean[k] / std::sqrt(msq))) * 16384.0);
  }
  auto dist = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    int64_t dot = 0;
    for (int32_t k = 0; k < d; ++k) dot += a[k] * b[k];
    return (int64_t{1} << 28) - dot;
  };
  int32_t seed = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (dist(q[i], qm) > dist(q[seed], qm)) seed = i;
  }
  std::vector<int32_t> order = {seed};
  std::vector<bool> chosen(n, false);
  chosen[seed] = true;
  while (static_cast<int32_t>(order.size()) < count) {
    int32_t best = -1;
    int64_t best_d = std::numeric_limits<int64_t>::min();
    for (int32_t i = 0; i < n; ++i) {
      if (chosen[i]) continue;
      int64_t md = std::numeric_limits<int64_t>::max();
      for (int32_t j : order) md = std::min(md, dist(q[i], q[j]));
      if (md > best_d) best_d = md, best = i;
    }
    if (stop_below > 0 && best_d < stop_below) break;
    chosen[best] = true;
    order.push_back(best);
  }
  return order;
}

TEST(CosineFpsTest, MatchesTheBruteForceDefinition) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [n, d, count] :
       {std::tuple{37, 8, 37}, std::tuple{120, 32, 60}, std::tuple{1, 4, 1}, std::tuple{150, 7, 90},
        std::tuple{200, 64, 150}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << " count " << count);
    std::vector<float> pts(static_cast<size_t>(n) * d);
    for (float& x : pts) x = normal(rng);
    EXPECT_EQ(CosineFarthestPointOrder(pts.data(), n, d, count), SlowFps(pts, n, d, count));
  }
}

// Points in tight clusters, copies of some of them among the rest: [n, d].
std::vector<float> ClusteredPoints(std::mt19937& rng, int32_t clusters, int32_t n, int32_t d,
                                   float noise) {
  std::vector<std::vector<float>> centers;
  for (int32_t c = 0; c < clusters; ++c) centers.push_back(Unit(rng, d));
  std::vector<float> pts;
  for (int32_t i = 0; i < n; ++i) {
    if (i > 0 && rng() % 5 == 0) {
      const size_t copy_of = rng() % (pts.size() / d);
      const std::vector<float> row(pts.begin() + copy_of * d, pts.begin() + (copy_of + 1) * d);
      pts.insert(pts.end(), row.begin(), row.end());
      continue;
    }
    const std::vector<float> q = Near(rng, centers[rng() % clusters], noise, 1.0f + i % 4);
    pts.insert(pts.end(), q.begin(), q.end());
  }
  return pts;
}

// stop_below: the ordering is the brute-force one cut before the first pick closer than that
// to the points chosen, for every kernel, with and without the copy slots; so it is a prefix
// of the full ordering.
TEST(CosineFpsTest, StopBelowCutsTheOrderingWhereTheDistanceFalls) {
  std::mt19937 rng(11);
  int32_t cut_short = 0;
  for (const auto& [clusters, n, d, noise] :
       {std::tuple{6, 90, 16, 0.02f}, std::tuple{3, 200, 32, 0.1f}, std::tuple{40, 120, 8, 0.01f},
        std::tuple{1, 50, 33, 0.3f}}) {
    const std::vector<float> pts = ClusteredPoints(rng, clusters, n, d, noise);
    for (const double radius : {0.001, 0.01, 0.05, 0.2, 0.6}) {
      SCOPED_TRACE(::testing::Message()
                   << "clusters " << clusters << " n " << n << " d " << d << " radius " << radius);
      const auto stop = static_cast<int32_t>(std::lround(radius * kFpsDistanceOne));
      const std::vector<int32_t> want = SlowFps(pts, n, d, n, stop);
      ASSERT_GE(want.size(), 1u);
      const std::vector<int32_t> full = SlowFps(pts, n, d, n);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), full.begin()));
      cut_short += static_cast<int32_t>(want.size()) < n ? 1 : 0;
      for (internal::FpsKernel k : {internal::FpsKernel::kPortable, internal::FpsKernel::kAvx2,
                                    internal::FpsKernel::kAvx512}) {
        if (!internal::FpsKernelSupported(k)) continue;
        for (const bool dedupe : {true, false}) {
          EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, n, k, dedupe, nullptr, stop), want)
              << "kernel " << static_cast<int>(k) << " dedupe " << dedupe;
        }
        // The copy flags cover exactly the points ordered.
        std::vector<uint8_t> is_copy;
        EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, n, k, true, &is_copy, stop), want);
        EXPECT_EQ(is_copy.size(), want.size());
        // A count below the cut still ends at the count.
        const auto count = static_cast<int32_t>(want.size() + 1) / 2;
        EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, count, k, true, nullptr, stop),
                  std::vector<int32_t>(want.begin(), want.begin() + count));
      }
    }
  }
  EXPECT_GE(cut_short, 12);  // the radii above cut most of these orderings short
}

// Every ISA path of the FPS pass computes the same exact integer dot products, so they must
// give the same ordering (also on clustered points with many near-ties), whatever the machine.
TEST(CosineFpsTest, EveryKernelGivesTheSameOrdering) {
  std::mt19937 rng(9);
  for (const auto& [n, d, count] : {std::tuple{512, 32, 256}, std::tuple{97, 7, 50},
                                    std::tuple{130, 128, 129}, std::tuple{3, 2, 3}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d << " count " << count);
    const std::vector<float> center = Unit(rng, d);
    std::vector<float> pts;
    for (int32_t i = 0; i < n; ++i) {
      const std::vector<float> p = Near(rng, center, i % 3 == 0 ? 0.5f : 0.01f, 1.0f + i % 5);
      pts.insert(pts.end(), p.begin(), p.end());
    }
    const std::vector<int32_t> want =
        internal::FpsOrder(pts.data(), n, d, count, internal::FpsKernel::kPortable);
    EXPECT_EQ(static_cast<int32_t>(want.size()), count);
    for (auto k :
         {internal::FpsKernel::kAuto, internal::FpsKernel::kAvx2, internal::FpsKernel::kAvx512}) {
      if (!internal::FpsKernelSupported(k)) continue;
      EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, count, k), want)
          << "kernel " << static_cast<int>(k);
    }
  }
}

// Exact duplicates spread over several blocks (as layer 0's queries are: one per token id):
// every kernel gives the same ordering, and copies of a point come out in index order.
TEST(CosineFpsTest, DuplicatesAcrossBlocksKeepIndexOrder) {
  std::mt19937 rng(13);
  constexpr int32_t kDistinct = 7, kN = 300, kD = 32;
  std::vector<std::vector<float>> distinct;
  for (int32_t i = 0; i < kDistinct; ++i) distinct.push_back(Unit(rng, kD));
  std::uniform_int_distribution<int32_t> which(0, kDistinct - 1);
  std::vector<int32_t> id(kN);
  std::vector<float> pts;
  for (int32_t i = 0; i < kN; ++i) {
    id[i] = which(rng);
    pts.insert(pts.end(), distinct[id[i]].begin(), distinct[id[i]].end());
  }
  const std::vector<int32_t> want =
      internal::FpsOrder(pts.data(), kN, kD, kN, internal::FpsKernel::kPortable);
  ASSERT_EQ(static_cast<int32_t>(want.size()), kN);
  std::vector<int32_t> last(kDistinct, -1);
  for (int32_t i : want) {
    EXPECT_GT(i, last[id[i]]) << "a later copy of point " << id[i] << " came first";
    last[id[i]] = i;
  }
  for (auto k :
       {internal::FpsKernel::kAuto, internal::FpsKernel::kAvx2, internal::FpsKernel::kAvx512}) {
    if (!internal::FpsKernelSupported(k)) continue;
    EXPECT_EQ(internal::FpsOrder(pts.data(), kN, kD, kN, k), want)
        << "kernel " << static_cast<int>(k);
  }
}

// Sharing one slot among exact copies is an optimisation only: on points mixing copies, scaled
// copies (equal directions, different rows), near-duplicates and distinct points, the ordering
// with and without it is the same on every kernel, and is_copy marks exactly the picks whose
// row equals an earlier pick's.
TEST(CosineFpsTest, SharingSlotsAmongCopiesGivesTheSameOrdering) {
  std::mt19937 rng(21);
  constexpr int32_t kD = 24;
  for (const auto& [n, count] : {std::tuple{300, 300}, std::tuple{300, 120}, std::tuple{70, 9}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " count " << count);
    std::vector<std::vector<float>> rows;
    for (int32_t i = 0; i < n; ++i) {
      const uint32_t kind = rng() % 4;
      if (kind == 0 || rows.empty()) {
        rows.push_back(Unit(rng, kD));
      } else if (kind == 1) {
        rows.push_back(rows[rng() % rows.size()]);  // exact copy
      } else if (kind == 2) {
        rows.push_back(Near(rng, rows[rng() % rows.size()], 0.0f, 2.0f));  // same direction
      } else {
        rows.push_back(Near(rng, rows[rng() % rows.size()], 1e-4f, 1.0f));
      }
    }
    std::vector<float> pts;
    for (const auto& r : rows) pts.insert(pts.end(), r.begin(), r.end());
    for (auto k : {internal::FpsKernel::kPortable, internal::FpsKernel::kAuto}) {
      const std::vector<int32_t> plain = internal::FpsOrder(pts.data(), n, kD, count, k, false);
      std::vector<uint8_t> is_copy;
      EXPECT_EQ(internal::FpsOrder(pts.data(), n, kD, count, k, true, &is_copy), plain)
          << "kernel " << static_cast<int>(k);
      ASSERT_EQ(static_cast<int32_t>(is_copy.size()), count);
      for (int32_t j = 0; j < count; ++j) {
        bool earlier = false;
        for (int32_t i = 0; i < j; ++i) earlier = earlier || rows[plain[i]] == rows[plain[j]];
        EXPECT_EQ(is_copy[j] != 0, earlier) << "pick " << j;
      }
    }
  }
}

// The kernels also pack the points differently (AVX-512: vector norms and 16 x 16 transposed
// tiles, for dims that are multiples of 16); the unit vectors and their sum must be the same
// bits, and so the orderings. Rows of very different norms, zero rows, copies and near-copies,
// sizes that leave partial tiles and blocks.
TEST(CosineFpsTest, EveryKernelPacksTheSameUnitVectors) {
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> exponent(-18.0f, 18.0f);
  for (const int32_t d : {16, 32, 48, 128, 20, 64, 7}) {
    for (const int32_t n : {1, 15, 97, 300}) {
      SCOPED_TRACE(::testing::Message() << "n " << n << " d " << d);
      std::vector<std::vector<float>> rows;
      for (int32_t i = 0; i < n; ++i) {
        const uint32_t kind = rng() % 5;
        if (kind == 0 || rows.empty()) {
          rows.push_back(Near(rng, Unit(rng, d), 0.0f, std::pow(10.0f, exponent(rng))));
        } else if (kind == 1) {
          rows.push_back(rows[rng() % rows.size()]);
        } else if (kind == 2) {
          rows.push_back(Near(rng, rows[rng() % rows.size()], 1e-5f, 1.0f));
        } else if (kind == 3) {
          rows.emplace_back(d, 0.0f);
        } else {
          rows.push_back(Unit(rng, d));
        }
      }
      std::vector<float> pts;
      for (const auto& r : rows) pts.insert(pts.end(), r.begin(), r.end());
      std::vector<int16_t> want_unit, unit;
      std::vector<double> want_sum, sum;
      internal::FpsPack(pts.data(), n, d, internal::FpsKernel::kPortable, &want_unit, &want_sum);
      for (auto k : {internal::FpsKernel::kAvx2, internal::FpsKernel::kAvx512}) {
        if (!internal::FpsKernelSupported(k)) continue;
        internal::FpsPack(pts.data(), n, d, k, &unit, &sum);
        EXPECT_EQ(unit, want_unit) << "quantised unit vectors, kernel " << static_cast<int>(k);
        EXPECT_EQ(std::memcmp(sum.data(), want_sum.data(), sum.size() * sizeof(double)), 0)
            << "sum, kernel " << static_cast<int>(k);
      }
      for (const bool dedupe : {true, false}) {
        std::vector<uint8_t> want_copy;
        const std::vector<int32_t> want = internal::FpsOrder(
            pts.data(), n, d, n, internal::FpsKernel::kPortable, dedupe, &want_copy);
        for (auto k : {internal::FpsKernel::kAuto, internal::FpsKernel::kAvx2,
                       internal::FpsKernel::kAvx512}) {
          if (!internal::FpsKernelSupported(k)) continue;
          std::vector<uint8_t> is_copy;
          EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, n, k, dedupe, &is_copy), want)
              << "kernel " << static_cast<int>(k) << " dedupe " << dedupe;
          EXPECT_EQ(is_copy, want_copy);
        }
      }
    }
  }
}

// Rows holding a NaN or an infinity normalise to NaN components, and a row of subnormals (norm
// below 1 / FLT_MAX, so 1 / norm is +inf) to +-inf and NaN ones; every non-finite component
// quantises to 0 on every kernel: such a row is a zero vector to the FPS, and every kernel
// gives the same ordering.
TEST(CosineFpsTest, NonFiniteRowsBecomeZeroVectorsOnEveryKernel) {
  std::mt19937 rng(41);
  for (const int32_t d : {32, 7}) {
    SCOPED_TRACE(::testing::Message() << "d " << d);
    const int32_t n = 70;
    std::vector<float> pts;
    for (int32_t i = 0; i < n; ++i) {
      std::vector<float> row = Unit(rng, d);
      if (i % 10 == 3) row[i % d] = std::numeric_limits<float>::quiet_NaN();
      if (i % 10 == 6) row[(i + 1) % d] = std::numeric_limits<float>::infinity();
      if (i % 10 == 8) {  // subnormal components only: 1 / norm overflows
        std::fill(row.begin(), row.end(), 0.0f);
        row[i % d] = 1e-40f;
        row[(i + 2) % d] = -3e-41f;
      }
      pts.insert(pts.end(), row.begin(), row.end());
    }
    std::vector<int16_t> want_q;
    std::vector<double> sum;
    internal::FpsPack(pts.data(), n, d, internal::FpsKernel::kPortable, &want_q, &sum);
    for (int32_t i = 3; i < n; i += 10) {
      // Rows 3, 13, ... (NaN), 6, 16, ... (inf) and 8, 18, ... (subnormal) are zero; the
      // others are not.
      for (const int32_t r : {i, i + 3, i + 5}) {
        const auto row = want_q.begin() + static_cast<ptrdiff_t>(r) * d;
        EXPECT_TRUE(std::all_of(row, row + d, [](int16_t q) { return q == 0; })) << "row " << r;
      }
      const auto other = want_q.begin() + static_cast<ptrdiff_t>(i - 1) * d;
      EXPECT_FALSE(std::all_of(other, other + d, [](int16_t q) { return q == 0; }));
    }
    const std::vector<int32_t> want =
        internal::FpsOrder(pts.data(), n, d, n, internal::FpsKernel::kPortable);
    for (auto k :
         {internal::FpsKernel::kAuto, internal::FpsKernel::kAvx2, internal::FpsKernel::kAvx512}) {
      if (!internal::FpsKernelSupported(k)) continue;
      std::vector<int16_t> q;
      internal::FpsPack(pts.data(), n, d, k, &q, &sum);
      EXPECT_EQ(q, want_q) << "kernel " << static_cast<int>(k);
      EXPECT_EQ(internal::FpsOrder(pts.data(), n, d, n, k), want)
          << "kernel " << static_cast<int>(k);
    }
  }
}

// A draw keeps its working memory for the next one on the same thread: draws of other sizes
// and dims in between leave no trace in a later draw's result.
TEST(CosineFpsTest, DrawsDoNotDependOnEarlierDraws) {
  std::mt19937 rng(37);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto points = [&](int32_t n, int32_t d) {
    std::vector<float> p(static_cast<size_t>(n) * d);
    for (float& x : p) x = normal(rng);
    for (int32_t i = 1; i < n; i += 3) {  // some copies
      std::copy_n(p.begin() + static_cast<ptrdiff_t>(i - 1) * d, d,
                  p.begin() + static_cast<ptrdiff_t>(i) * d);
    }
    return p;
  };
  const std::vector<float> big = points(512, 32), small = points(40, 32), wide = points(70, 128);
  const std::vector<int32_t> big_first = CosineFarthestPointOrder(big.data(), 512, 32, 256);
  const std::vector<int32_t> small_first = CosineFarthestPointOrder(small.data(), 40, 32, 40);
  const std::vector<int32_t> wide_first = CosineFarthestPointOrder(wide.data(), 70, 128, 33);
  EXPECT_EQ(CosineFarthestPointOrder(big.data(), 512, 32, 256), big_first);
  EXPECT_EQ(CosineFarthestPointOrder(small.data(), 40, 32, 40), small_first);
  EXPECT_EQ(CosineFarthestPointOrder(big.data(), 512, 32, 256), big_first);
  EXPECT_EQ(CosineFarthestPointOrder(wide.data(), 70, 128, 33), wide_first);
  EXPECT_EQ(CosineFarthestPointOrder(small.data(), 40, 32, 40), small_first);
  // ... and equal the portable kernel's orderings, each drawn once.
  EXPECT_EQ(internal::FpsOrder(small.data(), 40, 32, 40, internal::FpsKernel::kPortable),
            small_first);
  EXPECT_EQ(internal::FpsOrder(wide.data(), 70, 128, 33, internal::FpsKernel::kPortable),
            wide_first);
}

// The FPS's integer dot products bound the head dimension: a larger one is refused when the
// policy is created, with the reason, and the limit itself is accepted.
TEST(BeaconPolicyTest, HeadDimAboveTheFpsLimitIsRefused) {
  for (const int32_t d : {kMaxFpsDim, kMaxFpsDim + 2}) {
    const PolicyGeometry geo{1, 1, 1, {d, 1e4}};
    auto state = NewPolicyState(BeaconConfig{}, geo, 4);
    if (d <= kMaxFpsDim) {
      EXPECT_TRUE(state.ok()) << state.status();
    } else {
      ASSERT_FALSE(state.ok());
      EXPECT_EQ(state.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(state.status().message().find("head_dim"), std::string_view::npos)
          << state.status();
    }
  }
  // Other policies have no such limit.
  EXPECT_TRUE(NewPolicyState(SnapKvConfig{}, {1, 1, 1, {kMaxFpsDim + 2, 1e4}}, 4).ok());
}

// Beacons leave out exact copies of a beacon: the rows are the distinct points among the
// first n of the FPS ordering, in that order.
TEST(BeaconBankTest, BeaconsLeaveOutCopies) {
  std::mt19937 rng(6);
  const int32_t d = 16;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  const std::vector<std::vector<float>> tokens = {Unit(rng, d), Unit(rng, d), Unit(rng, d)};
  BeaconBank bank(d, /*buffer_min=*/8, /*buffer_max=*/32);
  std::vector<float> all;
  for (int32_t i = 0; i < 20; ++i) {
    const std::vector<float>& q = tokens[i % 3];
    all.insert(all.end(), q.begin(), q.end());
    bank.Append(q.data());
  }
  std::vector<float> beacons;
  ASSERT_EQ(bank.Beacons(6, *rope, 0, &beacons), 3);
  const std::vector<int32_t> order = CosineFarthestPointOrder(all.data(), 20, d, 6);
  for (int32_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(std::equal(beacons.begin() + b * d, beacons.begin() + (b + 1) * d,
                           all.begin() + order[b] * d))
        << "beacon " << b;
  }
}

// A bfloat16 buffer holds each query rounded (RoundToBf16) in half the bytes, and behaves
// bit for bit as a float buffer fed the rounded queries: the same survivors after every
// reduction, the same beacons (rotated), with draw_on_fill and without, through several
// reductions, with copies among the queries (which the draws leave out) and values that
// round (denormals to zero, ties to even).
TEST(BeaconBankTest, Bf16BufferIsAFloatBufferOfTheRoundedQueries) {
  std::mt19937 rng(31);
  constexpr int32_t d = 32;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  for (const bool draw_on_fill : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "draw_on_fill " << draw_on_fill);
    BeaconBank half(d, /*buffer_min=*/16, /*buffer_max=*/48, draw_on_fill, 0.0, /*bf16=*/true);
    BeaconBank full(d, 16, 48, draw_on_fill);
    EXPECT_TRUE(half.bf16());
    EXPECT_EQ(half.CapacityBytes() * 2, full.CapacityBytes());
    std::vector<float> repeated = Unit(rng, d);
    repeated[3] = 1e-40f;                             // a denormal: rounds to zero
    repeated[4] = std::bit_cast<float>(0x3F808000u);  // a tie: rounds to even (1.0)
    for (int32_t t = 0; t < 200; ++t) {
      const std::vector<float> q = t % 7 == 0 ? repeated : Unit(rng, d);
      std::vector<float> rounded(q);
      for (float& x : rounded) x = RoundToBf16(x);
      half.Append(q.data());
      full.Append(rounded.data());
      if (t % 11 == 10) {
        std::vector<float> a, b;
        ASSERT_EQ(half.Beacons(12, *rope, 1000 + t, &a), full.Beacons(12, *rope, 1000 + t, &b));
        ASSERT_EQ(a, b) << "t " << t;
      }
      ASSERT_EQ(half.Rows(), full.Rows()) << "t " << t;
      ASSERT_EQ(half.num_reductions(), full.num_reductions());
    }
    EXPECT_GT(half.num_reductions(), 3);
    EXPECT_LE(half.HeldBytes() * 2, full.HeldBytes() + 2);
  }
}

// A bfloat16 buffer leaves out copies as a float one does, also when a copy comes before a
// point that is not one among the beacons: u, v, a copy of u, 2u (the same direction, not a
// copy), w; the draw takes u, v, w (in its order), then the copy and 2u at distance 0, earliest
// first; the copy is left out and 2u moves up.
TEST(BeaconBankTest, Bf16BeaconsLeaveOutCopiesAheadOfOtherPoints) {
  std::mt19937 rng(12);
  constexpr int32_t d = 32;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  std::vector<float> u = Unit(rng, d), v = Unit(rng, d), w = Unit(rng, d), u2(u);
  for (float& x : u2) x *= 2.0f;
  BeaconBank half(d, /*buffer_min=*/5, /*buffer_max=*/32, false, 0.0, /*bf16=*/true);
  BeaconBank full(d, 5, 32);
  for (const std::vector<float>* q : {&u, &v, &u, &u2, &w, &v}) {
    std::vector<float> rounded(*q);
    for (float& x : rounded) x = RoundToBf16(x);
    half.Append(q->data());
    full.Append(rounded.data());
  }
  std::vector<float> a, b;
  ASSERT_EQ(half.Beacons(5, *rope, 77, &a), 4);  // five drawn, one of them a copy
  ASSERT_EQ(full.Beacons(5, *rope, 77, &b), 4);
  EXPECT_EQ(a, b);
  // 2u's beacon is u's scaled: it is among them, after the three distinct directions.
  std::vector<float> u_rounded(u), rotated(d), rotated2(d);
  for (float& x : u_rounded) x = RoundToBf16(x);
  rope->Rotate(u_rounded.data(), 77, rotated.data());
  for (int32_t k = 0; k < d; ++k) rotated2[k] = 2.0f * rotated[k];
  EXPECT_TRUE(std::equal(a.begin() + 3 * d, a.end(), rotated2.begin()));
}

// Beacons reuse the buffer reduction's draw: drawing them reduces an over-full buffer to
// buffer_min in FPS order, and the beacons are its first points.
TEST(BeaconBankTest, DrawingBeaconsReducesTheBufferAndReusesTheOrdering) {
  std::mt19937 rng(4);
  const int32_t d = 16;
  BeaconBank bank(d, /*buffer_min=*/8, /*buffer_max=*/32);
  std::vector<float> all;
  for (int32_t i = 0; i < 20; ++i) {
    const std::vector<float> q = Near(rng, Unit(rng, d), 0.0f, 1.0f + i % 3);
    all.insert(all.end(), q.begin(), q.end());
    bank.Append(q.data());
  }
  ASSERT_EQ(bank.size(), 20);
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  std::vector<float> beacons;
  ASSERT_EQ(bank.Beacons(5, *rope, 0, &beacons), 5);  // position 0: no rotation
  EXPECT_EQ(bank.size(), 8);
  EXPECT_EQ(bank.num_reductions(), 1);
  const std::vector<int32_t> order = CosineFarthestPointOrder(all.data(), 20, d, 8);
  const std::vector<float> rows = bank.Rows();
  for (int32_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(
        std::equal(rows.data() + i * d, rows.data() + (i + 1) * d, all.data() + order[i] * d))
        << "survivor " << i;
  }
  EXPECT_TRUE(std::equal(beacons.begin(), beacons.end(), rows.data()));
  // Nothing new arrived: the next draw reduces nothing and returns the same beacons.
  std::vector<float> again;
  ASSERT_EQ(bank.Beacons(5, *rope, 0, &again), 5);
  EXPECT_EQ(again, beacons);
  EXPECT_EQ(bank.num_reductions(), 1);
}

// draw_on_fill: the first draw still reduces an over-full buffer; later draws reuse its first
// points while new queries wait, until the buffer fills (or would fill before the next draw)
// and the reduction draws from all of them.
TEST(BeaconBankTest, DrawOnFillReusesTheDrawUntilTheBufferFills) {
  std::mt19937 rng(5);
  const int32_t d = 16;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  BeaconBank eager(d, /*buffer_min=*/8, /*buffer_max=*/32);
  BeaconBank lazy(d, 8, 32, /*draw_on_fill=*/true);
  std::vector<float> all;
  auto append = [&](int32_t count) {
    for (int32_t i = 0; i < count; ++i) {
      const std::vector<float> q = Near(rng, Unit(rng, d), 0.0f, 1.0f + i % 3);
      all.insert(all.end(), q.begin(), q.end());
      eager.Append(q.data());
      lazy.Append(q.data());
    }
  };
  // Few queries: every one is a beacon, in buffer order, in both modes.
  append(4);
  std::vector<float> a, b;
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 4);
  ASSERT_EQ(eager.Beacons(5, *rope, 0, &b), 4);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), all.begin()));
  // Over-full, never drawn: both reduce once and draw the same beacons.
  append(16);
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  ASSERT_EQ(eager.Beacons(5, *rope, 0, &b), 5);
  EXPECT_EQ(a, b);
  EXPECT_EQ(lazy.num_reductions(), 1);
  const std::vector<float> first_draw = a;
  // New queries: the eager bank draws again, the lazy one keeps its beacons and its buffer.
  append(10);
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  ASSERT_EQ(eager.Beacons(5, *rope, 0, &b), 5);
  EXPECT_EQ(a, first_draw);
  EXPECT_EQ(lazy.num_reductions(), 1);
  EXPECT_EQ(lazy.size(), 18);
  EXPECT_EQ(eager.num_reductions(), 2);
  EXPECT_EQ(eager.size(), 8);
  // The lazy buffer fills (8 + 24 = 32): its reduction draws from every query it holds.
  std::vector<float> held = lazy.Rows();
  const size_t before = all.size();
  append(14);
  held.insert(held.end(), all.begin() + static_cast<ptrdiff_t>(before), all.end());
  EXPECT_EQ(lazy.num_reductions(), 2);
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  const std::vector<int32_t> order = CosineFarthestPointOrder(held.data(), 32, d, 5);
  for (int32_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(std::equal(a.begin() + i * d, a.begin() + (i + 1) * d, held.data() + order[i] * d))
        << "beacon " << i;
  }
  // The buffer is reduced in a draw, not in a later Append, once as many arrivals as came
  // since the previous draw would fill it: 8 + 14 < 32 keeps the draw; after 10 more,
  // 18 + 10 < 32 keeps it; after 12 more, 30 + 12 >= 32 reduces now.
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  EXPECT_EQ(lazy.num_reductions(), 2);
  append(10);
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  EXPECT_EQ(lazy.num_reductions(), 2);
  EXPECT_EQ(lazy.size(), 18);
  append(12);
  ASSERT_EQ(lazy.Beacons(5, *rope, 0, &a), 5);
  EXPECT_EQ(lazy.num_reductions(), 3);
  EXPECT_EQ(lazy.size(), 8);
}

// A radius: the draw keeps one query per tight cluster (the points of a cluster are closer
// than the radius, the clusters farther apart), so the beacons are one per cluster, the
// buffer is the draw, and it is the prefix of the ordering without a radius.
TEST(BeaconBankTest, RadiusKeepsOneQueryPerTightCluster) {
  std::mt19937 rng(8);
  const int32_t d = 16;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  std::vector<std::vector<float>> centers;
  for (int32_t c = 0; c < 5; ++c) centers.push_back(Unit(rng, d));
  BeaconBank bank(d, /*buffer_min=*/64, /*buffer_max=*/256, /*draw_on_fill=*/true,
                  /*radius=*/0.05);
  BeaconBank plain(d, 64, 256, true);
  std::vector<float> all;
  for (int32_t i = 0; i < 150; ++i) {
    const std::vector<float> q = Near(rng, centers[i % 5], 0.01f, 1.0f + i % 3);
    all.insert(all.end(), q.begin(), q.end());
    bank.Append(q.data());
    plain.Append(q.data());
  }
  std::vector<float> beacons, without;
  ASSERT_EQ(bank.Beacons(64, *rope, 0, &beacons), 5);
  EXPECT_EQ(bank.size(), 5);
  EXPECT_EQ(bank.num_reductions(), 1);
  ASSERT_EQ(plain.Beacons(64, *rope, 0, &without), 64);
  EXPECT_TRUE(std::equal(beacons.begin(), beacons.end(), without.begin()));
  std::vector<int32_t> hit(5, 0);
  for (int32_t b = 0; b < 5; ++b) {
    for (int32_t c = 0; c < 5; ++c) {
      hit[c] += Cos(beacons.data() + b * d, centers[c].data(), d) > 0.99 ? 1 : 0;
    }
  }
  EXPECT_EQ(hit, std::vector<int32_t>(5, 1));
  // Fewer beacons asked for than the draw holds: its first ones.
  std::vector<float> two;
  ASSERT_EQ(bank.Beacons(2, *rope, 0, &two), 2);
  EXPECT_TRUE(std::equal(two.begin(), two.end(), beacons.begin()));
  EXPECT_EQ(bank.num_reductions(), 1);
}

// A draw cut at the radius is reused while queries arrive, and drawn again (from everything
// the buffer holds) once as many arrived as would fill the buffer after a full draw
// (buffer_max - buffer_min); a new cluster then gets its beacon.
TEST(BeaconBankTest, RadiusDrawIsReusedUntilAFullDrawsWorthArrived) {
  std::mt19937 rng(9);
  const int32_t d = 16;
  auto rope = Rope::Create({d, 1e4});
  ASSERT_TRUE(rope.ok());
  const std::vector<float> a = Unit(rng, d), b = Unit(rng, d), fresh = Unit(rng, d);
  BeaconBank bank(d, /*buffer_min=*/8, /*buffer_max=*/32, /*draw_on_fill=*/true, /*radius=*/0.05);
  auto append = [&](const std::vector<float>& center, int32_t count) {
    for (int32_t i = 0; i < count; ++i) bank.Append(Near(rng, center, 0.005f, 2.0f).data());
  };
  append(a, 3);
  append(b, 3);
  std::vector<float> beacons;
  ASSERT_EQ(bank.Beacons(8, *rope, 0, &beacons), 2);  // a buffer under buffer_min is cut too
  EXPECT_EQ(bank.num_reductions(), 1);
  EXPECT_EQ(bank.size(), 2);
  // 10 arrived since the draw, and as many again are expected by the next: 20 < 24, so the
  // draw is reused and `fresh` waits in the buffer.
  append(fresh, 10);
  ASSERT_EQ(bank.Beacons(8, *rope, 0, &beacons), 2);
  EXPECT_EQ(bank.num_reductions(), 1);
  EXPECT_EQ(bank.size(), 12);
  for (int32_t i = 0; i < 2; ++i) EXPECT_LT(Cos(beacons.data() + i * d, fresh.data(), d), 0.9);
  // 17 arrived since the draw, 7 more expected: 24, a full draw's worth (although 19 + 7
  // would not fill the buffer), so this call draws again, and `fresh` has a beacon.
  append(fresh, 7);
  ASSERT_EQ(bank.Beacons(8, *rope, 0, &beacons), 3);
  EXPECT_EQ(bank.num_reductions(), 2);
  EXPECT_EQ(bank.size(), 3);
  int32_t fresh_beacons = 0;
  for (int32_t i = 0; i < 3; ++i) {
    fresh_beacons += Cos(beacons.data() + i * d, fresh.data(), d) > 0.99 ? 1 : 0;
  }
  EXPECT_EQ(fresh_beacons, 1);
}

class BeaconBufferTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(BeaconBufferTest, PlantedClusterSurvivesReductionMajorityIsThinned) {
  const uint32_t seed = GetParam();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int32_t d = 64;
  const std::vector<float> majority = Unit(rng, d);
  const std::vector<float> planted = Unit(rng, d);
  BeaconBank bank(d, /*buffer_min=*/64, /*buffer_max=*/256);
  // 1,000 steps of a 2-head group whose heads emit the same vector (exact near-duplicates),
  // all close to one direction, plus 3 planted queries of another direction at random steps.
  std::vector<int32_t> planted_at = {static_cast<int32_t>(rng() % 1000),
                                     static_cast<int32_t>(rng() % 1000),
                                     static_cast<int32_t>(rng() % 1000)};
  int64_t reductions_seen = 0;
  int32_t planted_fed = 0;
  for (int32_t t = 0; t < 1000; ++t) {
    const bool is_planted = std::count(planted_at.begin(), planted_at.end(), t) > 0;
    const std::vector<float> q = Near(rng, is_planted ? planted : majority, 0.02f, 3.0f);
    for (int32_t h = 0; h < 2; ++h) {
      bank.Append(q.data());
      if (bank.num_reductions() == reductions_seen) continue;
      reductions_seen = bank.num_reductions();
      ASSERT_EQ(bank.size(), 64);
      int32_t planted_in = 0, majority_in = 0;
      const std::vector<float> rows = bank.Rows();
      for (int32_t i = 0; i < bank.size(); ++i) {
        planted_in += Cos(rows.data() + i * d, planted.data(), d) > 0.95 ? 1 : 0;
        majority_in += Cos(rows.data() + i * d, majority.data(), d) > 0.95 ? 1 : 0;
        for (int32_t j = 0; j < i; ++j) {
          ASSERT_LT(Cos(rows.data() + i * d, rows.data() + j * d, d), 0.999)
              << "near-duplicates " << j << " and " << i << " both kept at t=" << t;
        }
      }
      if (planted_fed > 0) {
        EXPECT_GE(planted_in, 1) << "planted cluster lost at t=" << t;
        EXPECT_LE(majority_in, 63);
      }
    }
    planted_fed += is_planted ? 1 : 0;
  }
  EXPECT_GE(reductions_seen, 8);
  ASSERT_GT(planted_fed, 0);
  // The first beacon is a planted query (it is the farthest from the buffer's mean).
  auto rope = Rope::Create({d, 1e6});
  ASSERT_TRUE(rope.ok());
  std::vector<float> beacons;
  ASSERT_EQ(bank.Beacons(2, *rope, 0, &beacons), 2);
  EXPECT_GT(Cos(beacons.data(), planted.data(), d), 0.95);
  EXPECT_GT(Cos(beacons.data() + d, majority.data(), d), 0.95);
}

INSTANTIATE_TEST_SUITE_P(Seeds, BeaconBufferTest, ::testing::Values(1u, 2u, 3u, 17u, 12345u));

TEST(BeaconBankTest, BeaconRotationEqualsRopeAtThePosition) {
  for (int32_t d : {2, 6, 128}) {
    std::mt19937 rng(d);
    auto rope = Rope::Create({d, 1e6});
    ASSERT_TRUE(rope.ok());
    BeaconBank bank(d, 1, 3);
    const std::vector<float> q = Near(rng, Unit(rng, d), 0.0f, 2.5f);
    bank.Append(q.data());
    for (int64_t t : {0, 1, 63, 2175, 40000}) {
      std::vector<float> beacons, direct(d);
      ASSERT_EQ(bank.Beacons(1, *rope, t, &beacons), 1);
      rope->Rotate(q.data(), t, direct.data());
      EXPECT_EQ(beacons, direct) << "d=" << d << " t=" << t;
    }
  }
}

// Full stateful run: 600 decode steps of a d=64, GQA-4 head. Local queries (post-RoPE) all
// point at the recent "local" keys; three early steps carry a planted pre-RoPE query v, and
// one old key is R_t(v): only a revisit would read it. snapkv evicts it, beacon keeps it.
TEST(BeaconVsSnapKv, KeyOnlyThePlantedClusterAttendsTo) {
  for (uint32_t seed : {5u, 6u, 7u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    const int32_t d = 64, g = 4, n = 600, prompt = 8, budget = 64, target_pos = 40;
    PolicyGeometry geo;
    geo.group_size = g;
    geo.rope = {d, 1e6};
    auto rope = Rope::Create(geo.rope);
    ASSERT_TRUE(rope.ok());
    const std::vector<float> local = Unit(rng, d);
    const std::vector<float> planted = Unit(rng, d);
    const std::vector<float> majority_pre = Unit(rng, d);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> keys;
    std::vector<int32_t> pos;
    for (int32_t p = 0; p < n; ++p) {
      std::vector<float> k(d);
      if (p == target_pos) {
        std::vector<float> v(d);
        for (int32_t i = 0; i < d; ++i) v[i] = 8.0f * planted[i];
        rope->Rotate(v.data(), n - 1, k.data());
      } else if (p >= n - 100) {
        k = Near(rng, local, 0.1f, 8.0f);  // the keys local queries read
      } else {
        for (float& x : k) x = dist(rng);
      }
      keys.insert(keys.end(), k.begin(), k.end());
      pos.push_back(p);
    }
    BeaconConfig beacon;
    beacon.budget = budget;
    beacon.n_recent = 16;
    beacon.coverage_layers = 0;  // the planted key must survive on its score
    SnapKvConfig snap;
    snap.budget = budget;
    snap.window = 16;
    for (const PolicyConfig& config : {PolicyConfig(beacon), PolicyConfig(snap)}) {
      auto state_or = NewPolicyState(config, geo, prompt);
      ASSERT_TRUE(state_or.ok()) << state_or.status();
      PolicyState& state = **state_or;
      std::mt19937 qrng(seed + 1000);  // same history for both policies
      for (int32_t p = prompt; p < n; ++p) {
        const bool revisit = p == 50 || p == 51 || p == 52;
        std::vector<float> pre, post;
        for (int32_t h = 0; h < g; ++h) {
          const std::vector<float> a = Near(qrng, revisit ? planted : majority_pre, 0.05f, 8.0f);
          const std::vector<float> b = Near(qrng, local, 0.1f, 8.0f);
          pre.insert(pre.end(), a.begin(), a.end());
          post.insert(post.end(), b.begin(), b.end());
        }
        ASSERT_TRUE(state.Observe(0, 0, {p, pre.data(), post.data()}, nullptr).ok());
      }
      const HeadKeys head{keys.data(), pos.data(), n};
      auto keep = state.Compress(0, absl::MakeConstSpan(&head, 1), std::vector<int32_t>{0}, n - 1);
      ASSERT_TRUE(keep.ok()) << keep.status();
      const std::vector<int32_t>& slots = (*keep)[0].slots;
      EXPECT_EQ(static_cast<int32_t>(slots.size()), budget);
      const bool kept = std::binary_search(slots.begin(), slots.end(), target_pos);
      EXPECT_EQ(kept, std::holds_alternative<BeaconConfig>(config))
          << PolicyName(config) << (kept ? " kept" : " evicted") << " the revisit target";
      EXPECT_GT(state.StateBytes(), 0);
    }
  }
}

}  // namespace
}  // namespace beaconkv

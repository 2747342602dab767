// BeaconKV specifics: the cosine FPS (every kernel the same ordering), and a key only the
// planted cluster attends to survives under beacon but not under snapkv. The query buffer
// itself (BeaconBank) is in beacon_bank_test.cc.
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
#include "policy_test_util.h"

namespace beaconkv {
namespace {

using testing::Cos;
using testing::Near;
using testing::Unit;

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

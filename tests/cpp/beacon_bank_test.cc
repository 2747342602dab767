// The beacon query buffer (BeaconBank): draws reduce it in FPS order and are reused, copies
// are left out of the beacons, a bfloat16 buffer behaves as a float one of the rounded
// queries, the radius keeps one query per tight cluster, the FPS keeps a planted rare cluster
// and thins near-duplicates of the majority, and beacons are exactly RoPE at the position.
#include "core/beacon_bank.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "core/rope.h"
#include "core/scoring.h"
#include "gtest/gtest.h"
#include "policy_test_util.h"

namespace beaconkv {
namespace {

using testing::Cos;
using testing::Near;
using testing::Unit;

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

}  // namespace
}  // namespace beaconkv

// The CPU twins of the scoring kernels (kernels/*_cpu.h) against core's functions and
// hand-worked cases. These define what the CUDA kernels must compute, so they run everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "core/beacon_bank.h"
#include "core/redundancy.h"
#include "core/rope.h"
#include "core/scoring.h"
#include "core/selection.h"
#include "kernels/append_kv_cpu.h"
#include "kernels/compaction_moves_cpu.h"
#include "kernels/fps_cpu.h"
#include "kernels/paged_scores_cpu.h"
#include "kernels/redundancy_cpu.h"
#include "kernels/rope_rotate_cpu.h"
#include "kernels/segmented_topk_cpu.h"
#include "kernels/topk_key.h"

namespace beaconkv::kernels {
namespace {

SegmentedTopKShape OneSegment(int32_t n, TopKPooling pooling = TopKPooling::kNone,
                              int32_t kernel = 1) {
  SegmentedTopKShape s;
  s.num_segments = 1;
  s.num_items = n;
  s.max_segment_len = n;
  s.pooling = pooling;
  s.pool_kernel = kernel;
  return s;
}

std::set<int32_t> KeptPositions(const std::vector<int32_t>& positions,
                                const std::vector<uint8_t>& keep) {
  std::set<int32_t> out;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) out.insert(positions[i]);
  return out;
}

TEST(SegmentedTopKCpuTest, EqualScoresKeepTheMostRecentTokens) {
  // Slot order scrambled; -0.0 and +0.0 are the same score.
  const std::vector<int32_t> offsets = {0, 5};
  const std::vector<int32_t> positions = {30, 10, 40, 20, 50};
  const std::vector<float> scores = {0.5f, 0.5f, -0.0f, 0.5f, 0.0f};
  const std::vector<uint8_t> protect = {0, 0, 0, 0, 1};
  std::vector<uint8_t> keep(5);
  for (int32_t k : {0, 1, 2, 3, 4, 9}) {
    SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), &k,
                     OneSegment(5), keep.data());
    const std::set<int32_t> kept = KeptPositions(positions, keep);
    const std::vector<std::set<int32_t>> want = {
        {50}, {50, 30}, {50, 30, 20}, {50, 30, 20, 10}, {50, 30, 20, 10, 40}, {50, 30, 20, 10, 40}};
    EXPECT_EQ(kept, want[std::min(k, 5)]) << "k " << k;
  }
}

TEST(SegmentedTopKCpuTest, MatchesSelectUniformWhateverTheSlotOrder) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int32_t n : {1, 17, 300}) {
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), 3);
    std::vector<float> scores(n);
    for (float& x : scores) x = std::round(u(rng) * 8) / 8;  // many ties
    std::vector<uint8_t> protect(n);
    for (int32_t i = 0; i < n; ++i) protect[i] = (i < 2 || i + 4 >= n) ? 1 : 0;
    const int64_t num_protected = std::count(protect.begin(), protect.end(), 1);
    const int64_t budget = num_protected + n / 3;
    const HeadCandidates head{positions, protect, scores};
    std::set<int32_t> want;
    for (int32_t i : SelectUniform(head, budget)) want.insert(positions[i]);
    // The same tokens in a shuffled slot order, two segments (the second one empty).
    std::vector<int32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> p2(n);
    std::vector<float> s2(n);
    std::vector<uint8_t> pr2(n), keep(n);
    for (int32_t i = 0; i < n; ++i) {
      p2[i] = positions[perm[i]];
      s2[i] = scores[perm[i]];
      pr2[i] = protect[perm[i]];
    }
    const std::vector<int32_t> offsets = {0, n, n};
    const std::vector<int32_t> k = {static_cast<int32_t>(budget - num_protected), 3};
    SegmentedTopKShape shape = OneSegment(n);
    shape.num_segments = 2;
    SegmentedTopKCpu(offsets.data(), s2.data(), p2.data(), pr2.data(), k.data(), shape,
                     keep.data());
    EXPECT_EQ(KeptPositions(p2, keep), want) << "n " << n;
  }
}

TEST(SegmentedTopKCpuTest, PoolingRunsInPositionOrder) {
  // Position order: scores 0 0 1 0 0 0 0.6 0; maxpool 3 spreads each peak to its neighbours.
  const std::vector<int32_t> ordered_pos = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<float> ordered_scores = {0, 0, 1, 0, 0, 0, 0.6f, 0};
  const std::vector<int32_t> perm = {5, 2, 7, 0, 3, 6, 1, 4};  // slot i holds token perm[i]
  std::vector<int32_t> positions(8);
  std::vector<float> scores(8);
  for (int i = 0; i < 8; ++i) {
    positions[i] = ordered_pos[perm[i]];
    scores[i] = ordered_scores[perm[i]];
  }
  const std::vector<int32_t> offsets = {0, 8};
  const std::vector<uint8_t> protect(8, 0);
  std::vector<uint8_t> keep(8);
  const int32_t k = 5;
  SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), &k,
                   OneSegment(8, TopKPooling::kMax, 3), keep.data());
  // Pooled: 0 1 1 1 0 .6 .6 .6 -> best five: 3, 2, 1 (score 1, recent first), then 7, 6.
  EXPECT_EQ(KeptPositions(positions, keep), (std::set<int32_t>{1, 2, 3, 6, 7}));
}

// With a penalty the rank score is lambda * pooled - (1 - lambda) * penalty: pooling first,
// then the penalty (R-KV), and an unpenalised peak can lose to a neighbour.
TEST(SegmentedTopKCpuTest, APenaltyIsSubtractedAfterPooling) {
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5};
  const std::vector<float> scores = {0, 0, 1, 0, 0, 0.8f};
  const std::vector<float> penalty = {0, 0, 4, 0, 0, 0};  // token 2 is redundant
  const std::vector<int32_t> offsets = {0, 6};
  const std::vector<uint8_t> protect(6, 0);
  std::vector<uint8_t> keep(6);
  const int32_t k = 2;
  SegmentedTopKShape shape = OneSegment(6, TopKPooling::kMax, 3);
  shape.penalty = {penalty.data(), 0.5f};
  SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), &k, shape,
                   keep.data());
  // Pooled 0 1 1 1 .8 .8; penalised 0 .5 -1.5 .5 .4 .4: tokens 3 and 1 (recent first).
  EXPECT_EQ(KeptPositions(positions, keep), (std::set<int32_t>{1, 3}));
  shape.penalty = {};
  SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), &k, shape,
                   keep.data());
  EXPECT_EQ(KeptPositions(positions, keep), (std::set<int32_t>{2, 3}));
}

// A reserved region takes its picks first, by the same order (ties to the newer), then the
// rest go to the best of what is left, inside the region or not.
TEST(SegmentedTopKCpuTest, AReservedRegionIsServedFirst) {
  // Two segments, slot order != position order in the second.
  const std::vector<int32_t> offsets = {0, 6, 11};
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 5, 4, 0, 3, 1, 2};
  const std::vector<float> scores = {.1f, .2f, .3f, .9f, .8f, .7f, .6f, .5f, .9f, .5f, .1f};
  const std::vector<uint8_t> protect = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const std::vector<uint8_t> region = {1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1};
  const std::vector<int32_t> k = {3, 2}, reserve_k = {1, 5};
  std::vector<uint8_t> keep(11);
  SegmentedTopKShape shape;
  shape.num_segments = 2;
  shape.num_items = 11;
  shape.max_segment_len = 6;
  SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), k.data(), shape,
                   keep.data());
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 0, 0, 1, 1, 1, 1, 0, 1, 0, 0}));
  shape.reserve = {region.data(), reserve_k.data()};
  SegmentedTopKCpu(offsets.data(), scores.data(), positions.data(), protect.data(), k.data(), shape,
                   keep.data());
  // Segment 0: the region's best unprotected (position 2, .3), then 3 and 4 (.9, .8); the
  // protected position 0 is kept and takes no pick. Segment 1: both picks go to the region
  // (reserve_k 5 > k 2): positions 0 and 1 (.5 each) over 2 (.1), though 3 outside scores .9.
  EXPECT_EQ(keep, (std::vector<uint8_t>{1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0}));
}

// The paged twin of R-KV's redundancy is core RedundancyScores on the keys in position order,
// written back in slot order.
TEST(PagedRedundancyScoresCpuTest, EqualsRedundancyScoresInPositionOrder) {
  const int32_t d = 8, bs = 4, n = 11;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> cache(4 * bs * d);
  for (float& x : cache) x = nd(rng);
  // Two slots are near-copies of a third, so the duplicate rule matters.
  for (int32_t e = 0; e < d; ++e) {
    cache[(2 * bs + 1) * d + e] = cache[(2 * bs + 0) * d + e] * 1.01f;
    cache[(3 * bs + 2) * d + e] = cache[(2 * bs + 0) * d + e] * 0.99f;
  }
  const std::vector<int32_t> tables = {2, 0, 3};
  const std::vector<int32_t> lengths = {n};
  const std::vector<int32_t> table_of_head = {0};
  const std::vector<int32_t> positions = {5, 9, 0, 3, 10, 1, 7, 2, 8, 4, 6};
  const std::vector<int32_t> score_offsets = {0, n};
  RedundancyShape s;
  s.num_heads = 1;
  s.head_dim = d;
  s.block_size = bs;
  s.max_blocks = 3;
  s.threshold = 0.5f;
  std::vector<float> got(n);
  PagedRedundancyScoresCpu(cache.data(), tables.data(), lengths.data(), table_of_head.data(),
                           positions.data(), score_offsets.data(), s, got.data());
  std::vector<float> keys(n * d), want(n);
  for (int32_t j = 0; j < n; ++j) {
    std::copy_n(cache.data() + (tables[j / bs] * bs + j % bs) * d, d,
                keys.data() + positions[j] * d);
  }
  RedundancyScores(keys.data(), n, d, s.threshold, want.data());
  for (int32_t j = 0; j < n; ++j) EXPECT_EQ(got[j], want[positions[j]]) << "slot " << j;
}

// The device top-k sorts TopKSortKey descending and keeps the first k: that is core's
// order exactly when key(a) > key(b) <=> a beats b under TopKUnprotected's comparator.
TEST(TopKSortKeyTest, OrdersLikeTheCpuComparator) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<float> values = {-kInf,  -3e38f, -1.0f, -1e-40f, -0.0f, 0.0f,  1e-45f,
                               1e-40f, 1e-38f, 0.5f,  0.5f,    1.0f,  3e38f, kInf};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int i = 0; i < 30; ++i) values.push_back(u(rng));
  const std::vector<int32_t> positions = {0, 1, 7, 65535, 2147483647};
  struct E {
    float score;
    int32_t position;
  };
  std::vector<E> elems;
  for (float v : values)
    for (int32_t p : positions) elems.push_back({v, p});
  for (const E& a : elems) {
    EXPECT_GT(TopKSortKey(a.score, a.position, 0), 0u);
    EXPECT_EQ(TopKSortKey(a.score, a.position, 1), 0u);
    for (const E& b : elems) {
      const bool a_beats_b = a.score != b.score ? a.score > b.score : a.position > b.position;
      ASSERT_EQ(TopKSortKey(a.score, a.position, 0) > TopKSortKey(b.score, b.position, 0),
                a_beats_b)
          << a.score << "@" << a.position << " vs " << b.score << "@" << b.position;
    }
  }
}

TEST(TopKPoolWindowTest, EqualsCorePool1dBitwise) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int32_t n : {1, 2, 5, 17, 64}) {
    std::vector<float> raw(n);
    for (float& x : raw) x = u(rng);
    if (n > 2) raw[1] = -0.0f;
    for (int32_t kernel : {3, 5, 7, 9, 101}) {  // kernel 1 never pools
      for (Pooling p : {Pooling::kMax, Pooling::kAvg}) {
        std::vector<float> want = raw;
        Pool1d(p, kernel, absl::MakeSpan(want));
        for (int32_t r = 0; r < n; ++r) {
          const float got = PoolWindow(raw.data(), r, n, p == Pooling::kMax, kernel);
          ASSERT_EQ(std::memcmp(&got, &want[r], sizeof(float)), 0)
              << "n " << n << " kernel " << kernel << " index " << r << ": " << got << " vs "
              << want[r];
        }
      }
    }
  }
}

PagedScoresShape OneHead(int32_t head_dim, int32_t block_size, int32_t max_blocks,
                         int32_t group_size, ScoreGqa gqa, ScoreQuery query) {
  PagedScoresShape s;
  s.num_heads = 1;
  s.head_dim = head_dim;
  s.block_size = block_size;
  s.max_blocks = max_blocks;
  s.group_size = group_size;
  s.gqa = gqa;
  s.query = query;
  return s;
}

TEST(PagedAttentionScoresCpuTest, EqualsAttentionScoresOnTheGatheredKeys) {
  const int32_t d = 8, bs = 4, n = 10, group = 2, nq = 3;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> cache(6 * bs * d);
  for (float& x : cache) x = nd(rng);
  const std::vector<int32_t> tables = {0, 0, 0, 5, 1, 3};  // table 1: blocks 5, 1, 3
  const std::vector<int32_t> lengths = {0, n};
  const std::vector<int32_t> table_of_head = {1};
  std::vector<float> q(nq * group * d);
  for (float& x : q) x = nd(rng);
  const std::vector<int32_t> query_offsets = {0, nq}, score_offsets = {0, n};
  const PagedScoresShape s = OneHead(d, bs, 3, group, ScoreGqa::kMeanProbs, ScoreQuery::kSum);
  std::vector<float> got(n);
  PagedAttentionScoresCpu(cache.data(), tables.data(), lengths.data(), table_of_head.data(),
                          q.data(), query_offsets.data(), score_offsets.data(), nullptr, s,
                          got.data());
  std::vector<float> keys(n * d), want(n);
  const int32_t blocks[] = {5, 1, 3};
  for (int32_t j = 0; j < n; ++j)
    std::copy_n(cache.data() + (blocks[j / bs] * bs + j % bs) * d, d, keys.data() + j * d);
  ScoreScratch scratch;
  AttentionScores(keys.data(), 0, n, d, q.data(), nq, group,
                  {GqaReduction::kMeanProbs, QueryReduction::kSum}, want.data(), &scratch);
  EXPECT_EQ(got, want);
}

// Excluded keys are left out of every softmax (as if the head did not hold them) and score
// excluded_score; with max pooling padded by -inf, pooling the head's scores is Pool1d over the
// scored keys alone when the excluded ones are the newest (snapkv's window).
TEST(PagedAttentionScoresCpuTest, ExcludedKeysTakeNoPartAndPoolAsPadding) {
  const int32_t d = 8, bs = 4, n = 11, group = 4, nq = 3, window = 3;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> cache(4 * bs * d);
  for (float& x : cache) x = nd(rng);
  const std::vector<int32_t> tables = {2, 0, 3};  // blocks 2, 0, 3
  const std::vector<int32_t> lengths = {n};
  const std::vector<int32_t> table_of_head = {0};
  // Slot order is not position order; the newest `window` positions are excluded.
  const std::vector<int32_t> positions = {5, 9, 0, 3, 10, 1, 7, 2, 8, 4, 6};
  std::vector<uint8_t> excluded(n);
  for (int32_t j = 0; j < n; ++j) excluded[j] = positions[j] >= n - window;
  std::vector<float> q(nq * group * d);
  for (float& x : q) x = nd(rng);
  const std::vector<int32_t> query_offsets = {0, nq}, score_offsets = {0, n};
  PagedScoresShape s = OneHead(d, bs, 3, group, ScoreGqa::kMaxLogits, ScoreQuery::kMean);
  s.excluded_score = -std::numeric_limits<float>::infinity();
  std::vector<float> got(n);
  PagedAttentionScoresCpu(cache.data(), tables.data(), lengths.data(), table_of_head.data(),
                          q.data(), query_offsets.data(), score_offsets.data(), excluded.data(), s,
                          got.data());
  // The scored keys in position order, scored alone.
  const int32_t m = n - window;
  std::vector<float> keys(m * d), want(m);
  for (int32_t j = 0; j < n; ++j) {
    if (excluded[j]) {
      EXPECT_EQ(got[j], s.excluded_score) << "slot " << j;
      continue;
    }
    std::copy_n(cache.data() + (tables[j / bs] * bs + j % bs) * d, d,
                keys.data() + positions[j] * d);
  }
  ScoreScratch scratch;
  AttentionScores(keys.data(), 0, m, d, q.data(), nq, group,
                  {GqaReduction::kMaxLogits, QueryReduction::kMean}, want.data(), &scratch);
  std::vector<float> by_position(n);
  for (int32_t j = 0; j < n; ++j) by_position[positions[j]] = got[j];
  for (int32_t i = 0; i < m; ++i) EXPECT_NEAR(by_position[i], want[i], 1e-6f) << "position " << i;
  Pool1d(Pooling::kMax, 5, absl::MakeSpan(want));
  Pool1d(Pooling::kMax, 5, absl::MakeSpan(by_position));
  for (int32_t i = 0; i < m; ++i) EXPECT_NEAR(by_position[i], want[i], 1e-6f) << "position " << i;
}

TEST(AppendKvCpuTest, WritesTheSlotAfterTheLastToken) {
  const int32_t d = 2, bs = 4;
  std::vector<float> k(3 * bs * d, 0.0f), v(k.size(), 0.0f);
  std::vector<int32_t> pos(3 * bs, -1);
  const std::vector<int32_t> tables = {2, 0};  // one table: blocks 2 then 0
  const std::vector<int32_t> lengths = {5};    // next token goes to block 0, offset 1
  const std::vector<int32_t> rows = {0}, new_pos = {77};
  const std::vector<float> nk = {1, 2}, nv = {3, 4};
  AppendKvCpu(nk.data(), nv.data(), new_pos.data(), rows.data(), tables.data(), lengths.data(),
              {1, d, bs, 2}, k.data(), v.data(), pos.data());
  EXPECT_EQ(pos[1], 77);
  EXPECT_EQ(k[2], 1.0f);
  EXPECT_EQ(k[3], 2.0f);
  EXPECT_EQ(v[2], 3.0f);
  EXPECT_EQ(std::count(pos.begin(), pos.end(), -1), 3 * bs - 1);
}

TEST(CompactionMovesCpuTest, HolesFilledByTheFirstSurvivorsThroughTheBlockTable) {
  // Segment 0: keep {0, 2, 4, 5} of 6 -> holes 1, 3 filled by 4, 5. Segment 1: all kept.
  const std::vector<int32_t> offsets = {0, 6, 9};
  const std::vector<uint8_t> keep = {1, 0, 1, 0, 1, 1, 1, 1, 1};
  const std::vector<int32_t> table_of_segment = {1, 0};
  const std::vector<int32_t> tables = {0, 2, 3, 1};  // table 1: blocks 3 then 1
  std::vector<int32_t> from(9, -1), to(9, -1), moves(2), lengths(2);
  CompactionMovesCpu(offsets.data(), keep.data(), table_of_segment.data(), tables.data(),
                     {2, 9, 4, 2}, from.data(), to.data(), moves.data(), lengths.data());
  EXPECT_EQ(moves, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(lengths, (std::vector<int32_t>{4, 3}));
  // Index j of table 1 is slot table[j / 4] * 4 + j % 4: 1 -> 13, 3 -> 15, 4 -> 4, 5 -> 5.
  EXPECT_EQ(from[0], 4);
  EXPECT_EQ(to[0], 13);
  EXPECT_EQ(from[1], 5);
  EXPECT_EQ(to[1], 15);
}

TEST(RopeTwinTest, TableRowsAreCoreAnglesAndRotationIsCoreRotate) {
  absl::StatusOr<Rope> rope = Rope::Create({8, 1e4});
  ASSERT_TRUE(rope.ok());
  const std::vector<int32_t> positions = {0, 9, 4096};
  std::vector<float> table(3 * 8), cs(4), sn(4);
  RopeAngleTable(*rope, positions.data(), 3, table.data());
  rope->Angles(4096, cs.data(), sn.data());
  EXPECT_TRUE(std::equal(cs.begin(), cs.end(), table.begin() + 16));
  EXPECT_TRUE(std::equal(sn.begin(), sn.end(), table.begin() + 20));
  std::vector<float> src(2 * 8), got(src.size()), want(8);
  std::iota(src.begin(), src.end(), 1.0f);
  const std::vector<int32_t> table_row = {2, 1};
  RotateRowsCpu(*rope, src.data(), table_row.data(), positions.data(), 2, got.data());
  rope->Rotate(src.data() + 8, 9, want.data());
  EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + 8));
}

TEST(FarthestPointOrderCpuTest, EachRowIsCoresOrderingThenMinusOne) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  constexpr int32_t kSegments = 3, kMaxPoints = 40, kDim = 8, kMaxCount = 12;
  std::vector<float> points(kSegments * kMaxPoints * kDim);
  for (float& x : points) x = nd(rng);
  const std::vector<int32_t> n = {40, 5, 0}, count = {12, 5, 0};
  std::vector<int32_t> order(kSegments * kMaxCount, 99);
  FarthestPointOrderCpu(points.data(), n.data(), count.data(), kSegments, kMaxPoints, kDim,
                        kMaxCount, order.data());
  for (int32_t s = 0; s < kSegments; ++s) {
    std::vector<int32_t> want =
        CosineFarthestPointOrder(points.data() + s * kMaxPoints * kDim, n[s], kDim, count[s]);
    want.resize(kMaxCount, -1);
    EXPECT_EQ(
        std::vector<int32_t>(order.begin() + s * kMaxCount, order.begin() + (s + 1) * kMaxCount),
        want)
        << "segment " << s;
  }
  EXPECT_GE(order[0 * kMaxCount + 11], 0);  // a full row: 12 picks of 40
  EXPECT_EQ(order[1 * kMaxCount + 5], -1);  // 5 picks of 5, then padding
}

}  // namespace
}  // namespace beaconkv::kernels

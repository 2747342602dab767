// GpuScorer against PagedTwinScorer: the same jobs over the same paged keys (a CudaKvStore
// holding a CpuKvStore's bytes, some query rows before RoPE for each scorer to rotate) give
// scores equal to rounding and exactly the keep masks that the CPU top-k makes of the device's
// own scores. Skips where no GPU is present.
#include "kernels/gpu_scorer.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "core/policy.h"
#include "kernels/segmented_topk_cpu.h"
#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;

constexpr int32_t kBlocks = 2048;

struct Case {
  int32_t head_dim;
  int32_t block_size;
  int32_t group_size;
  GqaReduction gqa;
  Pooling pooling;
  int32_t pool_kernel;
  QueryReduction query = QueryReduction::kMax;
  bool protected_unscored = false;
  KvDtype dtype = KvDtype::kFloat32;  // the device store's (the host store holds its values)
  bool redundancy = false;            // rkv's plans: lambda 0.3, threshold 0.9
  bool reserve = false;  // beacon's prompt_slots: every other job has a reserved region
  bool bf16 = false;     // beacon's score_bf16: products of bfloat16-rounded queries and keys
};

class GpuScorerTest : public ::testing::TestWithParam<Case> {};

TEST_P(GpuScorerTest, MatchesThePagedTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  std::mt19937 rng(c.head_dim * 7 + c.block_size * 3 + c.group_size);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  CpuKvStore host(kBlocks, c.block_size, c.head_dim);
  const size_t slots = static_cast<size_t>(kBlocks) * c.block_size;
  std::vector<float> keys(slots * c.head_dim);
  for (float& x : keys) x = normal(rng);
  // Every seventh slot a scaled copy of an earlier one: near-duplicates for rkv's redundancy.
  for (size_t slot = 7; slot < slots; slot += 7) {
    const size_t from = rng() % slot;
    for (int32_t e = 0; e < c.head_dim; ++e) {
      keys[slot * c.head_dim + e] = 1.5f * keys[from * c.head_dim + e];
    }
  }
  const std::vector<uint8_t> key_bytes = gpu_test::Store(keys, c.dtype);
  for (BlockId b = 0; b < kBlocks; ++b) {
    for (int32_t o = 0; o < c.block_size; ++o) {
      std::copy_n(keys.begin() + (static_cast<size_t>(b) * c.block_size + o) * c.head_dim,
                  c.head_dim, host.key({b, o}));
    }
  }
  DeviceBuffer dk(key_bytes), dv(key_bytes.size()), dp(slots * sizeof(int32_t));
  CudaKvStore device(dk.as<void>(), dv.as<void>(), dp.as<int32_t>(), kBlocks, c.block_size,
                     c.head_dim, c.dtype);

  // 24 jobs of odd lengths up to ~2,200 tokens, tables of distinct shuffled blocks.
  std::vector<BlockId> free(kBlocks - 1);
  std::iota(free.begin(), free.end(), 1);
  std::shuffle(free.begin(), free.end(), rng);
  const int32_t jobs_n = 24;
  std::vector<ScoringTask> tasks(jobs_n);
  std::vector<std::vector<BlockId>> tables(jobs_n);
  std::vector<std::vector<int32_t>> positions(jobs_n);
  size_t next = 0;
  for (int32_t j = 0; j < jobs_n; ++j) {
    const int32_t n =
        std::min<int32_t>(1 + static_cast<int32_t>(rng() % 2200),
                          static_cast<int32_t>((free.size() - next) / jobs_n) * c.block_size);
    ScoringTask& t = tasks[j];
    t.kv_head = j;
    t.num_queries = 1 + static_cast<int32_t>(rng() % 64);
    t.queries.resize(static_cast<size_t>(t.num_queries) * c.group_size * c.head_dim);
    for (float& x : t.queries) x = normal(rng);
    t.protect.resize(n);
    for (uint8_t& p : t.protect) p = rng() % 8 == 0;
    t.k = static_cast<int64_t>(rng() % (n + 1));
    // Some rows before RoPE (beacons), rotated by the scorer to a position of their own.
    t.rotated_rows = static_cast<int32_t>(rng() % (t.num_queries + 1));
    t.rotate_to = static_cast<int32_t>(rng() % 5000);
    if (c.reserve && j % 2 == 0) {
      t.reserve.resize(n);
      for (uint8_t& r : t.reserve) r = rng() % 4 == 0;
      t.reserve_k = static_cast<int64_t>(rng() % 16);
    }
    const int32_t blocks = (n + c.block_size - 1) / c.block_size;
    tables[j].assign(free.begin() + next, free.begin() + next + blocks);
    next += blocks;
    positions[j].resize(n);
    std::iota(positions[j].begin(), positions[j].end(), 0);
    std::shuffle(positions[j].begin(), positions[j].end(), rng);
  }
  std::vector<ScoringJob> jobs;
  for (int32_t j = 0; j < jobs_n; ++j) jobs.push_back({tables[j], positions[j], &tasks[j]});
  ScoringShape shape{c.head_dim, c.block_size,  c.group_size,        {c.gqa, c.query, c.bf16},
                     c.pooling,  c.pool_kernel, c.protected_unscored};
  shape.redundancy = c.redundancy;
  shape.rope_theta = 10000.0;
  shape.lambda = 0.3f;
  shape.redundancy_threshold = 0.9f;

  ScoringResult want, got;
  PagedTwinScorer twin(&host);
  ASSERT_TRUE(twin.Score(shape, jobs, &want).ok());
  GpuScorer gpu(&device);
  const absl::Status s = gpu.Score(shape, jobs, &got);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.offsets, want.offsets);
  for (size_t i = 0; i < want.scores.size(); ++i) {
    if (got.scores[i] == want.scores[i]) continue;  // incl. both -inf (unscored, max pooling)
    ASSERT_LE(std::fabs(got.scores[i] - want.scores[i]), 1e-6f + 2e-4f * std::fabs(want.scores[i]))
        << "item " << i;
  }
  // The device's masks are exactly what the CPU top-k makes of the device's scores.
  std::vector<int32_t> k(jobs_n);
  for (int32_t j = 0; j < jobs_n; ++j) k[j] = static_cast<int32_t>(tasks[j].k);
  std::vector<int32_t> flat_positions, reserve_k(jobs_n);
  std::vector<uint8_t> flat_protect, flat_reserve;
  for (int32_t j = 0; j < jobs_n; ++j) {
    const ScoringTask& t = tasks[j];
    flat_positions.insert(flat_positions.end(), positions[j].begin(), positions[j].end());
    flat_protect.insert(flat_protect.end(), t.protect.begin(), t.protect.end());
    if (t.reserve.empty()) {
      flat_reserve.insert(flat_reserve.end(), t.protect.size(), 0);
    } else {
      flat_reserve.insert(flat_reserve.end(), t.reserve.begin(), t.reserve.end());
    }
    reserve_k[j] = static_cast<int32_t>(t.reserve_k);
  }
  SegmentedTopKShape topk;
  topk.num_segments = jobs_n;
  topk.num_items = got.offsets.back();
  topk.max_segment_len = 2200;
  topk.pooling = c.pooling == Pooling::kMax   ? TopKPooling::kMax
                 : c.pooling == Pooling::kAvg ? TopKPooling::kAvg
                                              : TopKPooling::kNone;
  topk.pool_kernel = c.pool_kernel;
  if (c.reserve) topk.reserve = {flat_reserve.data(), reserve_k.data()};
  if (c.redundancy) {
    ASSERT_EQ(got.penalty.size(), want.penalty.size());
    for (size_t i = 0; i < want.penalty.size(); ++i) {
      ASSERT_NEAR(got.penalty[i], want.penalty[i], 1e-7f + 1e-4f * std::fabs(want.penalty[i]))
          << "redundancy of item " << i;
    }
    topk.penalty = {got.penalty.data(), shape.lambda};
  } else {
    EXPECT_TRUE(got.penalty.empty());
  }
  std::vector<uint8_t> expect(got.keep.size());
  SegmentedTopKCpu(got.offsets.data(), got.scores.data(), flat_positions.data(),
                   flat_protect.data(), k.data(), topk, expect.data());
  EXPECT_EQ(got.keep, expect);
  // And nearly the twin's: only near-ties at a cut can differ.
  int64_t differ = 0;
  for (size_t i = 0; i < want.keep.size(); ++i) differ += want.keep[i] != got.keep[i];
  EXPECT_LE(differ, static_cast<int64_t>(want.keep.size() / 200));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuScorerTest,
    ::testing::Values(
        Case{32, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 1},
        Case{64, 8, 4, GqaReduction::kMeanProbs, Pooling::kAvg, 5},
        Case{128, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 3},
        Case{128, 1, 8, GqaReduction::kMaxProbs, Pooling::kNone, 1},
        // snapkv's plans: max-logit GQA, mean over the window, window unscored
        Case{64, 16, 4, GqaReduction::kMaxLogits, Pooling::kMax, 7, QueryReduction::kMean, true},
        Case{32, 8, 1, GqaReduction::kMaxLogits, Pooling::kAvg, 3, QueryReduction::kMean, true},
        // 16-bit device stores
        Case{128, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 3, QueryReduction::kMax, false,
             KvDtype::kBFloat16},
        Case{64, 16, 4, GqaReduction::kMaxLogits, Pooling::kMax, 7, QueryReduction::kMean, true,
             KvDtype::kFloat16},
        // rkv's plans: snapkv's plus the redundancy term
        Case{128, 16, 4, GqaReduction::kMaxLogits, Pooling::kMax, 7, QueryReduction::kMean, true,
             KvDtype::kFloat32, true},
        Case{32, 8, 1, GqaReduction::kMaxLogits, Pooling::kMax, 3, QueryReduction::kMean, true,
             KvDtype::kBFloat16, true},
        // beacon's plans with redundancy > 0: max of probabilities, every token scored
        Case{64, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 1, QueryReduction::kMax, false,
             KvDtype::kFloat32, true},
        // beacon's plans with prompt_slots: a reserved region, with and without redundancy
        Case{64, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 1, QueryReduction::kMax, false,
             KvDtype::kFloat32, false, true},
        Case{128, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 3, QueryReduction::kMax, false,
             KvDtype::kBFloat16, true, true},
        // beacon's plans with score_bf16, on float32 and bfloat16 device stores
        Case{32, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 1, QueryReduction::kMax, false,
             KvDtype::kFloat32, false, true, true},
        Case{128, 16, 1, GqaReduction::kMaxProbs, Pooling::kMax, 3, QueryReduction::kMax, false,
             KvDtype::kBFloat16, false, false, true}));

// A pooled beacon plan (every head of the layer a task, k = 0): the device's scores handed to
// the policy's selection (SelectFromScores) keep what the twin's scores make it keep, but for
// near-ties at the layer's cut, and the layer keeps its pooled budget either way.
TEST(GpuScorerPooledTest, PooledPlansSelectFromTheDevicesScoresAsFromTheTwins) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int32_t kKvHeads = 4, kGroup = 2, kDim = 64, kBlock = 16, kPrompt = 24;
  BeaconConfig config;
  config.budget = 96;
  config.interval = 32;
  config.budget_mode = BudgetMode::kPooled;
  config.coverage_layers = 1;
  PolicyGeometry geometry;
  geometry.num_layers = 2;
  geometry.num_kv_heads = kKvHeads;
  geometry.group_size = kGroup;
  geometry.rope.head_dim = kDim;
  geometry.rope.rope_theta = 10000.0;
  auto state = NewPolicyState(config, geometry, kPrompt);
  ASSERT_TRUE(state.ok()) << state.status();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int32_t n = config.budget + config.interval;  // every head due
  // Layer 1 (no coverage sample): each head's n tokens in shuffled slots of its own blocks.
  const int32_t layer = 1, blocks_per_head = (n + kBlock - 1) / kBlock;
  const int32_t num_blocks = 1 + kKvHeads * blocks_per_head;
  CpuKvStore host(num_blocks, kBlock, kDim);
  std::vector<float> keys(static_cast<size_t>(num_blocks) * kBlock * kDim);
  for (float& x : keys) x = normal(rng);
  for (BlockId b = 0; b < num_blocks; ++b) {
    for (int32_t o = 0; o < kBlock; ++o) {
      std::copy_n(keys.begin() + (static_cast<size_t>(b) * kBlock + o) * kDim, kDim,
                  host.key({b, o}));
    }
  }
  const std::vector<uint8_t> key_bytes = gpu_test::Store(keys, KvDtype::kFloat32);
  DeviceBuffer dk(key_bytes), dv(key_bytes.size()), dp(keys.size() / kDim * sizeof(int32_t));
  CudaKvStore device(dk.as<void>(), dv.as<void>(), dp.as<int32_t>(), num_blocks, kBlock, kDim,
                     KvDtype::kFloat32);
  std::vector<std::vector<BlockId>> tables(kKvHeads);
  std::vector<std::vector<int32_t>> positions(kKvHeads);
  std::vector<HeadKeys> heads(kKvHeads);
  for (int32_t h = 0; h < kKvHeads; ++h) {
    for (int32_t b = 0; b < blocks_per_head; ++b) tables[h].push_back(1 + h * blocks_per_head + b);
    positions[h].resize(n);
    std::iota(positions[h].begin(), positions[h].end(), 0);
    std::shuffle(positions[h].begin(), positions[h].end(), rng);
    heads[h] = {nullptr, positions[h].data(), n};
  }
  // Queries for every position, so that the recent rings and beacon buffers are full.
  std::vector<float> pre(static_cast<size_t>(kGroup) * kDim), post(pre.size());
  for (int32_t p = 0; p < n; ++p) {
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (float& x : pre) x = normal(rng);
      for (float& x : post) x = normal(rng);
      ASSERT_TRUE((*state)->Observe(layer, h, {p, pre.data(), post.data()}, nullptr).ok());
    }
  }
  auto plan = (*state)->PlanScoring(layer, heads, {0, 1, 2, 3}, n - 1);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->pooled);
  ASSERT_EQ(plan->tasks.size(), static_cast<size_t>(kKvHeads));
  std::vector<ScoringJob> jobs;
  for (const ScoringTask& t : plan->tasks)
    jobs.push_back({tables[t.kv_head], positions[t.kv_head], &t});
  const ScoringShape shape = ScoringShape::Of(*plan, kDim, kBlock);
  ScoringResult want, got;
  PagedTwinScorer twin(&host);
  ASSERT_TRUE(twin.Score(shape, jobs, &want).ok());
  GpuScorer gpu(&device);
  ASSERT_TRUE(gpu.Score(shape, jobs, &got).ok());
  auto select = [&](const ScoringResult& r) {
    std::vector<absl::Span<const float>> scores;
    for (int32_t j = 0; j < kKvHeads; ++j) scores.push_back(r.ScoresOf(j));
    return (*state)->SelectFromScores(*plan, heads, scores);
  };
  const auto from_twin = select(want), from_gpu = select(got);
  ASSERT_TRUE(from_twin.ok() && from_gpu.ok()) << from_twin.status() << from_gpu.status();
  int64_t kept = 0, differ = 0;
  for (int32_t h = 0; h < kKvHeads; ++h) {
    const std::vector<int32_t>& a = (*from_twin)[h].slots;
    const std::vector<int32_t>& b = (*from_gpu)[h].slots;
    kept += static_cast<int64_t>(b.size());
    std::vector<int32_t> only;
    std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only));
    differ += static_cast<int64_t>(only.size());
  }
  EXPECT_EQ(kept, int64_t{config.budget} * kKvHeads);
  EXPECT_LE(differ, 4);  // a swapped near-tie at the cut counts twice
}

TEST(GpuScorerErrorsTest, ShapesTheKernelsDoNotTakeAreInvalidArguments) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const int32_t d = 16, bs = 4;  // head_dim 16: no kernel
  DeviceBuffer dk(size_t{8} * bs * d * 4), dv(size_t{8} * bs * d * 4), dp(size_t{8} * bs * 4);
  CudaKvStore device(dk.as<void>(), dv.as<void>(), dp.as<int32_t>(), 8, bs, d);
  GpuScorer gpu(&device);
  ScoringTask t;
  t.num_queries = 1;
  t.queries.assign(d, 1.0f);
  t.protect.assign(3, 0);
  t.k = 1;
  const std::vector<BlockId> table = {1};
  const std::vector<int32_t> pos = {0, 1, 2};
  ScoringResult r;
  ScoringShape shape{d, bs, 1, {}, Pooling::kNone, 1};
  EXPECT_EQ(gpu.Score(shape, {{table, pos, &t}}, &r).code(), absl::StatusCode::kInvalidArgument);
  shape.head_dim = 32;  // not the store's
  EXPECT_EQ(gpu.Score(shape, {{table, pos, &t}}, &r).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace beaconkv::kernels

// GpuScorer against PagedTwinScorer: the same jobs over the same paged keys (a CudaKvStore
// holding a CpuKvStore's bytes, some query rows before RoPE for each scorer to rotate) give
// scores equal to rounding and exactly the keep masks that the CPU top-k makes of the device's
// own scores. Skips where no GPU is present.
#include "kernels/gpu_scorer.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

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
  ScoringShape shape{c.head_dim, c.block_size,  c.group_size,        {c.gqa, c.query},
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
             KvDtype::kBFloat16, true, true}));

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

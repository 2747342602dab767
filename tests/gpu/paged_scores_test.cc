// CUDA attention scores over paged keys against the CPU twin (core AttentionScores).
// Skips where no GPU is present.
#include "kernels/paged_scores.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::Store;
using gpu_test::ToHost;

// (head_dim, block_size, group_size, gqa, query, with excluded keys, key storage)
using Param = std::tuple<int, int, int, ScoreGqa, ScoreQuery, bool, KvDtype>;
class PagedScoresGpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(PagedScoresGpuTest, MatchesTheCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [d, bs, group, gqa, query, exclude, dtype] = GetParam();
  const uint32_t seed = d * 1009 + bs * 101 + group * 7 + static_cast<int>(gqa) * 3 +
                        static_cast<int>(query) + (exclude ? 50021 : 0) +
                        static_cast<int>(dtype) * 70001;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Tables: lengths of the heads; heads score a subset of tables in a scrambled order, and
  // query counts cover 0, 1, one chunk and several chunks of 64 rows.
  const std::vector<int32_t> lengths = {1, 17, 0, 130, 2176, 64, 65, 5};
  const std::vector<int32_t> table_of_head = {4, 0, 1, 3, 2, 6, 7};
  const std::vector<int32_t> num_queries = {70, 1, 3, 0, 2, 129, 9};
  PagedScoresShape s;
  s.num_heads = static_cast<int32_t>(table_of_head.size());
  s.head_dim = d;
  s.block_size = bs;
  s.group_size = group;
  s.gqa = gqa;
  s.query = query;
  const gpu_test::PagedTables paged = gpu_test::MakePagedTables(lengths, bs, rng);
  s.max_blocks = paged.max_blocks;
  const int32_t total_blocks = paged.num_blocks;
  const std::vector<int32_t>& tables = paged.tables;
  // Keys scaled so that softmaxes are peaked for some rows and flat for others.
  std::vector<float> k(int64_t{total_blocks} * bs * d);
  for (float& x : k) x = 2.0f * nd(rng);
  const std::vector<uint8_t> k_bytes = Store(k, dtype);  // the twin reads the stored values
  std::vector<int32_t> query_offsets = {0}, score_offsets = {0};
  for (size_t h = 0; h < table_of_head.size(); ++h) {
    query_offsets.push_back(query_offsets.back() + num_queries[h]);
    score_offsets.push_back(score_offsets.back() + lengths[table_of_head[h]]);
  }
  std::vector<float> q(int64_t{query_offsets.back()} * group * d);
  for (float& x : q) x = nd(rng);
  // Excluded keys: a quarter at random, and every key of head 6 (5 keys, 9 queries: a head
  // left with nothing to score); their score is the max-pooling padding.
  std::vector<uint8_t> excluded(score_offsets.back(), 0);
  if (exclude) {
    for (uint8_t& x : excluded) x = rng() % 4 == 0;
    std::fill(excluded.begin() + score_offsets[6], excluded.begin() + score_offsets[7], 1);
    s.excluded_score = -INFINITY;
  }
  const uint8_t* host_excluded = exclude ? excluded.data() : nullptr;
  DeviceBuffer dk(k_bytes), dt(tables), dl(lengths), dh(table_of_head), dq(q), dqo(query_offsets),
      dso(score_offsets), dx(excluded), dout(score_offsets.back() * sizeof(float));
  // Each shape with float32 products and with bfloat16 ones (queries and keys rounded first).
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "bf16 " << bf16);
    s.bf16 = bf16;
    std::vector<float> want(score_offsets.back(), -1.0f);
    PagedAttentionScoresCpu(k.data(), tables.data(), lengths.data(), table_of_head.data(), q.data(),
                            query_offsets.data(), score_offsets.data(), host_excluded, s,
                            want.data());
    // max_queries: unknown (one block per head), the true most (129), too few (70: a block
    // takes several chunks) and too many (blocks with no chunk). With query == kMax the last
    // three spread heads over several blocks; every value must give the same scores. Each also
    // with the register-softmax kernel (group_size 1 only; ignored otherwise).
    for (int variant = 0; variant < 8; ++variant) {
      const int32_t max_queries = std::vector<int32_t>{0, 129, 70, 1000}[variant % 4];
      SCOPED_TRACE(::testing::Message()
                   << "max_queries " << max_queries << " register_softmax " << (variant >= 4));
      s.max_queries = max_queries;
      s.register_softmax = variant >= 4;
      ASSERT_EQ(cudaMemset(dout.as<float>(), 0xff, want.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(PagedAttentionScores(dk.as<void>(), dtype, dt.as<int32_t>(), dl.as<int32_t>(),
                                     dh.as<int32_t>(), dq.as<float>(), dqo.as<int32_t>(),
                                     dso.as<int32_t>(), exclude ? dx.as<uint8_t>() : nullptr, s,
                                     dout.as<float>(), nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = ToHost(dout.as<float>(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        if (excluded[i]) {
          ASSERT_EQ(got[i], s.excluded_score) << "score " << i;
          continue;
        }
        ASSERT_NEAR(got[i], want[i], 1e-6f + 2e-4f * std::abs(want[i])) << "score " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedScoresGpuTest,
    ::testing::Combine(::testing::Values(32, 64, 128), ::testing::Values(1, 8, 16),
                       ::testing::Values(1, 4, 8),
                       ::testing::Values(ScoreGqa::kMaxProbs, ScoreGqa::kMeanProbs,
                                         ScoreGqa::kMaxLogits),
                       ::testing::Values(ScoreQuery::kMax, ScoreQuery::kMean, ScoreQuery::kSum),
                       ::testing::Values(false), ::testing::Values(KvDtype::kFloat32)));

// Excluded keys (snapkv's window) with every GQA reduction.
INSTANTIATE_TEST_SUITE_P(
    Excluded, PagedScoresGpuTest,
    ::testing::Combine(::testing::Values(32, 128), ::testing::Values(16), ::testing::Values(1, 8),
                       ::testing::Values(ScoreGqa::kMaxProbs, ScoreGqa::kMeanProbs,
                                         ScoreGqa::kMaxLogits),
                       ::testing::Values(ScoreQuery::kMax, ScoreQuery::kMean),
                       ::testing::Values(true), ::testing::Values(KvDtype::kFloat32)));

// 16-bit key storage.
INSTANTIATE_TEST_SUITE_P(
    Storage, PagedScoresGpuTest,
    ::testing::Combine(::testing::Values(64, 128), ::testing::Values(16), ::testing::Values(1, 4),
                       ::testing::Values(ScoreGqa::kMaxProbs, ScoreGqa::kMaxLogits),
                       ::testing::Values(ScoreQuery::kMax), ::testing::Bool(),
                       ::testing::Values(KvDtype::kBFloat16, KvDtype::kFloat16)));

// Argument checks happen on the host before any CUDA call: these run without a GPU.
TEST(PagedScoresArgsTest, UnsupportedShapesAreErrors) {
  PagedScoresShape s;
  s.num_heads = 1;
  s.block_size = 16;
  s.max_blocks = 1;
  s.head_dim = 48;
  EXPECT_EQ(PagedAttentionScores(nullptr, KvDtype::kFloat32, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, s, nullptr, nullptr),
            cudaErrorInvalidValue);
  s.head_dim = 128;
  s.gqa = static_cast<ScoreGqa>(7);
  EXPECT_EQ(PagedAttentionScores(nullptr, KvDtype::kFloat32, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, s, nullptr, nullptr),
            cudaErrorInvalidValue);
  s.gqa = ScoreGqa::kMaxProbs;
  EXPECT_EQ(PagedAttentionScores(nullptr, static_cast<KvDtype>(3), nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, nullptr, s, nullptr, nullptr),
            cudaErrorInvalidValue);
  s.group_size = 65;
  EXPECT_EQ(PagedAttentionScores(nullptr, KvDtype::kFloat32, nullptr, nullptr, nullptr, nullptr,
                                 nullptr, nullptr, nullptr, s, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

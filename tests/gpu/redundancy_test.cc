// CUDA R-KV redundancy against its CPU twin (core RedundancyScores in position order).
// Skips where no GPU is present.
#include "kernels/redundancy.h"

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

// (head_dim, block_size, threshold, key storage)
using Param = std::tuple<int, int, float, KvDtype>;
class RedundancyGpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(RedundancyGpuTest, MatchesTheCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [d, bs, threshold, dtype] = GetParam();
  std::mt19937 rng(d * 131 + bs * 7 + static_cast<int>(dtype));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Heads of 0, 1, 2, 37, 300 and 1,100 keys, in a scrambled table order.
  const std::vector<int32_t> lengths = {37, 0, 1100, 1, 300, 2};
  const std::vector<int32_t> table_of_head = {2, 0, 5, 4, 1, 3};
  RedundancyShape s;
  s.num_heads = static_cast<int32_t>(table_of_head.size());
  s.head_dim = d;
  s.block_size = bs;
  s.threshold = threshold;
  const gpu_test::PagedTables paged = gpu_test::MakePagedTables(lengths, bs, rng);
  s.max_blocks = paged.max_blocks;
  const int32_t total_blocks = paged.num_blocks;
  const std::vector<int32_t>& tables = paged.tables;
  // Keys: random, and every fifth slot a scaled copy of an earlier one (near-duplicates).
  std::vector<float> k(int64_t{total_blocks} * bs * d);
  for (float& x : k) x = nd(rng);
  const int64_t slots = int64_t{total_blocks} * bs;
  for (int64_t slot = 5; slot < slots; slot += 5) {
    const int64_t from = static_cast<int64_t>(rng() % slot);
    for (int32_t e = 0; e < d; ++e) k[slot * d + e] = 1.5f * k[from * d + e];
  }
  const std::vector<uint8_t> k_bytes = Store(k, dtype);
  std::vector<int32_t> score_offsets = {0}, positions;
  for (int32_t t : table_of_head) {
    std::vector<int32_t> pos(lengths[t]);
    std::iota(pos.begin(), pos.end(), 0);
    for (int32_t& p : pos) p = 3 * p + 1;
    std::shuffle(pos.begin(), pos.end(), rng);
    positions.insert(positions.end(), pos.begin(), pos.end());
    score_offsets.push_back(score_offsets.back() + lengths[t]);
  }
  const int32_t items = score_offsets.back();
  std::vector<float> want(items);
  PagedRedundancyScoresCpu(k.data(), tables.data(), lengths.data(), table_of_head.data(),
                           positions.data(), score_offsets.data(), s, want.data());

  DeviceBuffer dk(k_bytes), dt(tables), dl(lengths), dh(table_of_head), dp(positions),
      dso(score_offsets), dout(want.size() * sizeof(float));
  size_t bytes = 0;
  ASSERT_EQ(PagedRedundancyScores(nullptr, &bytes, dk.as<void>(), dtype, dt.as<int32_t>(),
                                  dl.as<int32_t>(), dh.as<int32_t>(), dp.as<int32_t>(),
                                  dso.as<int32_t>(), items, s, dout.as<float>(), nullptr),
            cudaSuccess);
  DeviceBuffer work(bytes);
  ASSERT_EQ(cudaMemset(dout.as<float>(), 0xff, want.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(PagedRedundancyScores(work.as<void>(), &bytes, dk.as<void>(), dtype, dt.as<int32_t>(),
                                  dl.as<int32_t>(), dh.as<int32_t>(), dp.as<int32_t>(),
                                  dso.as<int32_t>(), items, s, dout.as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = ToHost(dout.as<float>(), want.size());
  for (int32_t i = 0; i < items; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-7f + 1e-4f * std::fabs(want[i])) << "item " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RedundancyGpuTest,
                         ::testing::Combine(::testing::Values(32, 128), ::testing::Values(1, 16),
                                            // far from most random pairs' cosines, so that
                                            // rounding rarely moves a pair across it; -0.1:
                                            // the zeroed diagonal is a duplicate candidate
                                            ::testing::Values(0.9f, -0.1f),
                                            ::testing::Values(KvDtype::kFloat32,
                                                              KvDtype::kBFloat16)));

// Argument checks happen on the host: these run without a GPU.
TEST(RedundancyArgsTest, BadShapesAndASmallWorkspaceAreErrors) {
  RedundancyShape s;
  s.num_heads = 1;
  s.head_dim = 0;
  s.block_size = 16;
  size_t bytes = 0;
  EXPECT_EQ(PagedRedundancyScores(nullptr, &bytes, nullptr, KvDtype::kFloat32, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 10, s, nullptr, nullptr),
            cudaErrorInvalidValue);
  s.head_dim = 64;
  EXPECT_EQ(PagedRedundancyScores(nullptr, &bytes, nullptr, static_cast<KvDtype>(6), nullptr,
                                  nullptr, nullptr, nullptr, nullptr, 10, s, nullptr, nullptr),
            cudaErrorInvalidValue);
  ASSERT_EQ(PagedRedundancyScores(nullptr, &bytes, nullptr, KvDtype::kFloat32, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 10, s, nullptr, nullptr),
            cudaSuccess);
  EXPECT_GE(bytes, size_t{10} * 64 * sizeof(float));
  size_t small = bytes - 1;
  int dummy = 0;
  EXPECT_EQ(PagedRedundancyScores(&dummy, &small, nullptr, KvDtype::kFloat32, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 10, s, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

// CUDA paged decode attention against its CPU twin. Skips where no GPU is present.
#include "kernels/paged_attention.h"

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

using gpu_test::HaveGpu;
using gpu_test::ToDevice;

// (head_dim, block_size, group)
class PagedAttentionGpuTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(PagedAttentionGpuTest, MatchesTheCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [d, bs, group] = GetParam();
  const uint32_t seed = d * 10007 + bs * 101 + group;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  PagedAttentionShape s;
  s.rows = 3;
  s.num_kv_heads = 2;
  s.num_heads = 2 * group;
  s.head_dim = d;
  s.block_size = bs;
  const std::vector<int32_t> lengths = {1, 17, 3, 100, 0, 257};  // [rows, kv_heads]
  for (int32_t n : lengths) s.max_blocks = std::max(s.max_blocks, (n + bs - 1) / bs);
  // Every head's blocks are distinct ids in a shuffled pool (block 0 unused).
  int32_t total_blocks = 1;
  for (int32_t n : lengths) total_blocks += (n + bs - 1) / bs;
  std::vector<int32_t> ids(total_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(lengths.size() * s.max_blocks, 0);
  for (size_t h = 0, next = 0; h < lengths.size(); ++h)
    for (int32_t b = 0; b < (lengths[h] + bs - 1) / bs; ++b)
      tables[h * s.max_blocks + b] = ids[next++];
  std::vector<float> k(int64_t{total_blocks} * bs * d), v(k.size()),
      q(int64_t{s.rows} * s.num_heads * d);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The count bias's logit terms, [rows, kv_heads, max_blocks * block_size].
  std::vector<float> bias(lengths.size() * s.max_blocks * bs);
  std::uniform_real_distribution<float> ud(0.0f, 3.0f);
  for (float& x : bias) x = ud(rng);
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with a bias" : "without a bias");
    std::vector<float> want(q.size());
    PagedDecodeAttentionCpu(q.data(), k.data(), v.data(), tables.data(), lengths.data(), s, scale,
                            want.data(), 1, with_bias ? bias.data() : nullptr);
    float *dq = ToDevice(q), *dk = ToDevice(k), *dv = ToDevice(v), *dout = ToDevice(want),
          *db = ToDevice(bias);
    int32_t *dt = ToDevice(tables), *dl = ToDevice(lengths);
    ASSERT_EQ(cudaMemset(dout, 0xff, want.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(
        PagedDecodeAttention(dq, dk, dv, dt, dl, s, scale, dout, nullptr, with_bias ? db : nullptr),
        cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dout, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5f) << "element " << i;
    for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dout, (void*)db, (void*)dt, (void*)dl})
      cudaFree(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionGpuTest,
                         ::testing::Combine(::testing::Values(64, 128), ::testing::Values(1, 8, 16),
                                            ::testing::Values(1, 4, 8)));

TEST(PagedAttentionGpuArgsTest, UnsupportedHeadDimIsAnError) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  PagedAttentionShape s{1, 1, 1, 48, 16, 1};
  EXPECT_EQ(
      PagedDecodeAttention(nullptr, nullptr, nullptr, nullptr, nullptr, s, 1.0f, nullptr, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

// The bandwidth-oriented paged decode attention (one read of K/V per GQA group, fp32/bf16/fp16
// storage, split-KV) against the unchanged CPU twin, fed the cache rounded to the storage
// type. Skips where no GPU is present.
#include "kernels/paged_attention_gqa.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
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

// (head_dim, block_size, group, dtype, splits)
using Param = std::tuple<int, int, int, KvDtype, int>;
class PagedAttentionGqaGpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(PagedAttentionGqaGpuTest, MatchesTheCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [d, bs, group, dtype, splits] = GetParam();
  const uint32_t seed = d * 10007 + bs * 101 + group * 7 + static_cast<int>(dtype) * 3 + splits;
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
  const std::vector<uint8_t> k_bytes = Store(k, dtype), v_bytes = Store(v, dtype);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The count bias's logit terms, [rows, kv_heads, max_blocks * block_size].
  std::vector<float> bias(lengths.size() * s.max_blocks * bs);
  std::uniform_real_distribution<float> ud(0.0f, 3.0f);
  for (float& x : bias) x = ud(rng);
  DeviceBuffer dq(q), dk(k_bytes), dv(v_bytes), dt(tables), dl(lengths), db(bias);
  for (const bool with_bias : {false, true}) {
    SCOPED_TRACE(with_bias ? "with a bias" : "without a bias");
    const float* host_bias = with_bias ? bias.data() : nullptr;
    const float* device_bias = with_bias ? db.as<float>() : nullptr;
    std::vector<float> want(q.size());
    PagedDecodeAttentionCpu(q.data(), k.data(), v.data(), tables.data(), lengths.data(), s, scale,
                            want.data(), 1, host_bias);
    DeviceBuffer dout(want.size() * sizeof(float));
    size_t bytes = 0;
    ASSERT_EQ(PagedDecodeAttentionGqa(nullptr, &bytes, dq.as<float>(), dk.as<void>(), dv.as<void>(),
                                      dtype, dt.as<int32_t>(), dl.as<int32_t>(), s, scale, splits,
                                      dout.as<float>(), nullptr, device_bias),
              cudaSuccess);
    DeviceBuffer work(bytes);
    ASSERT_EQ(cudaMemset(dout.as<float>(), 0xff, want.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(PagedDecodeAttentionGqa(work.as<void>(), &bytes, dq.as<float>(), dk.as<void>(),
                                      dv.as<void>(), dtype, dt.as<int32_t>(), dl.as<int32_t>(), s,
                                      scale, splits, dout.as<float>(), nullptr, device_bias),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = ToHost(dout.as<float>(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5f) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionGqaGpuTest,
                         ::testing::Combine(::testing::Values(32, 64, 128),
                                            ::testing::Values(1, 8, 16), ::testing::Values(1, 4, 8),
                                            ::testing::Values(KvDtype::kFloat32, KvDtype::kBFloat16,
                                                              KvDtype::kFloat16),
                                            ::testing::Values(1, 3)));

// Host-side checks: these run without a GPU.
TEST(PagedAttentionGqaArgsTest, UnsupportedShapesAreErrorsAndSplitsAreBounded) {
  size_t bytes = 0;
  PagedAttentionShape s{1, 12, 4, 128, 16, 1};  // group 3
  EXPECT_EQ(PagedDecodeAttentionGqa(nullptr, &bytes, nullptr, nullptr, nullptr, KvDtype::kBFloat16,
                                    nullptr, nullptr, s, 1.0f, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  s = {1, 8, 8, 96, 16, 1};  // head_dim 96
  EXPECT_EQ(PagedDecodeAttentionGqa(nullptr, &bytes, nullptr, nullptr, nullptr, KvDtype::kFloat32,
                                    nullptr, nullptr, s, 1.0f, 1, nullptr, nullptr),
            cudaErrorInvalidValue);
  // 2,176 tokens (at most 9 splits), 8 kv heads, 132 SMs. The share of the resident slots
  // that t splits keep busy is 8 rows t / (waves x slots).
  s = {1, 32, 8, 128, 16, 136};
  EXPECT_EQ(ChooseNumSplits(s, 132), 9);     // 72 / 264 slots: as many as allowed
  EXPECT_EQ(ChooseNumSplits(s, 132, 8), 9);  // 72 / 1,056
  s.rows = 16;                               // 128 blocks
  EXPECT_EQ(ChooseNumSplits(s, 132, 8), 8);  // 1,024 / 1,056 (9: 1,152 over two waves)
  EXPECT_EQ(ChooseNumSplits(s, 132, 4), 4);  // 512 / 528
  s.rows = 64;                               // 512 blocks
  EXPECT_EQ(ChooseNumSplits(s, 132, 8), 2);  // 1 fills 48 %, 2 fill 97 %
  EXPECT_EQ(ChooseNumSplits(s, 132, 4), 1);  // 512 / 528 already
  s.rows = 256;                              // 2,048 blocks
  EXPECT_EQ(ChooseNumSplits(s, 132), 1);     // 97 % over 8 waves; 9 splits' 99.7 % is within 5 %
  EXPECT_EQ(ChooseNumSplits(s, 132, 8), 1);
  EXPECT_EQ(ChooseNumSplits(s, 0, 8), 1);  // nonsense in, no split
  s.rows = 0;
  EXPECT_EQ(ChooseNumSplits(s, 132, 8), 1);
}

TEST(PagedAttentionGqaOccupancyTest, EveryKernelFitsAtLeastOneBlockPerSm) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFloat16}) {
    for (int32_t head_dim : {32, 64, 128}) {
      for (int32_t group : {1, 2, 4, 8}) {
        const PagedAttentionShape s{4, 8 * group, 8, head_dim, 16, 8};
        int32_t n = 0;
        ASSERT_EQ(GqaBlocksPerSm(s, dtype, &n), cudaSuccess) << head_dim << " " << group;
        EXPECT_GE(n, 1) << head_dim << " " << group;
      }
    }
  }
  int32_t n = 0;
  const PagedAttentionShape bad{4, 24, 8, 128, 16, 8};  // group 3
  EXPECT_EQ(GqaBlocksPerSm(bad, KvDtype::kFloat32, &n), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

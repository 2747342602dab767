// CUDA RoPE rotation of beacons and K/V append against their CPU twins. Skips where no GPU
// is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/append_kv.h"
#include "kernels/rope_rotate.h"
#include "kernels/rope_rotate_cpu.h"
#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::Store;
using gpu_test::ToHost;

class RotateRowsGpuTest : public ::testing::TestWithParam<int> {};

TEST_P(RotateRowsGpuTest, MatchesCoreRope) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const int d = GetParam();
  absl::StatusOr<Rope> rope = Rope::Create({d, 1e6});
  ASSERT_TRUE(rope.ok());
  std::mt19937 rng(d);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<int32_t> positions = {0, 1, 17, 2175, 131071, 1000003};
  const int32_t rows = 37;
  std::vector<int32_t> table_row(rows);
  for (int32_t r = 0; r < rows; ++r) table_row[r] = (r * 5) % positions.size();
  std::vector<float> src(int64_t{rows} * d);
  for (float& x : src) x = nd(rng);
  std::vector<float> table(positions.size() * d), want(src.size());
  RopeAngleTable(*rope, positions.data(), static_cast<int32_t>(positions.size()), table.data());
  RotateRowsCpu(*rope, src.data(), table_row.data(), positions.data(), rows, want.data());

  DeviceBuffer dsrc(src), drow(table_row), dtable(table), dout(src.size() * sizeof(float));
  ASSERT_EQ(RotateRows(dsrc.as<float>(), drow.as<int32_t>(), dtable.as<float>(), rows, d,
                       dout.as<float>(), nullptr),
            cudaSuccess);
  // In place too.
  ASSERT_EQ(RotateRows(dsrc.as<float>(), drow.as<int32_t>(), dtable.as<float>(), rows, d,
                       dsrc.as<float>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = ToHost(dout.as<float>(), src.size());
  const std::vector<float> in_place = ToHost(dsrc.as<float>(), src.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Same table, separately rounded products on both sides: equal unless the host compiler
    // contracted to FMA, which moves the result by an ulp or so.
    ASSERT_NEAR(got[i], want[i], 1e-6f * (1.0f + std::abs(want[i]))) << "element " << i;
    ASSERT_EQ(in_place[i], got[i]) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RotateRowsGpuTest, ::testing::Values(2, 64, 128, 6));

// (block_size, head_dim, storage)
class AppendKvGpuTest : public ::testing::TestWithParam<std::tuple<int, int, KvDtype>> {};

// 16-bit caches: the device's bytes are the twin's float result rounded to nearest even.
TEST_P(AppendKvGpuTest, MatchesTheCpuTwinExactly) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [bs, d, dtype] = GetParam();
  std::mt19937 rng(bs * 1000 + d + 77 * static_cast<int>(dtype));
  std::uniform_real_distribution<float> u(-1, 1);
  // Six heads with lengths before the append; each has room for one more token.
  const std::vector<int32_t> lengths = {0, 1, 16, 17, 100, 7};
  AppendShape s;
  s.head_dim = d;
  s.block_size = bs;
  for (int32_t n : lengths) s.max_blocks = std::max(s.max_blocks, n / bs + 1);
  int32_t total_blocks = 1;
  for (int32_t n : lengths) total_blocks += n / bs + 1;
  std::vector<int32_t> ids(total_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(lengths.size() * s.max_blocks, 0);
  for (size_t t = 0, next = 0; t < lengths.size(); ++t)
    for (int32_t b = 0; b <= lengths[t] / bs; ++b) tables[t * s.max_blocks + b] = ids[next++];
  const std::vector<int32_t> table_of_row = {3, 0, 5, 1, 4};  // table 2 gets nothing
  s.rows = static_cast<int32_t>(table_of_row.size());
  std::vector<float> new_k(int64_t{s.rows} * d), new_v(new_k.size());
  for (float& x : new_k) x = u(rng);
  for (float& x : new_v) x = u(rng);
  std::vector<int32_t> new_pos(s.rows);
  for (int32_t r = 0; r < s.rows; ++r) new_pos[r] = 1000 + 3 * r;
  std::vector<float> k(int64_t{total_blocks} * bs * d), v(k.size());
  std::vector<int32_t> pos(int64_t{total_blocks} * bs);
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  for (int32_t& x : pos) x = static_cast<int32_t>(rng() % 5000);

  const std::vector<uint8_t> k_bytes = Store(k, dtype), v_bytes = Store(v, dtype);
  DeviceBuffer dk(k_bytes), dv(v_bytes), dpos(pos), dnk(new_k), dnv(new_v), dnp(new_pos),
      drow(table_of_row), dt(tables), dl(lengths);
  AppendKvCpu(new_k.data(), new_v.data(), new_pos.data(), table_of_row.data(), tables.data(),
              lengths.data(), s, k.data(), v.data(), pos.data());
  ASSERT_EQ(AppendKv(dnk.as<float>(), dnv.as<float>(), dnp.as<int32_t>(), drow.as<int32_t>(),
                     dt.as<int32_t>(), dl.as<int32_t>(), s, dk.as<void>(), dv.as<void>(), dtype,
                     dpos.as<int32_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost(dk.as<uint8_t>(), k_bytes.size()), Store(k, dtype));
  EXPECT_EQ(ToHost(dv.as<uint8_t>(), v_bytes.size()), Store(v, dtype));
  EXPECT_EQ(ToHost(dpos.as<int32_t>(), pos.size()), pos);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AppendKvGpuTest,
                         ::testing::Combine(::testing::Values(1, 8, 16),
                                            ::testing::Values(64, 128, 3),
                                            ::testing::Values(KvDtype::kFloat32, KvDtype::kBFloat16,
                                                              KvDtype::kFloat16)));

TEST(RopeAppendArgsTest, BadShapesAreErrors) {
  EXPECT_EQ(RotateRows(nullptr, nullptr, nullptr, 1, 7, nullptr, nullptr), cudaErrorInvalidValue);
  AppendShape s{1, 64, 0, 1};
  EXPECT_EQ(AppendKv(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, nullptr, nullptr,
                     KvDtype::kFloat32, nullptr, nullptr),
            cudaErrorInvalidValue);
  s.block_size = 16;
  EXPECT_EQ(AppendKv(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, s, nullptr, nullptr,
                     static_cast<KvDtype>(9), nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

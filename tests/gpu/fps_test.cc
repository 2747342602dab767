// CUDA cosine farthest-point sampling against core's CosineFarthestPointOrder (through its
// CPU twin): the same orderings, bit for bit. Skips where no GPU is present.
#include "kernels/fps.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/fps_cpu.h"
#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::ToHost;

std::vector<int32_t> RunGpu(const std::vector<float>& points, const std::vector<int32_t>& n,
                            const std::vector<int32_t>& count, const FpsShape& shape) {
  DeviceBuffer dp(points), dn(n), dc(count);
  DeviceBuffer scratch(FarthestPointScratchBytes(shape));
  DeviceBuffer dorder(static_cast<size_t>(shape.num_segments) * shape.max_count * 4);
  EXPECT_EQ(FarthestPointOrder(dp.as<float>(), dn.as<int32_t>(), dc.as<int32_t>(), shape,
                               scratch.as<void>(), dorder.as<int32_t>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return ToHost(dorder.as<int32_t>(), static_cast<size_t>(shape.num_segments) * shape.max_count);
}

// (dim, max_points): buffers of many sizes, some with duplicated points (ties), a zero row and
// clusters, as the beacon buffers hold.
class FpsGpuTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(FpsGpuTest, SameOrderingAsCore) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [dim, max_points] = GetParam();
  std::mt19937 rng(dim * 7919 + max_points);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<int32_t> n = {max_points, max_points - 1, 1, 0, 65, 64, max_points / 2, 7};
  FpsShape shape;
  shape.num_segments = static_cast<int32_t>(n.size());
  shape.max_points = max_points;
  shape.dim = dim;
  shape.max_count = max_points;
  std::vector<int32_t> count(n.size());
  for (size_t s = 0; s < n.size(); ++s) count[s] = s % 2 == 0 ? n[s] : n[s] / 2;
  std::vector<float> points(static_cast<size_t>(shape.num_segments) * max_points * dim);
  for (int32_t s = 0; s < shape.num_segments; ++s) {
    std::vector<float> centre(dim);
    for (float& c : centre) c = 3.0f * nd(rng);
    for (int32_t i = 0; i < n[s]; ++i) {
      float* row = points.data() + (static_cast<size_t>(s) * max_points + i) * dim;
      if (i % 11 == 5 && i > 0) {  // a duplicate of the previous point: an exact tie
        std::copy_n(row - dim, dim, row);
      } else if (i == 3) {  // a zero vector: orthogonal to everything
        std::fill_n(row, dim, 0.0f);
      } else if (i == 4) {  // subnormals only: 1 / norm overflows, a zero vector too
        std::fill_n(row, dim, 0.0f);
        row[0] = 1e-40f;
      } else if (i == 6) {  // a NaN and an infinity: a zero vector
        row[0] = std::numeric_limits<float>::quiet_NaN();
        for (int32_t d = 1; d < dim; ++d) row[d] = nd(rng);
        row[dim - 1] = std::numeric_limits<float>::infinity();
      } else {
        for (int32_t d = 0; d < dim; ++d) row[d] = (i % 3 == 0 ? centre[d] : 0.0f) + nd(rng);
      }
    }
  }
  std::vector<int32_t> want(static_cast<size_t>(shape.num_segments) * shape.max_count);
  FarthestPointOrderCpu(points.data(), n.data(), count.data(), shape.num_segments, max_points, dim,
                        shape.max_count, want.data());
  EXPECT_EQ(RunGpu(points, n, count, shape), want);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FpsGpuTest,
                         ::testing::Combine(::testing::Values(32, 64, 128, 3),
                                            ::testing::Values(320, 512, 130)));

TEST(FpsGpuErrorsTest, BadShapeAndBadCounts) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  FpsShape bad;
  bad.num_segments = 1;
  bad.max_points = 8;
  bad.dim = 0;
  bad.max_count = 8;
  EXPECT_EQ(FarthestPointOrder(nullptr, nullptr, nullptr, bad, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  bad.dim = 4;
  bad.max_points = 5000;
  EXPECT_EQ(FarthestPointOrder(nullptr, nullptr, nullptr, bad, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  // count above n (segment 0) and n above max_points (segment 1): rows of -2; segment 2 fine.
  FpsShape shape;
  shape.num_segments = 3;
  shape.max_points = 8;
  shape.dim = 4;
  shape.max_count = 3;
  std::vector<float> points(3 * 8 * 4);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : points) x = nd(rng);
  const std::vector<int32_t> n = {2, 9, 8}, count = {3, 1, 3};
  const std::vector<int32_t> got = RunGpu(points, n, count, shape);
  const std::vector<int32_t> first(got.begin(), got.begin() + 6);
  EXPECT_EQ(first, std::vector<int32_t>(6, -2));
  std::vector<int32_t> want(3);
  const int32_t n2 = 8, c2 = 3;
  FarthestPointOrderCpu(points.data() + 2 * 8 * 4, &n2, &c2, 1, 8, 4, 3, want.data());
  EXPECT_EQ(std::vector<int32_t>(got.begin() + 6, got.end()), want);
}

}  // namespace
}  // namespace beaconkv::kernels

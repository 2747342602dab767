// CUDA segmented top-k against its CPU twin: keep masks must be equal element for element
// (a keep mask is the kept set). Skips where no GPU is present.
#include "kernels/segmented_topk.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::ToHost;

enum class Ties { kFew, kMany };

// Segments of the given lengths: shuffled unique positions (slot order != position order, as
// after compaction), sinks and a recent window protected plus some random protected slots,
// and per-segment k covering 0, 1, all-but-one, exactly all and more than all candidates.
struct Problem {
  std::vector<int32_t> offsets, positions, k;
  std::vector<float> scores;
  std::vector<uint8_t> protect;
  int32_t max_len = 0;
};

Problem MakeProblem(const std::vector<int32_t>& lengths, Ties ties, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Problem p;
  p.offsets.push_back(0);
  for (size_t s = 0; s < lengths.size(); ++s) {
    const int32_t n = lengths[s];
    p.max_len = std::max(p.max_len, n);
    std::vector<int32_t> pos(n);
    int32_t next = static_cast<int32_t>(rng() % 5);
    for (int32_t& x : pos) x = (next += 1 + static_cast<int32_t>(rng() % 3));
    std::vector<uint8_t> prot(n, 0);
    for (int32_t i = 0; i < n; ++i) {
      prot[i] = (i < 4 || i >= n - 8 || rng() % 10 == 0) ? 1 : 0;
    }
    // Shuffle slot order, keeping each token's protection with its position.
    std::vector<int32_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int32_t candidates = 0;
    for (int32_t i = 0; i < n; ++i) {
      p.positions.push_back(pos[perm[i]]);
      p.protect.push_back(prot[perm[i]]);
      candidates += prot[perm[i]] ? 0 : 1;
      float v = u(rng);
      if (ties == Ties::kMany) {
        const int level = static_cast<int>(rng() % 4);  // 0, -0, 0.25, 0.5
        v = level == 0 ? 0.0f : level == 1 ? -0.0f : 0.25f * (level - 1);
      }
      p.scores.push_back(v);
    }
    const int32_t choices[] = {0,
                               1,
                               candidates - 1,
                               candidates,
                               candidates + 5,
                               static_cast<int32_t>(rng() % (candidates + 1))};
    p.k.push_back(std::max(0, choices[(s + seed) % 6]));
    p.offsets.push_back(static_cast<int32_t>(p.positions.size()));
  }
  return p;
}

// A reserved region over the problem: about a third of each segment, and per-segment picks
// of 0, 1, a few and more than k.
struct Region {
  std::vector<uint8_t> mask;
  std::vector<int32_t> k;
};

Region MakeRegion(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  Region r;
  for (size_t i = 0; i < p.scores.size(); ++i) r.mask.push_back(rng() % 3 == 0 ? 1 : 0);
  for (size_t s = 0; s < p.k.size(); ++s) {
    const int32_t choices[] = {0, 1, 4, p.k[s] + 3};
    r.k.push_back(choices[(s + seed) % 4]);
  }
  return r;
}

// shape.penalty.values and shape.reserve, if set, point at host memory: uploaded here.
std::vector<uint8_t> RunGpu(const Problem& p, SegmentedTopKShape shape, TopKAlgorithm algorithm) {
  const size_t n = p.scores.size();
  auto host = [](const auto* v, size_t count) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(v)>>;
    return v == nullptr ? std::vector<T>{} : std::vector<T>(v, v + count);
  };
  DeviceBuffer offsets(p.offsets), scores(p.scores), positions(p.positions), protect(p.protect),
      k(p.k), keep(n), penalty(host(shape.penalty.values, n)), region(host(shape.reserve.mask, n)),
      region_k(host(shape.reserve.k, p.k.size()));
  if (shape.penalty.values != nullptr) shape.penalty.values = penalty.as<float>();
  if (shape.reserve.mask != nullptr) shape.reserve = {region.as<uint8_t>(), region_k.as<int32_t>()};
  size_t bytes = 0;
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, offsets.as<int32_t>(), scores.as<float>(),
                          positions.as<int32_t>(), protect.as<uint8_t>(), k.as<int32_t>(), shape,
                          algorithm, keep.as<uint8_t>(), nullptr),
            cudaSuccess);
  DeviceBuffer temp(bytes);
  EXPECT_EQ(cudaMemset(keep.as<uint8_t>(), 7, p.scores.size()), cudaSuccess);
  EXPECT_EQ(SegmentedTopK(temp.as<void>(), &bytes, offsets.as<int32_t>(), scores.as<float>(),
                          positions.as<int32_t>(), protect.as<uint8_t>(), k.as<int32_t>(), shape,
                          algorithm, keep.as<uint8_t>(), nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return ToHost(keep.as<uint8_t>(), p.scores.size());
}

// (lengths, ties, pooling kernel, algorithm)
using Param = std::tuple<std::vector<int32_t>, Ties, int, TopKAlgorithm>;
class SegmentedTopKGpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(SegmentedTopKGpuTest, KeepMaskMatchesTheCpuTwin) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto& [lengths, ties, pool, algorithm] = GetParam();
  const uint32_t seed = static_cast<uint32_t>(lengths.size() * 7919 + lengths.back() * 31 +
                                              static_cast<int>(ties) * 7 + pool);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Problem p = MakeProblem(lengths, ties, seed);
  // R-KV's redundancy penalty: small values (as a softmax over a head gives) at random.
  std::mt19937 rng(seed + 1);
  std::vector<float> penalty(p.scores.size());
  for (float& x : penalty) x = static_cast<float>(rng() % 1000) * 1e-4f;
  const Region region = MakeRegion(p, seed + 2);
  // 0-2: plain, 3-5: with the penalty, 6-8: with the penalty and a reserved region.
  for (int variant = 0; variant < 9; ++variant) {
    const TopKPooling pooling = variant % 3 == 0   ? TopKPooling::kNone
                                : variant % 3 == 1 ? TopKPooling::kMax
                                                   : TopKPooling::kAvg;
    const bool with_penalty = variant >= 3, with_region = variant >= 6;
    if (pool == 1 && pooling != TopKPooling::kNone) continue;
    SCOPED_TRACE(::testing::Message() << "pooling " << static_cast<int>(pooling) << " penalty "
                                      << with_penalty << " region " << with_region);
    SegmentedTopKShape shape;
    if (with_penalty) shape.penalty = {penalty.data(), 0.3f};
    if (with_region) shape.reserve = {region.mask.data(), region.k.data()};
    shape.num_segments = static_cast<int32_t>(lengths.size());
    shape.num_items = static_cast<int32_t>(p.scores.size());
    shape.max_segment_len = p.max_len;
    shape.pooling = pooling;
    shape.pool_kernel = pool;
    std::vector<uint8_t> want(p.scores.size(), 9);
    SegmentedTopKCpu(p.offsets.data(), p.scores.data(), p.positions.data(), p.protect.data(),
                     p.k.data(), shape, want.data());
    const std::vector<uint8_t> got = RunGpu(p, shape, algorithm);
    for (size_t s = 0; s + 1 < p.offsets.size(); ++s) {
      for (int32_t i = p.offsets[s]; i < p.offsets[s + 1]; ++i) {
        ASSERT_EQ(got[i], want[i])
            << "segment " << s << " element " << i - p.offsets[s] << " k " << p.k[s];
      }
    }
  }
}

const std::vector<std::vector<int32_t>> kLengths = {
    {1}, {17}, {2176}, {1, 17, 0, 3, 2176, 255, 33}, {4096, 1000, 9}};

INSTANTIATE_TEST_SUITE_P(Shapes, SegmentedTopKGpuTest,
                         ::testing::Combine(::testing::ValuesIn(kLengths),
                                            ::testing::Values(Ties::kFew, Ties::kMany),
                                            ::testing::Values(1, 3, 7),
                                            ::testing::Values(TopKAlgorithm::kBlockRadixSort,
                                                              TopKAlgorithm::kSegmentedSort,
                                                              TopKAlgorithm::kBlockRadixSelect)));

TEST(SegmentedTopKGpuLongTest, SegmentsPastOneTileTakeTheSegmentedSortPath) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Problem p = MakeProblem({5000, 17, 9001}, Ties::kMany, 11);
  SegmentedTopKShape shape;
  shape.num_segments = 3;
  shape.num_items = static_cast<int32_t>(p.scores.size());
  shape.max_segment_len = p.max_len;
  shape.pooling = TopKPooling::kMax;
  shape.pool_kernel = 5;
  std::vector<uint8_t> want(p.scores.size());
  SegmentedTopKCpu(p.offsets.data(), p.scores.data(), p.positions.data(), p.protect.data(),
                   p.k.data(), shape, want.data());
  EXPECT_EQ(RunGpu(p, shape, TopKAlgorithm::kAuto), want);
}

// Argument checks happen on the host before any CUDA call: these run without a GPU.
TEST(SegmentedTopKArgsTest, BadShapesAreErrors) {
  size_t bytes = 0;
  SegmentedTopKShape shape;
  shape.pool_kernel = 4;
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          TopKAlgorithm::kAuto, nullptr, nullptr),
            cudaErrorInvalidValue);
  shape.pool_kernel = 1;
  shape.max_segment_len = kMaxBlockTopKSegment + 1;
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          TopKAlgorithm::kBlockRadixSort, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          TopKAlgorithm::kBlockRadixSelect, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          static_cast<TopKAlgorithm>(9), nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(SegmentedTopK(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          TopKAlgorithm::kAuto, nullptr, nullptr),
            cudaErrorInvalidValue);
  // A reserved region without its per-segment picks.
  const uint8_t mask = 1;
  shape.max_segment_len = 1;
  shape.reserve.mask = &mask;
  EXPECT_EQ(SegmentedTopK(nullptr, &bytes, nullptr, nullptr, nullptr, nullptr, nullptr, shape,
                          TopKAlgorithm::kAuto, nullptr, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

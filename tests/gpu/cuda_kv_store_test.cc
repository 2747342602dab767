// CudaKvStore against CpuKvStore: the same copies, moves, positions and swaps give the same
// bytes. Skips where no GPU is present.
#include "kernels/cuda_kv_store.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::Load;
using gpu_test::Store;
using gpu_test::ToHost;

constexpr int32_t kBlocks = 12;

std::vector<int32_t> PositionsOf(const CpuKvStore& s) {
  std::vector<int32_t> out(static_cast<size_t>(s.num_blocks()) * s.block_size());
  for (int32_t b = 0; b < s.num_blocks(); ++b) {
    for (int32_t o = 0; o < s.block_size(); ++o) {
      out[static_cast<size_t>(b) * s.block_size() + o] = s.position({b, o});
    }
  }
  return out;
}

void ExpectSame(const CudaKvStore& dev, const CpuKvStore& ref, const char* after) {
  const size_t elems = static_cast<size_t>(kBlocks) * ref.block_size() * ref.head_dim();
  const size_t bytes = elems * KvDtypeBytes(dev.dtype());
  const std::vector<float> k = Load(ToHost(static_cast<uint8_t*>(dev.keys()), bytes), dev.dtype());
  const std::vector<float> v =
      Load(ToHost(static_cast<uint8_t*>(dev.values()), bytes), dev.dtype());
  EXPECT_EQ(k, std::vector<float>(ref.keys_data(), ref.keys_data() + elems)) << after;
  EXPECT_EQ(v, std::vector<float>(ref.values_data(), ref.values_data() + elems)) << after;
  EXPECT_EQ(ToHost(dev.positions(), static_cast<size_t>(kBlocks) * ref.block_size()),
            PositionsOf(ref))
      << after;
}

// (block_size, head_dim, storage)
class CudaKvStoreTest : public ::testing::TestWithParam<std::tuple<int, int, KvDtype>> {};

// 16-bit stores start from values the storage type represents exactly, so every operation,
// swaps included (float32 on the host), must give the CPU store's values bit for bit.
TEST_P(CudaKvStoreTest, EveryOperationMatchesTheCpuStore) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [bs, d, dtype] = GetParam();
  std::mt19937 rng(bs * 31 + d + 7 * static_cast<int>(dtype));
  std::uniform_real_distribution<float> u(-1, 1);
  const size_t elems = static_cast<size_t>(kBlocks) * bs * d;
  std::vector<float> keys(elems), values(elems);
  for (float& x : keys) x = u(rng);
  for (float& x : values) x = u(rng);
  const std::vector<uint8_t> key_bytes = Store(keys, dtype), value_bytes = Store(values, dtype);
  CpuKvStore ref(kBlocks, bs, d);
  std::copy(keys.begin(), keys.end(), ref.key({0, 0}));  // slots are contiguous
  std::copy(values.begin(), values.end(), ref.value({0, 0}));
  for (int32_t b = 0; b < kBlocks; ++b) {
    for (int32_t o = 0; o < bs; ++o) ref.SetPosition({b, o}, b * 1000 + o);
  }
  DeviceBuffer dk(key_bytes), dv(value_bytes), dp(PositionsOf(ref));
  CudaKvStore dev(dk.as<void>(), dv.as<void>(), dp.as<int32_t>(), kBlocks, bs, d, dtype);
  ExpectSame(dev, ref, "upload");

  const std::vector<BlockCopy> copies = {{1, 5}, {2, 7}, {0, 11}};
  ref.CopyBlocks(copies);
  dev.CopyBlocks(copies);
  ExpectSame(dev, ref, "CopyBlocks");

  // Compaction-style moves: tail slots of blocks 3..4 into holes of block 6 and 3 (no move
  // reads a slot another writes).
  std::vector<SlotMove> moves(bs + (bs > 1 ? 1 : 0));
  for (int32_t o = 0; o < bs; ++o) moves[o] = {{4, o}, {6, bs - 1 - o}};
  if (bs > 1) moves[bs] = {{3, bs - 1}, {3, 0}};
  ref.MoveSlots(moves);
  dev.MoveSlots(moves);
  ExpectSame(dev, ref, "MoveSlots");

  ref.SetPosition({9, bs - 1}, 424242);
  dev.SetPosition({9, bs - 1}, 424242);
  ExpectSame(dev, ref, "SetPosition");

  // Swap out to two host stores (one per side): the same bytes land; then swap back in to
  // other blocks.
  CpuKvStore host_ref(4, bs, d), host_dev(4, bs, d);
  const std::vector<BlockCopy> out = {{6, 0}, {9, 3}, {3, 1}};
  ref.SwapOut(out, host_ref);
  dev.SwapOut(out, host_dev);
  const size_t host_elems = static_cast<size_t>(4) * bs * d;
  EXPECT_TRUE(
      std::equal(host_dev.keys_data(), host_dev.keys_data() + host_elems, host_ref.keys_data()));
  EXPECT_TRUE(std::equal(host_dev.values_data(), host_dev.values_data() + host_elems,
                         host_ref.values_data()));
  EXPECT_EQ(PositionsOf(host_dev), PositionsOf(host_ref));
  const std::vector<BlockCopy> in = {{0, 8}, {3, 10}, {1, 2}};
  ref.SwapIn(in, host_ref);
  dev.SwapIn(in, host_ref);
  ExpectSame(dev, ref, "SwapIn");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaKvStoreTest,
                         ::testing::Combine(::testing::Values(1, 8, 16), ::testing::Values(64, 128),
                                            ::testing::Values(KvDtype::kFloat32, KvDtype::kBFloat16,
                                                              KvDtype::kFloat16)));

}  // namespace
}  // namespace beaconkv::kernels

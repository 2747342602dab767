// GPU kernels against their CPU twin (CpuKvStore). Skips where no GPU is present.
#include "kernels/cache_ops.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "block_manager/kv_store.h"
#include "tests/gpu/gpu_test_util.h"

namespace beaconkv {
namespace {

using gpu_test::HaveGpu;
using gpu_test::Load;
using gpu_test::Store;
using gpu_test::ToDevice;
using kernels::KvDtype;

template <typename T>
std::vector<T> ToHost(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

struct Shape {
  int block_size, head_dim;
};
class CacheOpsGpuTest : public ::testing::TestWithParam<std::tuple<Shape, KvDtype>> {};

// 16-bit caches hold values the CPU store holds exactly (rounded before), so the moved bits
// read back as the CPU store's floats.
TEST_P(CacheOpsGpuTest, MoveSlotsAndCopyBlocksMatchTheCpuStore) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [shape, dtype] = GetParam();
  const auto [bs, d] = shape;
  const int num_blocks = 37;
  CpuKvStore cpu(num_blocks, bs, d);
  std::mt19937 rng(bs * 1000 + d + 31 * static_cast<int>(dtype));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> k(num_blocks * bs * d), v(k.size());
  for (float& x : k) x = u(rng);
  for (float& x : v) x = u(rng);
  const std::vector<uint8_t> k_bytes = Store(k, dtype), v_bytes = Store(v, dtype);
  std::vector<int32_t> pos(num_blocks * bs);
  for (int b = 0; b < num_blocks; ++b)
    for (int s = 0; s < bs; ++s) {
      const SlotRef slot{b, s};
      std::copy_n(k.begin() + (b * bs + s) * d, d, cpu.key(slot));
      std::copy_n(v.begin() + (b * bs + s) * d, d, cpu.value(slot));
      cpu.SetPosition(slot, static_cast<int32_t>(rng() % 100000));
      pos[b * bs + s] = cpu.position(slot);
    }
  // Disjoint sources and destinations, as a compaction plan guarantees.
  std::vector<int32_t> slots(num_blocks * bs);
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
  std::shuffle(slots.begin(), slots.end(), rng);
  const int moves = static_cast<int>(slots.size() / 3);
  std::vector<int32_t> from(slots.begin(), slots.begin() + moves),
      to(slots.begin() + moves, slots.begin() + 2 * moves);
  std::vector<SlotMove> cpu_moves;
  for (int i = 0; i < moves; ++i)
    cpu_moves.push_back({{from[i] / bs, from[i] % bs}, {to[i] / bs, to[i] % bs}});
  const std::vector<BlockCopy> copies = {{3, 30}, {5, 31}, {1, 36}};
  std::vector<int32_t> csrc, cdst;
  for (auto c : copies) csrc.push_back(c.src), cdst.push_back(c.dst);

  uint8_t *dk = ToDevice(k_bytes), *dv = ToDevice(v_bytes);
  int32_t *dp = ToDevice(pos), *dfrom = ToDevice(from), *dto = ToDevice(to);
  int32_t *dsrc = ToDevice(csrc), *ddst = ToDevice(cdst);
  ASSERT_EQ(kernels::MoveSlots(dfrom, dto, moves, dk, dv, dtype, dp, d, nullptr), cudaSuccess);
  ASSERT_EQ(kernels::CopyBlocks(dsrc, ddst, 3, dk, dv, dtype, dp, bs, d, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cpu.MoveSlots(cpu_moves);
  cpu.CopyBlocks(copies);
  const auto gk = Load(ToHost(dk, k_bytes.size()), dtype);
  const auto gv = Load(ToHost(dv, v_bytes.size()), dtype);
  const auto gp = ToHost(dp, pos.size());
  for (int b = 0; b < num_blocks; ++b)
    for (int s = 0; s < bs; ++s) {
      const SlotRef slot{b, s};
      ASSERT_EQ(gp[b * bs + s], cpu.position(slot));
      for (int i = 0; i < d; ++i) {
        ASSERT_EQ(gk[(b * bs + s) * d + i], cpu.key(slot)[i]);
        ASSERT_EQ(gv[(b * bs + s) * d + i], cpu.value(slot)[i]);
      }
    }
  for (void* p :
       {(void*)dk, (void*)dv, (void*)dp, (void*)dfrom, (void*)dto, (void*)dsrc, (void*)ddst})
    cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CacheOpsGpuTest,
                         ::testing::Combine(::testing::Values(Shape{1, 64}, Shape{8, 128},
                                                              Shape{16, 64}, Shape{16, 128},
                                                              Shape{3, 17}),
                                            ::testing::Values(KvDtype::kFloat32, KvDtype::kBFloat16,
                                                              KvDtype::kFloat16)));

TEST(CacheOpsArgsTest, AnUnknownStorageTypeIsAnError) {
  const KvDtype bad = static_cast<KvDtype>(5);
  EXPECT_EQ(kernels::MoveSlots(nullptr, nullptr, 1, nullptr, nullptr, bad, nullptr, 64, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      kernels::CopyBlocks(nullptr, nullptr, 1, nullptr, nullptr, bad, nullptr, 16, 64, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv

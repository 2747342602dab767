// CUDA keep mask -> compaction moves against the CPU twin (block_manager's PlanHeadCompaction),
// and the moves applied against CpuKvStore. Exact. Skips where no GPU is present.
#include "kernels/compaction_moves.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "block_manager/kv_store.h"
#include "tests/gpu/gpu_test_util.h"

namespace beaconkv::kernels {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::HaveGpu;
using gpu_test::Load;
using gpu_test::Store;
using gpu_test::ToHost;

// (block_size, head_dim)
class CompactionMovesGpuTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(CompactionMovesGpuTest, MovesAndTheirEffectMatchTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto [bs, d] = GetParam();
  const uint32_t seed = bs * 1000 + d;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Segment lengths and keep patterns: all kept, none kept, random halves, only the tail,
  // only the head, one token; segments read their tables in a scrambled order.
  const std::vector<int32_t> lengths = {0, 1, 17, 100, 2176, 300, 64, 257};
  const std::vector<int32_t> table_of_segment = {7, 1, 2, 3, 4, 5, 6, 0};
  CompactionShape s;
  s.num_segments = static_cast<int32_t>(lengths.size());
  s.block_size = bs;
  std::vector<int32_t> table_len(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) table_len[table_of_segment[i]] = lengths[i];
  for (int32_t n : lengths) s.max_blocks = std::max(s.max_blocks, (n + bs - 1) / bs);
  int32_t total_blocks = 1;
  for (int32_t n : lengths) total_blocks += (n + bs - 1) / bs;
  std::vector<int32_t> ids(total_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(lengths.size() * s.max_blocks, 0);
  for (size_t t = 0, next = 0; t < lengths.size(); ++t)
    for (int32_t b = 0; b < (table_len[t] + bs - 1) / bs; ++b)
      tables[t * s.max_blocks + b] = ids[next++];
  std::vector<int32_t> offsets = {0};
  std::vector<uint8_t> keep;
  for (size_t seg = 0; seg < lengths.size(); ++seg) {
    const int32_t n = lengths[seg];
    for (int32_t i = 0; i < n; ++i) {
      switch (seg % 6) {
        case 0:
          keep.push_back(1);
          break;
        case 1:
          keep.push_back(0);
          break;
        case 2:
          keep.push_back(rng() % 2);
          break;
        case 3:
          keep.push_back(i >= n / 3 ? 1 : 0);
          break;
        case 4:
          keep.push_back(rng() % 16 != 0 ? 1 : 0);
          break;  // an eviction's 1 in 16
        default:
          keep.push_back(i < n / 2 ? 1 : 0);
          break;
      }
    }
    offsets.push_back(static_cast<int32_t>(keep.size()));
  }
  s.num_items = offsets.back();
  std::vector<int32_t> from(s.num_items, -1), to(s.num_items, -1), moves(s.num_segments),
      new_len(s.num_segments);
  CompactionMovesCpu(offsets.data(), keep.data(), table_of_segment.data(), tables.data(), s,
                     from.data(), to.data(), moves.data(), new_len.data());

  DeviceBuffer doff(offsets), dkeep(keep), dseg(table_of_segment), dtab(tables),
      dfrom(std::vector<int32_t>(s.num_items, -1)), dto(std::vector<int32_t>(s.num_items, -1)),
      dmoves(moves), dlen(new_len);
  ASSERT_EQ(cudaMemset(dmoves.as<int32_t>(), 0xff, moves.size() * 4), cudaSuccess);
  ASSERT_EQ(CompactionMoves(doff.as<int32_t>(), dkeep.as<uint8_t>(), dseg.as<int32_t>(),
                            dtab.as<int32_t>(), s, dfrom.as<int32_t>(), dto.as<int32_t>(),
                            dmoves.as<int32_t>(), dlen.as<int32_t>(), nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ToHost(dmoves.as<int32_t>(), moves.size()), moves);
  EXPECT_EQ(ToHost(dlen.as<int32_t>(), new_len.size()), new_len);
  const std::vector<int32_t> got_from = ToHost(dfrom.as<int32_t>(), from.size());
  const std::vector<int32_t> got_to = ToHost(dto.as<int32_t>(), to.size());
  for (int32_t seg = 0; seg < s.num_segments; ++seg) {
    for (int32_t m = 0; m < moves[seg]; ++m) {
      ASSERT_EQ(got_from[offsets[seg] + m], from[offsets[seg] + m]) << "segment " << seg;
      ASSERT_EQ(got_to[offsets[seg] + m], to[offsets[seg] + m]) << "segment " << seg;
    }
  }

  // Applying them: the device store against CpuKvStore given the same moves, for every
  // storage type (16-bit caches hold values rounded before, which the CPU store holds too).
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> k0(int64_t{total_blocks} * bs * d), v0(k0.size());
  std::vector<int32_t> pos(int64_t{total_blocks} * bs);
  for (size_t i = 0; i < k0.size(); ++i) k0[i] = u(rng), v0[i] = u(rng);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i * 3 + 1);
  std::vector<SlotMove> slot_moves;
  for (int32_t seg = 0; seg < s.num_segments; ++seg) {
    for (int32_t m = 0; m < moves[seg]; ++m) {
      const int32_t f = from[offsets[seg] + m], t = to[offsets[seg] + m];
      slot_moves.push_back({{f / bs, f % bs}, {t / bs, t % bs}});
    }
  }
  for (KvDtype dtype : {KvDtype::kFloat32, KvDtype::kBFloat16, KvDtype::kFloat16}) {
    SCOPED_TRACE(KvDtypeName(dtype));
    std::vector<float> k = k0, v = v0;
    const std::vector<uint8_t> k_bytes = Store(k, dtype), v_bytes = Store(v, dtype);
    CpuKvStore cpu(total_blocks, bs, d);
    for (int32_t b = 0; b < total_blocks; ++b) {
      for (int32_t o = 0; o < bs; ++o) {
        const int64_t slot = int64_t{b} * bs + o;
        std::copy_n(k.data() + slot * d, d, cpu.key({b, o}));
        std::copy_n(v.data() + slot * d, d, cpu.value({b, o}));
        cpu.SetPosition({b, o}, pos[slot]);
      }
    }
    cpu.MoveSlots(slot_moves);
    DeviceBuffer dk(k_bytes), dv(v_bytes), dpos(pos);
    ASSERT_EQ(ApplyCompactionMoves(doff.as<int32_t>(), dfrom.as<int32_t>(), dto.as<int32_t>(),
                                   dmoves.as<int32_t>(), s.num_segments, dk.as<void>(),
                                   dv.as<void>(), dtype, dpos.as<int32_t>(), d, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got_k = Load(ToHost(dk.as<uint8_t>(), k_bytes.size()), dtype);
    const std::vector<float> got_v = Load(ToHost(dv.as<uint8_t>(), v_bytes.size()), dtype);
    const std::vector<int32_t> got_pos = ToHost(dpos.as<int32_t>(), pos.size());
    EXPECT_TRUE(std::equal(got_k.begin(), got_k.end(), cpu.keys_data()));
    EXPECT_TRUE(std::equal(got_v.begin(), got_v.end(), cpu.values_data()));
    for (int32_t b = 0; b < total_blocks; ++b)
      for (int32_t o = 0; o < bs; ++o) ASSERT_EQ(got_pos[b * bs + o], cpu.position({b, o}));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CompactionMovesGpuTest,
                         ::testing::Combine(::testing::Values(1, 8, 16),
                                            ::testing::Values(64, 128, 3)));

TEST(CompactionMovesArgsTest, BadShapesAreErrors) {
  CompactionShape s{1, 1, 0, 1};
  EXPECT_EQ(CompactionMoves(nullptr, nullptr, nullptr, nullptr, s, nullptr, nullptr, nullptr,
                            nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyCompactionMoves(nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr,
                                 KvDtype::kFloat32, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(ApplyCompactionMoves(nullptr, nullptr, nullptr, nullptr, 1, nullptr, nullptr,
                                 static_cast<KvDtype>(4), nullptr, 64, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace beaconkv::kernels

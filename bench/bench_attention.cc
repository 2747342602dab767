// The CPU paged decode attention (the engine's and the vLLM backend's decode path) on the
// shape of a compressed batch: rows x 2 kv heads (GQA 2, head_dim 32), `tokens` slots per head
// in blocks of 16 scattered over a 16 MiB pool (as the vLLM benchmark's pool), one layer.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/paged_attention_cpu.h"

namespace beaconkv::kernels {
namespace {

void BM_PagedDecodeAttention(benchmark::State& bench) {
  const auto rows = static_cast<int32_t>(bench.range(0));
  const auto tokens = static_cast<int32_t>(bench.range(1));
  constexpr int32_t kHeads = 4, kKvHeads = 2, kDim = 32, kBlock = 16;
  constexpr int32_t kPoolBlocks = 4031;  // 16 MiB of K, V and positions
  PagedAttentionShape s{rows, kHeads, kKvHeads, kDim, kBlock, (tokens + kBlock - 1) / kBlock};
  std::mt19937 rng(1);
  std::vector<int32_t> ids(kPoolBlocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(rows) * kKvHeads * s.max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = ids[i % kPoolBlocks];
  std::vector<int32_t> lengths(static_cast<size_t>(rows) * kKvHeads, tokens);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(kPoolBlocks) * kBlock * kDim), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  std::vector<float> q(static_cast<size_t>(rows) * kHeads * kDim), out(q.size());
  for (float& x : q) x = normal(rng);
  for (auto _ : bench) {
    PagedDecodeAttentionCpu(q.data(), k.data(), v.data(), tables.data(), lengths.data(), s, 0.18f,
                            out.data(), 1);
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_PagedDecodeAttention)
    ->ArgNames({"rows", "tokens"})
    ->Args({64, 128})
    ->Args({16, 1024})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace beaconkv::kernels

BENCHMARK_MAIN();

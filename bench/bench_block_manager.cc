// Block manager costs at Qwen3-4B's KV shape (36 layers x 8 kv_heads, block size 16).
// Run: build/<dir>/bench/bench_block_manager --benchmark_repetitions=5
//        --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "block_manager/block_manager.h"

namespace beaconkv {
namespace {

constexpr int kLayers = 36, kKvHeads = 8, kBlockSize = 16, kHeads = kLayers * kKvHeads;

void BM_TakeGiveBackOneBlock(benchmark::State& state) {
  BlockPool pool(1 << 16);
  for (auto _ : state) {
    const BlockId b = pool.TakeReserved();
    benchmark::DoNotOptimize(b);
    pool.Release(b);
  }
}
BENCHMARK(BM_TakeGiveBackOneBlock);

// One decode step's bookkeeping for a running batch: every sequence appends one token to
// each of its 288 heads and receives the slot each head writes (what the attention kernel
// needs). Metadata only: no K/V bytes move here.
void BM_DecodeStepBookkeeping(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int prompt = 512, max_steps = 512;
  BlockManagerConfig c;
  c.shape = {kLayers, kKvHeads, 128, kBlockSize};
  c.num_blocks = 1 + batch * kHeads * ((prompt + max_steps) / kBlockSize);
  auto bm = *BlockManager::Create(c, nullptr);
  auto reset = [&] {
    for (int s = 0; s < batch; ++s) {
      if (bm->HasSequence(s)) (void)bm->FreeSequence(s);
      (void)bm->AddSequence(s, prompt);
    }
  };
  reset();
  std::vector<SlotRef> slots(static_cast<size_t>(batch) * kHeads);
  int steps = 0;
  for (auto _ : state) {
    if (steps == max_steps) {
      state.PauseTiming();
      reset();
      steps = 0;
      state.ResumeTiming();
    }
    for (int s = 0; s < batch; ++s) {
      absl::Status st = bm->AppendToken(s, absl::MakeSpan(slots.data() + s * kHeads, kHeads));
      if (!st.ok()) state.SkipWithError("append failed");
    }
    benchmark::ClobberMemory();
    ++steps;
  }
  state.counters["head_appends_per_s"] = benchmark::Counter(
      static_cast<double>(batch) * kHeads, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeStepBookkeeping)->Arg(256)->Unit(benchmark::kMicrosecond);

// Applying keep-sets that evict `evict` of 2,176 tokens in every head of one sequence.
// range(1) = 1 also moves the K/V bytes (head_dim 128, float32) in a host store.
void BM_ApplyKeepSets(benchmark::State& state) {
  const int tokens = 2176, evict = static_cast<int>(state.range(0));
  const bool with_store = state.range(1) != 0;
  BlockManagerConfig c;
  c.shape = {kLayers, kKvHeads, 128, kBlockSize};
  c.num_blocks = 1 + kHeads * (tokens / kBlockSize);
  std::unique_ptr<CpuKvStore> store;
  if (with_store) store = std::make_unique<CpuKvStore>(c.num_blocks, kBlockSize, 128);
  auto bm = *BlockManager::Create(c, store.get());
  std::mt19937 rng(7);
  std::vector<KeepSet> keep(kHeads);
  for (int h = 0; h < kHeads; ++h) {
    std::vector<int32_t> all(tokens);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(tokens - evict);
    keep[h] = {h / kKvHeads, h % kKvHeads, all};
  }
  int64_t moved = 0, freed = 0;
  for (auto _ : state) {
    state.PauseTiming();
    if (bm->HasSequence(1)) (void)bm->FreeSequence(1);
    (void)bm->AddSequence(1, tokens);
    state.ResumeTiming();
    absl::StatusOr<CompactionPlan> plan = bm->ApplyKeepSets(1, keep);
    if (!plan.ok()) state.SkipWithError("compaction failed");
    moved = plan->moves.size();
    freed = plan->blocks_freed;
  }
  state.counters["slots_moved"] = static_cast<double>(moved);
  state.counters["blocks_freed"] = static_cast<double>(freed);
}
BENCHMARK(BM_ApplyKeepSets)->Args({128, 0})->Args({128, 1})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace beaconkv

BENCHMARK_MAIN();

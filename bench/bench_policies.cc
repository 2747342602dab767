// One compression event of snapkv, rkv and beacon at Qwen3-4B's shape: 36 layers, 8 kv heads
// (32 query heads, GQA 4), head_dim 128, 2,176 cached tokens per head (budget 2,048 +
// interval 128), 32 observation queries per query head (snapkv/rkv: window 32; beacon: 16
// recent + 16 beacons). An event compresses every head of every layer. Fixed seeds.
// bench/numpy_policy_bench.py runs this program and a NumPy implementation of the same math
// in one run and prints the ratios (docs/policies.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/beacon_bank.h"
#include "core/policy.h"
#include "core/scoring.h"

namespace beaconkv {
namespace {

constexpr int32_t kLayers = 36, kKvHeads = 8, kGroup = 4, kHeadDim = 128;
constexpr int32_t kTokens = 2176, kBudget = 2048, kPrompt = 64;

struct EventData {
  std::vector<float> keys;         // [layers, kv_heads, tokens, head_dim]
  std::vector<int32_t> positions;  // [tokens]
};

const EventData& Data() {
  static const EventData* data = [] {
    auto* d = new EventData;
    std::mt19937 rng(20260904);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    d->keys.resize(static_cast<size_t>(kLayers) * kKvHeads * kTokens * kHeadDim);
    for (float& x : d->keys) x = dist(rng);
    for (int32_t p = 0; p < kTokens; ++p) d->positions.push_back(p);
    return d;
  }();
  return *data;
}

PolicyConfig ConfigFor(const std::string& name) {
  if (name == "snapkv") {
    SnapKvConfig c;
    c.budget = kBudget;
    c.window = 32;
    return c;
  }
  if (name == "rkv") {
    RkvConfig c;
    c.budget = kBudget;
    c.window = 32;
    return c;
  }
  BeaconConfig c;  // defaults: 48 recent + 256 beacons, buffer 512 -> 256
  c.budget = kBudget;
  return c;
}

std::unique_ptr<PolicyState> ObservedState(const std::string& name) {
  PolicyGeometry geo{kLayers, kKvHeads, kGroup, {kHeadDim, 1e6}};
  auto state = NewPolicyState(ConfigFor(name), geo, kPrompt);
  if (!state.ok()) {
    std::fprintf(stderr, "%s\n", std::string(state.status().message()).c_str());
    std::abort();
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // 100 decode steps: fills the rings (48 steps) and puts 400 queries into every beacon
  // buffer (below buffer_max 512: beacons are the first 256 points of an FPS over 400).
  std::vector<float> pre(kGroup * kHeadDim), post(kGroup * kHeadDim);
  for (int32_t s = 0; s < 100; ++s) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (float& x : pre) x = dist(rng);
        for (float& x : post) x = dist(rng);
        absl::Status st =
            (*state)->Observe(l, h, {kTokens - 100 + s, pre.data(), post.data()}, nullptr);
        if (!st.ok()) std::abort();
      }
    }
  }
  return *std::move(state);
}

void BM_CompressionEvent(benchmark::State& bench, const std::string& name) {
  const EventData& data = Data();
  std::unique_ptr<PolicyState> state = ObservedState(name);
  std::vector<int32_t> due(kKvHeads);
  for (int32_t h = 0; h < kKvHeads; ++h) due[h] = h;
  std::vector<HeadKeys> heads(kKvHeads);
  int64_t kept = 0;
  for (auto _ : bench) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t h = 0; h < kKvHeads; ++h) {
        heads[h] = {data.keys.data() + (static_cast<size_t>(l) * kKvHeads + h) * kTokens * kHeadDim,
                    data.positions.data(), kTokens};
      }
      auto keep = state->Compress(l, heads, due, kTokens - 1);
      if (!keep.ok()) std::abort();
      kept = static_cast<int64_t>((*keep)[0].slots.size());
      benchmark::DoNotOptimize(keep->data());
    }
  }
  bench.counters["kept_per_head"] = static_cast<double>(kept);
  bench.counters["state_MiB_per_seq"] = static_cast<double>(state->StateBytes()) / (1 << 20);
  bench.counters["heads"] = kLayers * kKvHeads;
}

BENCHMARK_CAPTURE(BM_CompressionEvent, snapkv, std::string("snapkv"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CompressionEvent, rkv, std::string("rkv"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_CompressionEvent, beacon, std::string("beacon"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

// The per-decode-step cost the engine pays to feed beacon: one Observe per (layer, kv_head)
// (recent ring + query buffer append), with the FPS reductions (256 -> 64 every 48 steps at
// GQA 4) amortised over the iterations.
void BM_BeaconObserveStep(benchmark::State& bench) {
  PolicyGeometry geo{kLayers, kKvHeads, kGroup, {kHeadDim, 1e6}};
  auto state = NewPolicyState(ConfigFor("beacon"), geo, kPrompt);
  if (!state.ok()) std::abort();
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> queries(static_cast<size_t>(kLayers) * kKvHeads * kGroup * kHeadDim);
  for (float& x : queries) x = dist(rng);
  int32_t position = kPrompt;
  for (auto _ : bench) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (int32_t h = 0; h < kKvHeads; ++h) {
        const float* q =
            queries.data() + (static_cast<size_t>(l) * kKvHeads + h) * kGroup * kHeadDim;
        if (!(*state)->Observe(l, h, {position, q, q}, nullptr).ok()) std::abort();
      }
    }
    ++position;
  }
}

BENCHMARK(BM_BeaconObserveStep)->Unit(benchmark::kMicrosecond)->Iterations(480);

// BeaconKV's scoring of one head: `rows` observation rows (recent queries + beacons) against
// `n` keys, max over rows of the softmax probability. The last `blurred` rows have their six
// fastest RoPE pairs zeroed, as blurred beacon rows (blur_speed = 0.02 on the tiny reasoners).
// bf16 = 1: products of bfloat16 inputs (score_bf16, beacon's default).
void BM_AttentionScores(benchmark::State& bench) {
  const auto rows = static_cast<int32_t>(bench.range(0));
  const auto n = static_cast<int32_t>(bench.range(1));
  const auto d = static_cast<int32_t>(bench.range(2));
  const auto blurred = static_cast<int32_t>(bench.range(3));
  const bool bf16 = bench.range(4) != 0;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> keys(static_cast<size_t>(n) * d), queries(static_cast<size_t>(rows) * d);
  for (float& x : keys) x = dist(rng);
  for (float& x : queries) x = dist(rng);
  for (int32_t r = rows - blurred; r < rows; ++r) {
    float* row = queries.data() + static_cast<size_t>(r) * d;
    std::fill_n(row, std::min(6, d / 2), 0.0f);
    std::fill_n(row + d / 2, std::min(6, d / 2), 0.0f);
  }
  std::vector<float> out(n);
  ScoreScratch scratch;
  for (auto _ : bench) {
    AttentionScores(keys.data(), 0, n, d, queries.data(), rows, 1,
                    {GqaReduction::kMaxProbs, QueryReduction::kMax, bf16}, out.data(), &scratch);
    benchmark::DoNotOptimize(out.data());
  }
}

BENCHMARK(BM_AttentionScores)
    ->ArgNames({"rows", "keys", "dim", "blurred", "bf16"})
    ->Args({352, 128, 32, 0, 0})
    ->Args({352, 160, 32, 0, 1})
    ->Args({352, 256, 32, 0, 0})
    ->Args({352, 257, 32, 0, 0})
    ->Args({480, 256, 32, 128, 0})
    ->Args({448, 2176, 128, 0, 0})
    ->Unit(benchmark::kMicrosecond);

// One cosine FPS (the beacon buffer's reduction and beacon draw): points, head_dim, picks.
void BM_Fps(benchmark::State& bench) {
  const auto n = static_cast<int32_t>(bench.range(0));
  const auto d = static_cast<int32_t>(bench.range(1));
  const auto count = static_cast<int32_t>(bench.range(2));
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> pts(static_cast<size_t>(n) * d);
  for (float& x : pts) x = dist(rng);
  for (auto _ : bench) {
    benchmark::DoNotOptimize(CosineFarthestPointOrder(pts.data(), n, d, count));
  }
}

BENCHMARK(BM_Fps)
    ->ArgNames({"n", "dim", "picks"})
    ->Args({512, 32, 256})
    ->Args({320, 32, 256})
    ->Args({512, 32, 2})
    ->Args({512, 128, 256})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace beaconkv

BENCHMARK_MAIN();

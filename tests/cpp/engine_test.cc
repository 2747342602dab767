// The engine on a small random Llama model built in memory: scheduling, preemption,
// eviction and sampling invariants (numerics against NumPy are in tests/python).
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <tuple>

#include "tests/cpp/random_model.h"

namespace beaconkv {
namespace {

using test_model::RandomModel;

std::vector<std::vector<int32_t>> Prompts() {
  return {{1, 5, 7, 9, 2, 4}, {3, 3, 8}, {11, 12, 13, 14, 15, 16, 17, 18, 19}, {6}, {20, 21}};
}

// Runs every prompt with greedy decoding; returns outputs by request id.
std::map<int64_t, RequestOutput> RunAll(EngineConfig config, int32_t max_new = 40,
                                        EngineStats* stats = nullptr,
                                        std::vector<std::vector<int32_t>> prompts = Prompts(),
                                        float temperature = 0.0f) {
  config.verify_integrity = true;
  auto engine = Engine::Create(RandomModel(7), config);
  EXPECT_TRUE(engine.ok()) << engine.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = static_cast<int64_t>(i);
    r.prompt = prompts[i];
    r.sampling.max_new_tokens = max_new;
    r.sampling.temperature = temperature;
    r.sampling.seed = 99;
    EXPECT_TRUE((*engine)->AddRequest(r).ok());
  }
  absl::StatusOr<std::vector<RequestOutput>> outs = (*engine)->RunToCompletion();
  EXPECT_TRUE(outs.ok()) << outs.status();
  EXPECT_EQ((*engine)->block_manager().NumFreeBlocks(),
            (*engine)->block_manager().NumUsableBlocks())
      << "blocks leaked";
  if (stats != nullptr) *stats = (*engine)->stats();
  std::map<int64_t, RequestOutput> by_id;
  for (RequestOutput& o : *outs) by_id[o.id] = std::move(o);
  return by_id;
}

std::vector<std::vector<int32_t>> Tokens(const std::map<int64_t, RequestOutput>& outs) {
  std::vector<std::vector<int32_t>> v;
  for (const auto& [id, o] : outs) v.push_back(o.output);
  return v;
}

BeaconConfig SmallBeacon() {
  BeaconConfig b;
  b.budget = 12;
  b.interval = 4;
  b.n_recent = 2;
  b.n_beacons = 2;
  b.buffer_max = 8;
  b.buffer_min = 4;
  b.protect_prompt = false;
  return b;
}

TEST(EngineTest, GreedyOutputsDoNotDependOnBatchOrBlockSize) {
  EngineConfig c;
  c.block_size = 16;
  const auto batched = Tokens(RunAll(c));
  for (int32_t bs : {1, 3, 8}) {
    c.block_size = bs;
    c.max_batch = 1;  // one at a time
    EXPECT_EQ(Tokens(RunAll(c)), batched) << "block_size " << bs;
  }
}

class PreemptionTest : public ::testing::TestWithParam<bool /*beacon*/> {};

TEST_P(PreemptionTest, SwapIsExact) {
  EngineConfig c;
  c.block_size = 4;
  if (GetParam()) c.policy = SmallBeacon();
  EngineStats free_stats;
  const auto free = RunAll(c, 40, &free_stats);
  c.num_blocks = 1 + free_stats.peak_used_blocks / 2;
  c.preemption = PreemptionMode::kSwap;
  EngineStats stats;
  const auto squeezed = RunAll(c, 40, &stats);
  EXPECT_GT(stats.preemptions_swap, 0);
  EXPECT_EQ(Tokens(squeezed), Tokens(free));
}

INSTANTIATE_TEST_SUITE_P(FullAndBeacon, PreemptionTest, ::testing::Bool());

TEST(EngineTest, RecomputeIsExactForTheFullCache) {
  EngineConfig c;
  c.block_size = 4;
  EngineStats free_stats;
  const auto free = RunAll(c, 40, &free_stats);
  c.num_blocks = 1 + free_stats.peak_used_blocks / 2;
  c.preemption = PreemptionMode::kRecompute;
  EngineStats stats;
  const auto squeezed = RunAll(c, 40, &stats);
  EXPECT_GT(stats.preemptions_recompute, 0);
  EXPECT_EQ(Tokens(squeezed), Tokens(free));
}

// Reservation admission: with a policy that has a budget trigger (uniform, pooled or per-layer
// budgets),
// a request is admitted only when its peak fits, so a pool too small for everyone at once runs
// without any preemption, never holds more than it has, and (batch-invariant path) produces
// the same tokens.
TEST(EngineTest, ReservationAdmitsBoundedPoliciesWithoutPreemption) {
  EngineConfig c;
  c.block_size = 4;
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);  // uniform, pooled, per-layer budgets (layer 0 gives 3 to layer 1)
    BeaconConfig b = SmallBeacon();
    if (variant == 1) b.budget_mode = BudgetMode::kPooled;
    if (variant == 2) b.layer_budget_offsets = {-3, 3};
    c.policy = b;
    c.num_blocks = EngineConfig{}.num_blocks;
    c.admission = AdmissionMode::kOptimistic;
    EngineStats free_stats;
    const auto free = RunAll(c, 60, &free_stats);
    c.num_blocks = 1 + free_stats.peak_used_blocks / 2;
    for (PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
      SCOPED_TRACE(mode == PreemptionMode::kSwap ? "swap" : "recompute");
      c.preemption = mode;
      c.admission = AdmissionMode::kOptimistic;
      EngineStats optimistic;
      const auto squeezed = RunAll(c, 60, &optimistic);
      // A recompute restarts the policy state, which is not exact once a head has evicted
      // (docs/engine.md); the per-layer variant's smaller layer 0 is preempted after that.
      if (mode == PreemptionMode::kSwap || variant < 2) {
        EXPECT_EQ(Tokens(squeezed), Tokens(free));
      }
      EXPECT_GT(optimistic.preemptions_swap + optimistic.preemptions_recompute, 0);
      c.admission = AdmissionMode::kReserve;
      EngineStats reserved;
      EXPECT_EQ(Tokens(RunAll(c, 60, &reserved)), Tokens(free));
      EXPECT_EQ(reserved.preemptions_swap + reserved.preemptions_recompute, 0);
      EXPECT_GT(reserved.peak_running, 1);
      EXPECT_LE(reserved.peak_used_blocks, c.num_blocks - 1);
    }
  }
  // An unbounded policy (full) keeps the optimistic rule under kReserve.
  c.policy = FullConfig{};
  c.admission = AdmissionMode::kReserve;
  c.preemption = PreemptionMode::kSwap;
  EngineStats full;
  RunAll(c, 40, &full);
  EXPECT_GT(full.preemptions_swap, 0);
}

// Reservation follows every head's cycle instead of reserving each request's peak at once:
// heads of requests in different phases of the budget .. budget + interval cycle do not peak
// together, so a pool one block short of three peaks runs three requests at once, still
// without preemption and with the same tokens.
TEST(EngineTest, ReservationFitsMoreThanTheSumOfPeaks) {
  EngineConfig c;
  c.block_size = 1;  // blocks = tokens: every step of the cycle shows
  c.policy = SmallBeacon();
  EngineStats free_stats;
  const auto free = RunAll(c, 60, &free_stats);
  int32_t peak = 0;  // blocks one request holds at most: budget + interval tokens per head
  for (const auto& [id, o] : free) peak = std::max(peak, o.peak_blocks);
  ASSERT_GT(peak, 0);
  c.num_blocks = 1 + c.watermark_blocks + 3 * peak - 1;
  c.admission = AdmissionMode::kReserve;
  EngineStats reserved;
  EXPECT_EQ(Tokens(RunAll(c, 60, &reserved)), Tokens(free));
  EXPECT_EQ(reserved.preemptions_swap + reserved.preemptions_recompute, 0);
  // The sum of peaks allows 2 at once; here 3 share the pool from the first step (more once
  // one nears its end).
  EXPECT_GT(reserved.peak_running, 2);
  EXPECT_LE(reserved.peak_used_blocks, c.num_blocks - 1);
  EXPECT_GT(reserved.peak_used_blocks, c.num_blocks - 1 - c.watermark_blocks - peak);
}

TEST(EngineTest, EvictionBoundsTheCacheAndFreesBlocks) {
  EngineConfig c;
  c.block_size = 4;
  c.policy = SmallBeacon();
  EngineStats stats;
  const auto outs = RunAll(c, 60, &stats);
  EXPECT_GT(stats.compressions, 0);
  EXPECT_GT(stats.blocks_freed_by_eviction, 0);
  for (const auto& [id, o] : outs) {
    EXPECT_EQ(o.output.size(), 60u);
    EXPECT_LE(o.peak_retained_tokens, 12 + 4);  // budget + interval
    EXPECT_GT(o.tokens_evicted, 0);
  }
}

// The device pipeline's CPU twin (scorer=paged: the policy plans, every due head of a step is
// scored through its block table in one call) makes the host path's decisions: same tokens,
// same evictions, same blocks freed, with and without pooling and the coverage layer, with
// uniform and pooled budgets (pooled: the policy selects from the scorer's scores), under
// memory pressure with both preemption modes.
class PagedScorerTest : public ::testing::TestWithParam<std::tuple<int32_t, int32_t, bool, bool>> {
};

TEST_P(PagedScorerTest, MakesTheHostPathsDecisions) {
  const auto [pool_kernel, coverage, swap, pooled] = GetParam();
  EngineConfig c;
  c.block_size = 4;
  BeaconConfig b = SmallBeacon();
  b.pool_kernel = pool_kernel;
  b.coverage_layers = coverage;
  if (pooled) b.budget_mode = BudgetMode::kPooled;
  c.policy = b;
  c.num_blocks = 50;  // room for about three of the five sequences at their peak: preemption
  c.preemption = swap ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
  EngineStats host_stats, paged_stats;
  const auto host = RunAll(c, 60, &host_stats);
  c.scorer = ScorerKind::kPaged;
  const auto paged = RunAll(c, 60, &paged_stats);
  EXPECT_EQ(Tokens(paged), Tokens(host));
  EXPECT_GT(host_stats.compressions, 10);
  EXPECT_GT(paged_stats.preemptions_recompute + paged_stats.preemptions_swap, 0);
  EXPECT_EQ(paged_stats.preemptions_recompute, host_stats.preemptions_recompute);
  EXPECT_EQ(paged_stats.preemptions_swap, host_stats.preemptions_swap);
  EXPECT_EQ(paged_stats.compressions, host_stats.compressions);
  EXPECT_EQ(paged_stats.tokens_evicted, host_stats.tokens_evicted);
  EXPECT_EQ(paged_stats.blocks_freed_by_eviction, host_stats.blocks_freed_by_eviction);
  for (const auto& [id, o] : paged) EXPECT_EQ(o.tokens_evicted, host.at(id).tokens_evicted);
}

INSTANTIATE_TEST_SUITE_P(Knobs, PagedScorerTest,
                         ::testing::Values(std::tuple{1, 1, false, false},
                                           std::tuple{3, 0, false, false},
                                           std::tuple{5, 2, true, false},
                                           std::tuple{3, 1, false, true},
                                           std::tuple{1, 0, true, true}));

// tova, snapkv and rkv plan too; policies without a plan (h2o, snapkv with pooled budgets)
// run their own Compress under scorer=paged. Either way the tokens and evictions are the host
// path's.
TEST(EngineTest, PagedScorerAgreesForTovaSnapKvRkvAndForPoliciesWithoutAPlan) {
  TovaConfig tova;
  tova.budget = 12;
  SnapKvConfig snap;
  snap.budget = 12;
  snap.interval = 4;
  snap.window = 2;
  snap.pool_kernel = 3;
  RkvConfig rkv;
  rkv.budget = 12;
  rkv.interval = 4;
  rkv.window = 2;
  rkv.pool_kernel = 3;
  H2OConfig h2o;
  h2o.budget = 12;
  SnapKvConfig pooled = snap;
  pooled.budget_mode = BudgetMode::kPooled;
  for (const PolicyConfig& policy : std::vector<PolicyConfig>{tova, snap, rkv, h2o, pooled}) {
    EngineConfig c;
    c.block_size = 4;
    c.policy = policy;
    EngineStats host_stats, paged_stats;
    const auto host = RunAll(c, 40, &host_stats);
    c.scorer = ScorerKind::kPaged;
    EXPECT_EQ(Tokens(RunAll(c, 40, &paged_stats)), Tokens(host)) << PolicyName(policy);
    EXPECT_GT(paged_stats.compressions, 0);
    EXPECT_EQ(paged_stats.tokens_evicted, host_stats.tokens_evicted);
  }
}

TEST(EngineTest, ASequenceThatCannotFitAloneEndsOutOfMemory) {
  EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 1 + 2 * 2 * 4;  // 4 blocks per head: 16 tokens
  const auto outs = RunAll(c, 40, nullptr, {{1, 2, 3}});
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::kOutOfMemory);
  EXPECT_EQ(outs.at(0).output.size(), 16u - 3u + 1u);
}

TEST(EngineTest, APromptThatFillsThePoolRunsAloneInsteadOfWaitingForever) {
  EngineConfig c;
  c.block_size = 4;
  c.num_blocks = 1 + 2 * 2 * 1;  // exactly one block per head: a 4-token prompt
  c.watermark_blocks = 0;
  const auto outs = RunAll(c, 10, nullptr, {{1, 2, 3, 4}, {5, 6, 7}});
  EXPECT_EQ(outs.at(0).finish_reason, FinishReason::kOutOfMemory);
  EXPECT_EQ(outs.at(0).output.size(), 1u);  // the token sampled from the prefill
  EXPECT_EQ(outs.at(1).finish_reason, FinishReason::kOutOfMemory);
  EXPECT_EQ(outs.at(1).output.size(), 2u);  // 3 prompt tokens + 1 appended fill the block
}

TEST(EngineTest, SamplingIsSeededPerRequest) {
  EngineConfig c;
  const auto together = RunAll(c, 30, nullptr, Prompts(), 1.0f);
  const auto alone = RunAll(c, 30, nullptr, {Prompts()[2]}, 1.0f);
  EXPECT_EQ(alone.at(0).output, together.at(2).output);
  EXPECT_NE(together.at(2).output, RunAll(c, 30, nullptr, {Prompts()[2]}).at(0).output);
}

TEST(EngineTest, BadRequestsAreRejected) {
  auto engine = *Engine::Create(RandomModel(1), EngineConfig{});
  Request r;
  r.id = 1;
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.prompt = {1, 99};
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  r.prompt = {1, 2};
  r.sampling.top_p = 1.5f;
  EXPECT_EQ(engine->AddRequest(r).code(), absl::StatusCode::kInvalidArgument);
  EngineConfig bad;
  bad.max_batch = 0;
  EXPECT_EQ(Engine::Create(RandomModel(1), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace beaconkv

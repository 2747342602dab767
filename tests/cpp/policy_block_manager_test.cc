// End to end on the CPU: decode steps append tokens through the BlockManager (with a
// CpuKvStore holding the keys), every policy observes the step's queries, due heads are
// scored, keep-sets go to ApplyKeepSets, and the blocks the compaction frees are counted.
#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "block_manager/block_manager.h"
#include "core/policy.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

struct Gathered {
  std::vector<float> keys;         // [n, head_dim] slot order
  std::vector<int32_t> positions;  // [n]
};

Gathered Gather(const BlockManager& bm, const CpuKvStore& store, SequenceId id, int32_t layer,
                int32_t kv_head) {
  Gathered g;
  const int32_t n = *bm.RetainedTokens(id, layer, kv_head);
  const int32_t d = store.head_dim();
  for (int32_t i = 0; i < n; ++i) {
    const SlotRef s = *bm.Slot(id, layer, kv_head, i);
    g.keys.insert(g.keys.end(), store.key(s), store.key(s) + d);
    g.positions.push_back(store.position(s));
  }
  return g;
}

PolicyConfig SmallConfig(const std::string& name) {
  PolicyConfig c = *DefaultPolicyConfig(name);
  std::visit(
      [](auto& cfg) {
        using T = std::decay_t<decltype(cfg)>;
        if constexpr (requires { cfg.budget; }) cfg.budget = 16;
        if constexpr (requires { cfg.interval; }) cfg.interval = 8;
        if constexpr (requires { cfg.window; }) cfg.window = 4;
        if constexpr (std::is_same_v<T, RpcConfig>) {
          cfg.period = 16;
          cfg.ratio = 4;
        }
        if constexpr (std::is_same_v<T, BeaconConfig>) {
          cfg.n_recent = 4;
          cfg.n_beacons = 4;
          cfg.buffer_max = 16;
          cfg.buffer_min = 8;
          cfg.n_sinks = 2;
        }
      },
      c);
  return c;
}

class PolicyBlockManagerTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PolicyBlockManagerTest, ScoreKeepCompactFree) {
  const auto [name, mode] = GetParam();
  const uint32_t seed = 4242;
  SCOPED_TRACE(::testing::Message() << name << " " << mode << " seed " << seed);
  KvShape shape{/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/8, /*block_size=*/4};
  const int32_t num_blocks = 200, group = 2, prompt = 6, steps = 120;
  CpuKvStore store(num_blocks, shape.block_size, shape.head_dim);
  auto bm_or = BlockManager::Create({shape, num_blocks, 0}, &store);
  ASSERT_TRUE(bm_or.ok()) << bm_or.status();
  BlockManager& bm = **bm_or;
  PolicyConfig config = SmallConfig(name);
  if (mode == "pooled") std::get<BeaconConfig>(config).budget_mode = BudgetMode::kPooled;
  PolicyGeometry geo{shape.num_layers, shape.num_kv_heads, group, {shape.head_dim, 1e4}};
  auto state_or = NewPolicyState(config, geo, prompt);
  ASSERT_TRUE(state_or.ok()) << state_or.status();
  PolicyState& policy = **state_or;

  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const SequenceId id = 7;
  ASSERT_TRUE(bm.AddSequence(id, prompt).ok());
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
      for (int32_t i = 0; i < prompt; ++i) {
        float* k = store.key(*bm.Slot(id, l, h, i));
        for (int32_t x = 0; x < shape.head_dim; ++x) k[x] = dist(rng);
      }
    }
  }
  int64_t freed_total = 0, evicted_total = 0, compressions = 0;
  std::vector<SlotRef> slots(shape.num_heads_total());
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t position = *bm.NextPosition(id);
    ASSERT_TRUE(bm.AppendToken(id, absl::MakeSpan(slots)).ok());
    for (const SlotRef& s : slots) {
      for (int32_t x = 0; x < shape.head_dim; ++x) store.key(s)[x] = dist(rng);
    }
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        std::vector<float> pre(group * shape.head_dim), post(group * shape.head_dim);
        for (float& x : pre) x = dist(rng);
        for (float& x : post) x = dist(rng);
        Gathered g;
        HeadKeys keys;
        if (policy.NeedsKeysOnObserve()) {
          g = Gather(bm, store, id, l, h);
          keys = {g.keys.data(), g.positions.data(), static_cast<int32_t>(g.positions.size())};
        }
        ASSERT_TRUE(policy
                        .Observe(l, h, {position, pre.data(), post.data()},
                                 policy.NeedsKeysOnObserve() ? &keys : nullptr)
                        .ok());
      }
    }
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      std::vector<int32_t> tokens;
      for (int32_t h = 0; h < shape.num_kv_heads; ++h)
        tokens.push_back(*bm.RetainedTokens(id, l, h));
      const std::vector<int32_t> due = policy.DueHeads(l, tokens);
      if (due.empty()) continue;
      std::vector<Gathered> gathered;
      std::vector<HeadKeys> heads;
      for (int32_t h = 0; h < shape.num_kv_heads; ++h)
        gathered.push_back(Gather(bm, store, id, l, h));
      for (const Gathered& g : gathered) {
        heads.push_back(
            {g.keys.data(), g.positions.data(), static_cast<int32_t>(g.positions.size())});
      }
      auto keep_or = policy.Compress(l, heads, due, position);
      ASSERT_TRUE(keep_or.ok()) << keep_or.status();
      std::vector<KeepSet> keep;
      std::vector<std::set<int32_t>> chosen(shape.num_kv_heads);
      int32_t blocks_before = 0, blocks_after = 0;
      for (const KeepSet& k : *keep_or) {
        keep.push_back({k.layer, k.kv_head, k.slots});
        for (int32_t s : k.slots) chosen[k.kv_head].insert(gathered[k.kv_head].positions[s]);
        blocks_before += shape.BlocksFor(tokens[k.kv_head]);
        blocks_after += shape.BlocksFor(static_cast<int64_t>(k.slots.size()));
      }
      const int32_t free_before = bm.NumFreeBlocks();
      auto plan = bm.ApplyKeepSets(id, keep);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE(bm.VerifyIntegrity().ok());
      ++compressions;
      EXPECT_EQ(plan->blocks_freed, blocks_before - blocks_after);
      EXPECT_EQ(bm.NumFreeBlocks() - free_before, plan->blocks_freed);
      freed_total += plan->blocks_freed;
      evicted_total += plan->tokens_evicted;
      // The cache now holds exactly the positions the policy chose.
      for (const KeepSet& k : *keep_or) {
        const Gathered after = Gather(bm, store, id, l, k.kv_head);
        EXPECT_EQ(std::set<int32_t>(after.positions.begin(), after.positions.end()),
                  chosen[k.kv_head]);
      }
    }
  }
  int64_t retained = 0;
  for (int32_t l = 0; l < shape.num_layers; ++l)
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) retained += *bm.RetainedTokens(id, l, h);
  const int64_t generated = int64_t{prompt + steps} * shape.num_heads_total();
  EXPECT_EQ(retained + evicted_total, generated);
  std::printf("[%s/%s] compressions=%lld freed_blocks=%lld evicted=%lld retained=%lld of %lld\n",
              name.c_str(), mode.c_str(), static_cast<long long>(compressions),
              static_cast<long long>(freed_total), static_cast<long long>(evicted_total),
              static_cast<long long>(retained), static_cast<long long>(generated));
  if (name == "full") {
    EXPECT_EQ(freed_total, 0);
  } else {
    EXPECT_GT(compressions, 0);
    EXPECT_GT(freed_total, 0);
  }
  if (name != "full" && name != "rpc") {
    for (int32_t l = 0; l < shape.num_layers; ++l) {
      int32_t layer_tokens = 0;
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        const int32_t t = *bm.RetainedTokens(id, l, h);
        layer_tokens += t;
        if (mode == "uniform") {
          EXPECT_LT(t, 16 + 8);
        }
      }
      EXPECT_LT(layer_tokens, (16 + 8) * shape.num_kv_heads);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPolicies, PolicyBlockManagerTest,
    ::testing::Values(std::tuple{"full", "uniform"}, std::tuple{"streaming", "uniform"},
                      std::tuple{"h2o", "uniform"}, std::tuple{"tova", "uniform"},
                      std::tuple{"snapkv", "uniform"}, std::tuple{"rkv", "uniform"},
                      std::tuple{"rpc", "uniform"}, std::tuple{"beacon", "uniform"},
                      std::tuple{"beacon", "pooled"}),
    [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param); });

}  // namespace
}  // namespace beaconkv

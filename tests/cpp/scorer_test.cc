// The device pipeline's scorer (kernels/scorer.h) against the policy it stands in for: a beacon,
// tova, snapkv or rkv state that plans (PlanScoring) and a PagedTwinScorer over a paged store must
// keep what an identical state's own Compress keeps, over many compressions of several layers and
// heads whose slots are out of position order.
#include "kernels/scorer.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "block_manager/kv_store.h"
#include "core/policy.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

struct Geometry {
  int32_t layers = 2;
  int32_t kv_heads = 2;
  int32_t group = 2;
  int32_t head_dim = 16;
  int32_t block_size = 8;
};

PolicyGeometry ToPolicyGeometry(const Geometry& g) {
  PolicyGeometry pg;
  pg.num_layers = g.layers;
  pg.num_kv_heads = g.kv_heads;
  pg.group_size = g.group;
  pg.rope.head_dim = g.head_dim;
  pg.rope.rope_theta = 10000.0;
  return pg;
}

// One head's tokens in a paged store: a table of distinct blocks, slots filled in a shuffled
// order of positions (as after compactions).
struct PagedHead {
  std::vector<BlockId> table;
  std::vector<int32_t> positions;  // slot order
};

class PagedHeads {
 public:
  PagedHeads(const Geometry& g, int32_t num_blocks)
      : g_(g), store_(num_blocks, g.block_size, g.head_dim) {
    for (BlockId b = num_blocks - 1; b >= 1; --b) free_.push_back(b);
    heads_.resize(static_cast<size_t>(g.layers) * g.kv_heads);
  }
  CpuKvStore& store() { return store_; }
  PagedHead& head(int32_t layer, int32_t kv_head) { return heads_[layer * g_.kv_heads + kv_head]; }

  // Fills head (layer, kv_head) with `positions` (any order) and random keys.
  void Fill(int32_t layer, int32_t kv_head, const std::vector<int32_t>& positions,
            std::mt19937& rng) {
    PagedHead& h = head(layer, kv_head);
    for (BlockId b : h.table) free_.push_back(b);
    h.table.clear();
    h.positions = positions;
    const int32_t n = static_cast<int32_t>(positions.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int32_t j = 0; j < n; ++j) {
      if (j % g_.block_size == 0) {
        h.table.push_back(free_.back());
        free_.pop_back();
      }
      const SlotRef slot{h.table[j / g_.block_size], j % g_.block_size};
      for (int32_t d = 0; d < g_.head_dim; ++d) store_.key(slot)[d] = normal(rng);
      store_.SetPosition(slot, positions[j]);
    }
  }
  // Keeps `slots` (ascending) of the head: its tokens become those, in that order.
  void Keep(int32_t layer, int32_t kv_head, const std::vector<int32_t>& slots) {
    PagedHead& h = head(layer, kv_head);
    std::vector<float> keys;
    std::vector<int32_t> positions;
    for (int32_t s : slots) {
      const SlotRef ref{h.table[s / g_.block_size], s % g_.block_size};
      keys.insert(keys.end(), store_.key(ref), store_.key(ref) + g_.head_dim);
      positions.push_back(h.positions[s]);
    }
    for (size_t j = 0; j < slots.size(); ++j) {
      const SlotRef ref{h.table[j / g_.block_size], static_cast<int32_t>(j) % g_.block_size};
      std::copy_n(keys.begin() + static_cast<ptrdiff_t>(j) * g_.head_dim, g_.head_dim,
                  store_.key(ref));
      store_.SetPosition(ref, positions[j]);
    }
    h.positions = positions;
  }
  // The head's keys gathered in slot order (what the engine hands Compress).
  HeadKeys Gather(int32_t layer, int32_t kv_head, std::vector<float>* keys) {
    PagedHead& h = head(layer, kv_head);
    const int32_t n = static_cast<int32_t>(h.positions.size());
    keys->resize(static_cast<size_t>(n) * g_.head_dim);
    for (int32_t j = 0; j < n; ++j) {
      const SlotRef ref{h.table[j / g_.block_size], j % g_.block_size};
      std::copy_n(store_.key(ref), g_.head_dim,
                  keys->data() + static_cast<size_t>(j) * g_.head_dim);
    }
    return {keys->data(), h.positions.data(), n};
  }
  // Appends one token at `position` with a random key.
  void Append(int32_t layer, int32_t kv_head, int32_t position, std::mt19937& rng) {
    PagedHead& h = head(layer, kv_head);
    const int32_t j = static_cast<int32_t>(h.positions.size());
    if (j % g_.block_size == 0) {
      h.table.push_back(free_.back());
      free_.pop_back();
    }
    const SlotRef slot{h.table[j / g_.block_size], j % g_.block_size};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int32_t d = 0; d < g_.head_dim; ++d) store_.key(slot)[d] = normal(rng);
    store_.SetPosition(slot, position);
    h.positions.push_back(position);
  }

 private:
  Geometry g_;
  CpuKvStore store_;
  std::vector<BlockId> free_;
  std::vector<PagedHead> heads_;
};

struct Params {
  PolicyConfig config;
  Geometry geometry;
  uint32_t seed;
};

class PlannedScoringTest : public ::testing::TestWithParam<Params> {};

// Runs `steps` decode steps on two identical beacon states over one paged cache (the host
// state drives the cache; the planned state must agree on every keep-set).
TEST_P(PlannedScoringTest, KeepsWhatTheHostCompressKeeps) {
  const Params& p = GetParam();
  const Geometry& g = p.geometry;
  std::mt19937 rng(p.seed);
  const int32_t prompt = 20, steps = 260;
  auto host = NewPolicyState(p.config, ToPolicyGeometry(g), prompt);
  auto planned = NewPolicyState(p.config, ToPolicyGeometry(g), prompt);
  ASSERT_TRUE(host.ok() && planned.ok());
  PagedHeads cache(g, 4096);
  for (int32_t l = 0; l < g.layers; ++l) {
    for (int32_t h = 0; h < g.kv_heads; ++h) {
      std::vector<int32_t> pos(prompt);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);  // slot order != position order from the start
      cache.Fill(l, h, pos, rng);
    }
  }
  PagedTwinScorer scorer(&cache.store());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> pre(static_cast<size_t>(g.group) * g.head_dim), post(pre.size());
  int32_t compressions = 0, planned_heads = 0;
  for (int32_t step = 0; step < steps; ++step) {
    const int32_t position = prompt + step;
    for (int32_t l = 0; l < g.layers; ++l) {
      for (int32_t h = 0; h < g.kv_heads; ++h) {
        cache.Append(l, h, position, rng);
        for (float& x : pre) x = normal(rng);
        for (float& x : post) x = normal(rng);
        const StepQueries q{position, pre.data(), post.data()};
        ASSERT_TRUE((*host)->Observe(l, h, q, nullptr).ok());
        ASSERT_TRUE((*planned)->Observe(l, h, q, nullptr).ok());
      }
    }
    for (int32_t l = 0; l < g.layers; ++l) {
      std::vector<int32_t> tokens(g.kv_heads);
      for (int32_t h = 0; h < g.kv_heads; ++h)
        tokens[h] = static_cast<int32_t>(cache.head(l, h).positions.size());
      const std::vector<int32_t> due = (*host)->DueHeads(l, tokens);
      ASSERT_EQ(due, (*planned)->DueHeads(l, tokens));
      if (due.empty()) continue;
      std::vector<std::vector<float>> keys(g.kv_heads);
      std::vector<HeadKeys> heads(g.kv_heads), positions_only(g.kv_heads);
      for (int32_t h = 0; h < g.kv_heads; ++h) {
        heads[h] = cache.Gather(l, h, &keys[h]);
        positions_only[h] = {nullptr, heads[h].positions, heads[h].num_tokens};
      }
      auto want = (*host)->Compress(l, heads, due, position);
      ASSERT_TRUE(want.ok()) << want.status();
      auto plan = (*planned)->PlanScoring(l, positions_only, due, position);
      ASSERT_TRUE(plan.ok()) << plan.status();
      std::vector<ScoringJob> jobs;
      for (const ScoringTask& t : plan->tasks) {
        const PagedHead& ph = cache.head(l, t.kv_head);
        jobs.push_back({ph.table, ph.positions, &t});
      }
      ScoringResult result;
      ASSERT_TRUE(
          scorer.Score(ScoringShape::Of(*plan, g.head_dim, g.block_size), jobs, &result).ok());
      if (plan->pooled) {
        // Every head of the layer is scored; the policy selects across them from the scores.
        ASSERT_EQ(plan->tasks.size(), static_cast<size_t>(g.kv_heads));
        std::vector<absl::Span<const float>> scores;
        for (size_t j = 0; j < jobs.size(); ++j)
          scores.push_back(result.ScoresOf(static_cast<int32_t>(j)));
        auto got = (*planned)->SelectFromScores(*plan, positions_only, scores);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->size(), want->size());
        for (size_t i = 0; i < want->size(); ++i) {
          EXPECT_EQ((*got)[i].kv_head, (*want)[i].kv_head);
          EXPECT_EQ((*got)[i].slots, (*want)[i].slots)
              << "step " << step << " layer " << l << " head " << (*want)[i].kv_head;
        }
        planned_heads += static_cast<int32_t>(plan->tasks.size());
        for (const KeepSet& w : *want) cache.Keep(l, w.kv_head, w.slots);
        ++compressions;
        continue;
      }
      std::vector<absl::Span<const uint8_t>> masks;
      for (size_t j = 0; j < jobs.size(); ++j)
        masks.push_back(result.KeepOf(static_cast<int32_t>(j)));
      auto got = KeepSetsFromMasks(*plan, masks);
      ASSERT_TRUE(got.ok()) << got.status();
      // Compress returns every due head (within-budget ones keep all); the plan only those
      // that shed tokens.
      size_t t = 0;
      for (const KeepSet& w : *want) {
        const int32_t n = static_cast<int32_t>(cache.head(l, w.kv_head).positions.size());
        if (static_cast<int32_t>(w.slots.size()) == n &&
            (t == got->size() || (*got)[t].kv_head != w.kv_head)) {
          continue;
        }
        ASSERT_LT(t, got->size());
        EXPECT_EQ((*got)[t].kv_head, w.kv_head);
        EXPECT_EQ((*got)[t].slots, w.slots)
            << "step " << step << " layer " << l << " head " << w.kv_head;
        ++t;
      }
      EXPECT_EQ(t, got->size());
      planned_heads += static_cast<int32_t>(plan->tasks.size());
      for (const KeepSet& w : *want) cache.Keep(l, w.kv_head, w.slots);
      ++compressions;
    }
  }
  EXPECT_GE(compressions, 4);
  EXPECT_GE(planned_heads, 4);
}

TovaConfig Tova(int32_t budget, int32_t interval) {
  TovaConfig c;
  c.budget = budget;
  c.interval = interval;
  return c;
}

SnapKvConfig SnapKv(int32_t budget, int32_t interval, int32_t window, Pooling pooling,
                    int32_t pool_kernel) {
  SnapKvConfig c;
  c.budget = budget;
  c.interval = interval;
  c.window = window;
  c.pooling = pooling;
  c.pool_kernel = pool_kernel;
  return c;
}

RkvConfig Rkv(int32_t budget, int32_t interval, int32_t window, int32_t pool_kernel, double lambda,
              double threshold) {
  RkvConfig c;
  c.budget = budget;
  c.interval = interval;
  c.window = window;
  c.pool_kernel = pool_kernel;
  c.lambda = lambda;
  c.redundancy_threshold = threshold;
  return c;
}

BeaconConfig Beacon(int32_t budget, int32_t interval, int32_t pool, int32_t coverage,
                    bool protect_prompt, double redundancy = 0.0, double threshold = 0.5,
                    int32_t prompt_slots = 0, bool pooled = false,
                    std::vector<int32_t> layer_offsets = {}, double beacon_radius = 0.0,
                    double blur_speed = 0.0) {
  BeaconConfig c;
  c.budget = budget;
  c.interval = interval;
  c.n_recent = 8;
  c.n_beacons = 16;
  c.buffer_min = 32;
  c.buffer_max = 64;
  c.pool_kernel = pool;
  c.coverage_layers = coverage;
  c.protect_prompt = protect_prompt;
  c.redundancy = redundancy;
  c.redundancy_threshold = threshold;
  c.prompt_slots = prompt_slots;
  c.budget_mode = pooled ? BudgetMode::kPooled : BudgetMode::kUniform;
  c.layer_budget_offsets = std::move(layer_offsets);
  c.beacon_radius = beacon_radius;
  c.blur_speed = blur_speed;
  c.blurred_beacons = 10;  // of the 16 beacons
  return c;
}

BeaconConfig BlurIn(BeaconConfig c, std::vector<int32_t> layers) {
  c.blur_layers = std::move(layers);
  return c;
}

BeaconConfig Float32Products(BeaconConfig c) {
  c.score_bf16 = false;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PlannedScoringTest,
    ::testing::Values(
        Params{Beacon(48, 16, 1, 1, false), Geometry{}, 1},
        Params{Beacon(64, 32, 3, 1, false), Geometry{2, 2, 2, 16, 8}, 2},
        Params{Beacon(40, 8, 5, 2, true), Geometry{3, 1, 4, 32, 16}, 3},
        Params{Beacon(72, 24, 1, 0, false), Geometry{1, 3, 1, 8, 1}, 4},
        Params{Tova(48, 16), Geometry{}, 5}, Params{Tova(40, 1), Geometry{2, 1, 4, 32, 16}, 6},
        Params{SnapKv(48, 16, 8, Pooling::kMax, 5), Geometry{}, 7},
        Params{SnapKv(40, 8, 4, Pooling::kAvg, 3), Geometry{3, 1, 4, 32, 16}, 8},
        Params{SnapKv(64, 32, 16, Pooling::kNone, 1), Geometry{1, 3, 1, 8, 1}, 9},
        Params{SnapKv(36, 4, 35, Pooling::kMax, 7), Geometry{}, 10},
        Params{Rkv(48, 16, 8, 7, 0.1, 0.5), Geometry{}, 11},
        Params{Rkv(40, 8, 4, 3, 0.5, 0.1), Geometry{3, 1, 4, 32, 16}, 12},
        Params{Rkv(64, 32, 16, 1, 0.9, -0.2), Geometry{1, 3, 1, 8, 1}, 13},
        Params{Beacon(48, 16, 1, 1, false, 1.0, 0.5), Geometry{}, 14},
        Params{Beacon(64, 32, 3, 0, false, 0.05, 0.1), Geometry{2, 2, 2, 16, 8}, 15},
        Params{Beacon(40, 8, 5, 2, true, 4.0, -0.2), Geometry{3, 1, 4, 32, 16}, 16},
        // prompt_slots: fewer slots than prompt candidates, more, with the
        // redundancy term, and with the prompt protected (an empty region).
        Params{Beacon(48, 16, 1, 1, false, 0.0, 0.5, 4), Geometry{}, 17},
        Params{Beacon(40, 8, 3, 0, false, 0.0, 0.5, 24), Geometry{2, 2, 2, 16, 8}, 18},
        Params{Beacon(64, 32, 5, 1, false, 1.0, 0.5, 6), Geometry{3, 1, 4, 32, 16}, 19},
        Params{Beacon(40, 8, 1, 1, true, 0.0, 0.5, 3), Geometry{}, 20},
        // Pooled budgets: the scorer scores every head of the layer and the policy selects
        // across them (with the coverage sample's +2 in the head's mass, prompt slots, the
        // prompt protected, per-layer budgets, and one kv head).
        Params{Beacon(48, 16, 1, 1, false, 0.0, 0.5, 0, true), Geometry{}, 21},
        Params{Beacon(64, 32, 3, 1, false, 0.0, 0.5, 4, true), Geometry{2, 2, 2, 16, 8}, 22},
        Params{Beacon(40, 8, 5, 2, true, 0.0, 0.5, 3, true), Geometry{3, 3, 4, 32, 16}, 23},
        Params{Beacon(48, 16, 3, 0, false, 0.0, 0.5, 6, true, {8, -8}), Geometry{}, 24},
        Params{Beacon(72, 24, 1, 0, false, 0.0, 0.5, 0, true), Geometry{1, 1, 1, 8, 1}, 25},
        // A beacon radius (random 16-dim queries are far apart: 0.7 cuts the draws short).
        Params{Beacon(48, 16, 1, 1, false, 0.0, 0.5, 0, false, {}, 0.7), Geometry{}, 26},
        Params{Beacon(64, 32, 3, 1, false, 0.0, 0.5, 4, true, {}, 0.7), Geometry{2, 2, 2, 16, 8},
               27},
        // Blurred beacons: the scorer rotates the blurred rows it gets before RoPE (0.02 rad
        // per token zeroes some pairs, 1e-9 every pair: all-zero rows).
        Params{Beacon(48, 16, 1, 1, false, 0.0, 0.5, 4, false, {}, 0.0, 0.02), Geometry{}, 28},
        Params{Beacon(64, 32, 3, 1, false, 0.0, 0.5, 4, true, {}, 0.0, 1e-9),
               Geometry{2, 2, 2, 16, 8}, 29},
        // ... in chosen layers only (blur_layers), uniform and pooled.
        Params{BlurIn(Beacon(48, 16, 1, 1, false, 0.0, 0.5, 4, false, {}, 0.0, 0.02), {1}),
               Geometry{}, 30},
        Params{BlurIn(Beacon(40, 8, 3, 0, false, 0.0, 0.5, 3, true, {}, 0.0, 0.02), {2, 0}),
               Geometry{3, 1, 4, 32, 16}, 31},
        // Every beacon case above scores bfloat16 products (score_bf16, the default; head_dim
        // 32: the AVX-512 BF16 products where the CPU has them, 8 and 16: rounded copies);
        // these score float32 ones, uniform, pooled, and with blurred rows.
        Params{Float32Products(Beacon(40, 8, 5, 2, true)), Geometry{3, 1, 4, 32, 16}, 32},
        Params{Float32Products(Beacon(48, 16, 1, 1, false, 0.0, 0.5, 4, true)), Geometry{}, 33},
        Params{Float32Products(Beacon(64, 32, 3, 1, false, 0.0, 0.5, 4, false, {}, 0.0, 0.02)),
               Geometry{3, 1, 4, 32, 16}, 34}));

// blur_layers: the listed layers' plans are those of blurred rows in every layer, the other
// layers' those of no blurred rows at all (same queries observed by the three states).
TEST(PlanScoringTest, BlurLayersBlurOnlyTheListedLayers) {
  Geometry g;
  g.layers = 3;
  const int32_t prompt = 4, n = 80;
  const BeaconConfig off = Beacon(48, 16, 1, 0, false);
  const BeaconConfig every = Beacon(48, 16, 1, 0, false, 0.0, 0.5, 0, false, {}, 0.0, 0.02);
  const BeaconConfig chosen = BlurIn(every, {2, 0});
  std::vector<std::unique_ptr<PolicyState>> states;
  for (const BeaconConfig& c : {off, every, chosen}) {
    auto s = NewPolicyState(c, ToPolicyGeometry(g), prompt);
    ASSERT_TRUE(s.ok()) << s.status();
    states.push_back(*std::move(s));
  }
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> pre(static_cast<size_t>(g.group) * g.head_dim), post(pre.size());
  for (int32_t p = 0; p < n; ++p) {
    for (int32_t l = 0; l < g.layers; ++l) {
      for (int32_t h = 0; h < g.kv_heads; ++h) {
        for (float& x : pre) x = normal(rng);
        for (float& x : post) x = normal(rng);
        for (auto& s : states) ASSERT_TRUE(s->Observe(l, h, {p, pre.data(), post.data()}, {}).ok());
      }
    }
  }
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<HeadKeys> heads(g.kv_heads, HeadKeys{nullptr, positions.data(), n});
  std::vector<int32_t> due(g.kv_heads);
  std::iota(due.begin(), due.end(), 0);
  for (int32_t l = 0; l < g.layers; ++l) {
    std::vector<ScoringPlan> plans;
    for (auto& s : states) {
      auto plan = s->PlanScoring(l, heads, due, n);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->tasks.size(), due.size());
      plans.push_back(*std::move(plan));
    }
    const bool blurred = l != 1;
    const ScoringPlan& like = plans[blurred ? 1 : 0];
    for (size_t t = 0; t < due.size(); ++t) {
      const ScoringTask& got = plans[2].tasks[t];
      EXPECT_EQ(got.rotated_rows, like.tasks[t].rotated_rows) << "layer " << l;
      EXPECT_EQ(got.queries, like.tasks[t].queries) << "layer " << l;
      EXPECT_EQ(got.num_queries > plans[0].tasks[t].num_queries, blurred) << "layer " << l;
    }
  }
}

TEST(PlanScoringTest, PoliciesWithoutAPlanSayToRunCompress) {
  Geometry g;
  const std::vector<PolicyConfig> configs = {FullConfig{}, StreamingConfig{}, H2OConfig{},
                                             RpcConfig{}};
  SnapKvConfig pooled_snapkv;
  pooled_snapkv.budget_mode = BudgetMode::kPooled;
  std::vector<PolicyConfig> all = configs;
  all.push_back(pooled_snapkv);
  const std::vector<int32_t> positions = {0, 1, 2};
  std::vector<HeadKeys> heads(g.kv_heads, HeadKeys{nullptr, positions.data(), 3});
  for (const PolicyConfig& c : all) {
    auto state = NewPolicyState(c, ToPolicyGeometry(g), 1);
    ASSERT_TRUE(state.ok()) << PolicyName(c) << ": " << state.status();
    auto plan = (*state)->PlanScoring(0, heads, {0}, 2);
    EXPECT_TRUE(absl::IsUnimplemented(plan.status())) << PolicyName(c) << ": " << plan.status();
  }
}

// A pooled plan's selection takes the scorer's scores of every head of the layer, as planned;
// anything else is refused with the problem named, and policies without pooled plans say so.
TEST(PlanScoringTest, PooledSelectionRefusesScoresThatDoNotMatchThePlan) {
  Geometry g;
  const int32_t n = 60;
  auto state =
      NewPolicyState(Beacon(48, 16, 1, 1, false, 0.0, 0.5, 0, true), ToPolicyGeometry(g), 4);
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<HeadKeys> heads(g.kv_heads, HeadKeys{nullptr, positions.data(), n});
  auto plan = (*state)->PlanScoring(0, heads, {1}, n - 1);  // one due head plans the layer
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->pooled);
  ASSERT_EQ(plan->tasks.size(), static_cast<size_t>(g.kv_heads));
  for (const ScoringTask& t : plan->tasks) EXPECT_EQ(t.k, 0);
  std::vector<float> flat(n, 0.5f), short_scores(n - 1, 0.5f);
  std::vector<absl::Span<const float>> scores(g.kv_heads, flat);
  auto sets = (*state)->SelectFromScores(*plan, heads, scores);
  ASSERT_TRUE(sets.ok()) << sets.status();
  int64_t kept = 0;
  for (const KeepSet& k : *sets) kept += static_cast<int64_t>(k.slots.size());
  EXPECT_EQ(kept, 48 * g.kv_heads);  // the layer's pooled budget
  auto few = (*state)->SelectFromScores(*plan, heads, absl::MakeSpan(scores).subspan(0, 1));
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(few.status().message().find("1 score arrays"), std::string::npos) << few.status();
  scores[1] = short_scores;
  auto sized = (*state)->SelectFromScores(*plan, heads, scores);
  EXPECT_EQ(sized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sized.status().message().find("59 scores"), std::string::npos) << sized.status();
  ScoringPlan uniform = *plan;
  uniform.pooled = false;
  EXPECT_EQ((*state)->SelectFromScores(uniform, heads, scores).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto tova = NewPolicyState(Tova(48, 16), ToPolicyGeometry(g), 4);
  ASSERT_TRUE(tova.ok());
  EXPECT_TRUE(absl::IsUnimplemented((*tova)->SelectFromScores(*plan, heads, scores).status()));
}

// prompt_slots becomes a reserved region in the plans of the layers it acts in: the head's
// unprotected prompt tokens, in slot order; the coverage layers plan no region.
TEST(PlanScoringTest, BeaconPromptSlotsReserveThePromptInSlotOrder) {
  Geometry g;
  g.layers = 2;
  const int32_t prompt = 20, n = 60;
  BeaconConfig c = Beacon(48, 16, 1, 1, false);
  c.prompt_slots = 4;
  auto state = NewPolicyState(c, ToPolicyGeometry(g), prompt);
  ASSERT_TRUE(state.ok()) << state.status();
  std::vector<int32_t> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(positions.begin(), positions.end(), rng);
  std::vector<HeadKeys> heads(g.kv_heads, HeadKeys{nullptr, positions.data(), n});
  std::vector<int32_t> due(g.kv_heads);
  std::iota(due.begin(), due.end(), 0);
  auto coverage = (*state)->PlanScoring(0, heads, due, n);
  ASSERT_TRUE(coverage.ok()) << coverage.status();
  ASSERT_EQ(coverage->tasks.size(), due.size());
  for (const ScoringTask& t : coverage->tasks) {
    EXPECT_TRUE(t.reserve.empty());
    EXPECT_EQ(t.reserve_k, 0);
  }
  auto plan = (*state)->PlanScoring(1, heads, due, n);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->tasks.size(), due.size());
  for (const ScoringTask& t : plan->tasks) {
    EXPECT_EQ(t.reserve_k, 4);
    ASSERT_EQ(t.reserve.size(), static_cast<size_t>(n));
    for (int32_t s = 0; s < n; ++s) {
      // The sinks are protected, so the region is the prompt after them.
      EXPECT_EQ(t.reserve[s], positions[s] >= c.n_sinks && positions[s] < prompt ? 1 : 0)
          << "slot " << s << " position " << positions[s];
      EXPECT_FALSE(t.reserve[s] && t.protect[s]);
    }
  }
}

TEST(PlanScoringTest, BadArgumentsAreErrors) {
  Geometry g;
  auto state = NewPolicyState(Beacon(48, 16, 1, 1, false), ToPolicyGeometry(g), 1);
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(state.ok());
  const std::vector<int32_t> positions = {0, 1, 2};
  std::vector<HeadKeys> heads(g.kv_heads, HeadKeys{nullptr, positions.data(), 3});
  EXPECT_EQ((*state)->PlanScoring(5, heads, {0}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // layer out of range
  EXPECT_EQ((*state)->PlanScoring(0, absl::MakeConstSpan(heads).subspan(1), {0}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // keys of one head missing
  EXPECT_EQ((*state)->PlanScoring(0, heads, {1, 0}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // due not ascending
  heads[0].positions = nullptr;
  EXPECT_EQ((*state)->PlanScoring(0, heads, {0}, 2).status().code(),
            absl::StatusCode::kInvalidArgument);  // no positions
}

TEST(KeepSetsFromMasksTest, MapsMasksAndRejectsMismatches) {
  ScoringPlan plan;
  plan.layer = 1;
  plan.tasks.resize(2);
  plan.tasks[0].kv_head = 0;
  plan.tasks[0].protect.assign(4, 0);
  plan.tasks[1].kv_head = 2;
  plan.tasks[1].protect.assign(3, 0);
  const std::vector<uint8_t> a = {1, 0, 0, 1}, b = {0, 1, 1}, short_b = {0, 1};
  auto sets = KeepSetsFromMasks(plan, {absl::MakeConstSpan(a), absl::MakeConstSpan(b)});
  ASSERT_TRUE(sets.ok());
  ASSERT_EQ(sets->size(), 2u);
  EXPECT_EQ((*sets)[0].layer, 1);
  EXPECT_EQ((*sets)[0].slots, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ((*sets)[1].kv_head, 2);
  EXPECT_EQ((*sets)[1].slots, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(KeepSetsFromMasks(plan, {absl::MakeConstSpan(a)}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KeepSetsFromMasks(plan, {absl::MakeConstSpan(a), absl::MakeConstSpan(short_b)})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BuildScoringBatchTest, LaysOutJobsAndNamesBadOnes) {
  ScoringShape shape{/*head_dim=*/2,   /*block_size=*/2,
                     /*group_size=*/1, {},
                     Pooling::kNone,   1};
  ScoringTask t0;
  t0.num_queries = 1;
  t0.queries = {1.0f, 0.0f};
  t0.protect = {1, 0, 0};
  t0.k = 1;
  ScoringTask t1 = t0;
  t1.protect = {0};
  const std::vector<BlockId> table0 = {5, 3}, table1 = {7};
  const std::vector<int32_t> pos0 = {4, 0, 9}, pos1 = {2};
  ScoringBatch b;
  ASSERT_TRUE(BuildScoringBatch(shape, {{table0, pos0, &t0}, {table1, pos1, &t1}}, &b).ok());
  EXPECT_EQ(b.num_jobs, 2);
  EXPECT_EQ(b.max_blocks, 2);
  EXPECT_EQ(b.max_len, 3);
  EXPECT_EQ(b.tables, (std::vector<int32_t>{5, 3, 7, 0}));
  EXPECT_EQ(b.offsets, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(b.query_offsets, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{4, 0, 9, 2}));
  EXPECT_EQ(b.protect, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(b.k, (std::vector<int32_t>{1, 1}));
  EXPECT_TRUE(b.rope_table_row.empty());                  // nothing to rotate
  EXPECT_TRUE(b.reserve.empty() && b.reserve_k.empty());  // no reserved region

  // One task with a reserved region: the others' share of the mask is 0.
  ScoringTask reserved = t0;
  reserved.reserve = {0, 1, 1};
  reserved.reserve_k = 1;
  ASSERT_TRUE(BuildScoringBatch(shape, {{table1, pos1, &t1}, {table0, pos0, &reserved}}, &b).ok());
  EXPECT_EQ(b.reserve, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(b.reserve_k, (std::vector<int32_t>{0, 1}));

  // A task with pre-RoPE rows: its last rows' vectors point at its position's table row;
  // every other vector at row 0 (position 0, the identity).
  ScoringTask t2 = t0;
  t2.num_queries = 3;
  t2.queries.assign(6, 1.0f);
  t2.rotated_rows = 2;
  t2.rotate_to = 41;
  ScoringShape roped = shape;
  roped.rope_theta = 10000.0;
  ASSERT_TRUE(BuildScoringBatch(roped, {{table0, pos0, &t0}, {table0, pos0, &t2}}, &b).ok());
  EXPECT_EQ(b.rope_positions, (std::vector<int32_t>{0, 41}));
  EXPECT_EQ(b.rope_table_row, (std::vector<int32_t>{0, 0, 1, 1}));

  auto code = [&](const ScoringShape& s, std::vector<ScoringJob> jobs) {
    return BuildScoringBatch(s, jobs, &b).code();
  };
  const absl::StatusCode bad = absl::StatusCode::kInvalidArgument;
  ScoringTask wrong = t0;
  wrong.queries.push_back(1.0f);  // 3 floats for one query of 2
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
  wrong = t0;
  wrong.protect.pop_back();
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
  wrong = t0;
  wrong.k = -1;
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
  EXPECT_EQ(code(shape, {{table1, pos0, &t0}}), bad);  // one block cannot hold 3 tokens
  EXPECT_EQ(code(shape, {{table0, pos1, &t0}}), bad);  // positions of 1 token for 3
  EXPECT_EQ(code(shape, {{table0, pos0, nullptr}}), bad);
  ScoringShape even = shape;
  even.pool_kernel = 2;
  EXPECT_EQ(code(even, {{table0, pos0, &t0}}), bad);
  EXPECT_EQ(code(shape, {{table0, pos0, &t2}}), bad);  // rotated rows without a RoPE base
  wrong = t2;
  wrong.rotated_rows = 4;  // more than its 3 queries
  EXPECT_EQ(code(roped, {{table0, pos0, &wrong}}), bad);
  wrong = t2;
  wrong.rotate_to = -1;
  EXPECT_EQ(code(roped, {{table0, pos0, &wrong}}), bad);
  wrong = reserved;
  wrong.reserve.pop_back();  // a region of 2 slots for 3 tokens
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
  wrong = reserved;
  wrong.reserve_k = -1;
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
  wrong = t0;
  wrong.reserve_k = 2;  // picks for a region that is not there
  EXPECT_EQ(code(shape, {{table0, pos0, &wrong}}), bad);
}

TEST(PagedTwinScorerTest, RejectsAStoreOfAnotherShapeAndBlocksOutsideIt) {
  CpuKvStore store(4, 2, 2);
  PagedTwinScorer scorer(&store);
  ScoringTask t;
  t.num_queries = 1;
  t.queries = {1.0f, 0.0f};
  t.protect = {0, 0};
  t.k = 1;
  const std::vector<int32_t> pos = {0, 1};
  const std::vector<BlockId> inside = {1}, outside = {9};
  ScoringResult r;
  ScoringShape shape{2, 2, 1, {}, Pooling::kNone, 1};
  ASSERT_TRUE(scorer.Score(shape, {{inside, pos, &t}}, &r).ok());
  EXPECT_EQ(std::count(r.keep.begin(), r.keep.end(), 1), 1);
  EXPECT_EQ(scorer.Score(shape, {{outside, pos, &t}}, &r).code(),
            absl::StatusCode::kInvalidArgument);
  ScoringShape other = shape;
  other.head_dim = 4;
  EXPECT_EQ(scorer.Score(other, {{inside, pos, &t}}, &r).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace beaconkv

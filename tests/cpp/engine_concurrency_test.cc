// The thread-safety contract of Engine: calls from several threads are serialized by the
// engine's mutex, so two threads stepping one engine while a third adds requests finish every
// request exactly once, with the same outputs as a single-threaded run.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "block_manager/block_manager.h"
#include "core/policy.h"
#include "engine/compress_step.h"
#include "engine/engine.h"
#include "kernels/paged_attention_cpu.h"
#include "tests/cpp/random_model.h"

namespace beaconkv {
namespace {

Request MakeRequest(int64_t id) {
  Request r;
  r.id = id;
  for (int32_t t = 0; t < 3 + id % 7; ++t) r.prompt.push_back(1 + (id * 5 + t * 3) % 21);
  r.sampling.max_new_tokens = 12 + id % 9;
  r.sampling.ignore_eos = true;
  return r;
}

EngineConfig Config() {
  EngineConfig c;
  c.max_batch = 4;
  c.num_blocks = 1 + 40;  // tight: preemption happens
  c.num_threads = 1;
  c.verify_integrity = true;
  return c;
}

TEST(EngineConcurrencyTest, StepsFromTwoThreadsMatchOneThread) {
  constexpr int kRequests = 24;
  std::map<int64_t, std::vector<int32_t>> expected;
  {
    auto e = Engine::Create(test_model::RandomModel(3), Config());
    ASSERT_TRUE(e.ok()) << e.status();
    for (int64_t i = 0; i < kRequests; ++i) ASSERT_TRUE((*e)->AddRequest(MakeRequest(i)).ok());
    auto outs = (*e)->RunToCompletion();
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (const RequestOutput& o : *outs) expected[o.id] = o.output;
  }
  auto e = Engine::Create(test_model::RandomModel(3), Config());
  ASSERT_TRUE(e.ok()) << e.status();
  Engine& engine = **e;
  for (int64_t i = 0; i < kRequests / 2; ++i) ASSERT_TRUE(engine.AddRequest(MakeRequest(i)).ok());
  std::mutex mu;
  std::map<int64_t, std::vector<int32_t>> got;
  std::vector<std::string> errors;
  std::atomic<bool> adding_done{false};
  auto stepper = [&] {
    while (!adding_done.load() || engine.HasUnfinished()) {
      std::vector<RequestOutput> done;
      absl::Status s = engine.Step(&done);
      const std::lock_guard<std::mutex> lock(mu);
      if (!s.ok()) {
        errors.push_back(s.ToString());
        return;
      }
      for (RequestOutput& o : done) {
        if (!got.emplace(o.id, o.output).second)
          errors.push_back("request " + std::to_string(o.id) + " finished twice");
      }
    }
  };
  std::thread a(stepper), b(stepper);
  std::thread adder([&] {
    for (int64_t i = kRequests / 2; i < kRequests; ++i) {
      absl::Status s = engine.AddRequest(MakeRequest(i));
      if (!s.ok()) {
        const std::lock_guard<std::mutex> lock(mu);
        errors.push_back(s.ToString());
      }
    }
    adding_done.store(true);
  });
  adder.join();
  a.join();
  b.join();
  EXPECT_TRUE(errors.empty()) << errors.front();
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(engine.block_manager().NumFreeBlocks(), engine.block_manager().NumUsableBlocks());
  // Interleaving changes which requests share a batch, and greedy outputs do not depend on
  // the batch: every output equals the single-threaded one.
  for (const auto& [id, out] : expected) EXPECT_EQ(got[id], out) << "request " << id;
}

// The contract behind the engine's parallel compressions (PolicyState::LayersConcurrent):
// beacon's layers compressed from four threads at once give the keep-sets of one thread
// compressing them in turn (run under ThreadSanitizer in CI), with the defaults and with the
// paths that use more of the per-thread scratch (redundancy, blurred rows, a radius, pooled
// budgets).
TEST(PolicyConcurrencyTest, BeaconLayersCompressedAtOnceMatchInTurn) {
  constexpr int32_t kLayers = 4, kKvHeads = 2, kGroup = 2, kDim = 32, kPrompt = 40, kTokens = 300;
  PolicyGeometry geo;
  geo.num_layers = kLayers;
  geo.num_kv_heads = kKvHeads;
  geo.group_size = kGroup;
  geo.rope.head_dim = kDim;
  BeaconConfig defaults;
  defaults.budget = 96;
  defaults.n_recent = 16;
  BeaconConfig more = defaults;
  more.redundancy = 0.5;
  more.blur_speed = 0.02;
  more.beacon_radius = 0.05;
  BeaconConfig pooled = defaults;
  pooled.budget_mode = BudgetMode::kPooled;
  for (const BeaconConfig& config : {defaults, more, pooled}) {
    std::unique_ptr<PolicyState> in_turn, at_once;
    for (std::unique_ptr<PolicyState>* state : {&in_turn, &at_once}) {
      auto made = NewPolicyState(config, geo, kPrompt);
      ASSERT_TRUE(made.ok()) << made.status();
      *state = *std::move(made);
    }
    ASSERT_TRUE(at_once->LayersConcurrent());
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Queries in a few directions, as a head's are, so the draws have clusters to find.
    std::vector<std::vector<float>> centers(6, std::vector<float>(kDim));
    for (auto& c : centers)
      for (float& x : c) x = normal(rng);
    auto query = [&](std::vector<float>* q) {
      const std::vector<float>& c = centers[rng() % centers.size()];
      for (int32_t i = 0; i < kDim; ++i) q->push_back(c[i] + 0.2f * normal(rng));
    };
    for (int32_t p = 0; p < kTokens; ++p) {
      for (int32_t l = 0; l < kLayers; ++l) {
        for (int32_t h = 0; h < kKvHeads; ++h) {
          std::vector<float> pre, post;
          for (int32_t g = 0; g < kGroup; ++g) query(&pre), query(&post);
          for (PolicyState* state : {in_turn.get(), at_once.get()})
            ASSERT_TRUE(state->Observe(l, h, {p, pre.data(), post.data()}, nullptr).ok());
        }
      }
    }
    std::vector<float> keys(static_cast<size_t>(kLayers) * kKvHeads * kTokens * kDim);
    for (float& x : keys) x = normal(rng);
    std::vector<int32_t> positions(kTokens);
    for (int32_t i = 0; i < kTokens; ++i) positions[i] = i;
    auto heads_of = [&](int32_t l) {
      std::vector<HeadKeys> heads;
      for (int32_t h = 0; h < kKvHeads; ++h) {
        const float* k = keys.data() + (static_cast<size_t>(l) * kKvHeads + h) * kTokens * kDim;
        heads.push_back({k, positions.data(), kTokens});
      }
      return heads;
    };
    const std::vector<int32_t> due = {0, 1};
    std::vector<absl::StatusOr<std::vector<KeepSet>>> expected, got(kLayers);
    for (int32_t l = 0; l < kLayers; ++l)
      expected.push_back(in_turn->Compress(l, heads_of(l), due, kTokens - 1));
    std::vector<std::thread> threads;
    for (int32_t l = 0; l < kLayers; ++l)
      threads.emplace_back(
          [&, l] { got[l] = at_once->Compress(l, heads_of(l), due, kTokens - 1); });
    for (std::thread& t : threads) t.join();
    int64_t kept = 0;
    for (int32_t l = 0; l < kLayers; ++l) {
      ASSERT_TRUE(expected[l].ok()) << expected[l].status();
      ASSERT_TRUE(got[l].ok()) << got[l].status();
      ASSERT_EQ(got[l]->size(), expected[l]->size());
      for (size_t i = 0; i < got[l]->size(); ++i) {
        EXPECT_EQ((*got[l])[i].slots, (*expected[l])[i].slots) << "layer " << l << " head " << i;
        kept += static_cast<int64_t>((*got[l])[i].slots.size());
      }
    }
    // Every layer kept its budget (per head, or pooled over the layer's heads): it compressed.
    EXPECT_EQ(kept, int64_t{kLayers} * kKvHeads * config.budget);
  }
}

// The keep-sets of the policy's Compress on every head's keys, layer by layer (what
// HostKeepSets does on one thread, written out here as the reference).
absl::StatusOr<std::vector<KeepSet>> EachLayerInTurn(const BlockManager& bm,
                                                     const CpuKvStore& store, PolicyState& policy,
                                                     SequenceId id, int32_t position) {
  const KvShape& shape = bm.shape();
  std::vector<KeepSet> out;
  for (int32_t l = 0; l < shape.num_layers; ++l) {
    std::vector<int32_t> tokens;
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) tokens.push_back(*bm.RetainedTokens(id, l, h));
    const std::vector<int32_t> due = policy.DueHeads(l, tokens);
    if (due.empty()) continue;
    std::vector<std::vector<float>> keys(shape.num_kv_heads);
    std::vector<std::vector<int32_t>> positions(shape.num_kv_heads);
    std::vector<HeadKeys> heads;
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
      for (int32_t j = 0; j < tokens[h]; ++j) {
        const SlotRef slot = *bm.Slot(id, l, h, j);
        keys[h].insert(keys[h].end(), store.key(slot), store.key(slot) + shape.head_dim);
        positions[h].push_back(store.position(slot));
      }
      heads.push_back({keys[h].data(), positions[h].data(), tokens[h]});
    }
    absl::StatusOr<std::vector<KeepSet>> sets = policy.Compress(l, heads, due, position);
    if (!sets.ok()) return sets.status();
    out.insert(out.end(), sets->begin(), sets->end());
  }
  return out;
}

// A step's compressions of several sequences in one region (HostKeepSets over targets, a
// sequence, layer or head per task) give each sequence the keep-sets it gets alone, in turn:
// beacon (uniform: a head per task; with redundancy and blurred rows; pooled: a layer per
// task) beside policies whose layers run in turn (h2o, snapkv), on one pool.
TEST(HostKeepSetsTest, SequencesAtOnceMatchEachAlone) {
  const KvShape shape{/*num_layers=*/4, /*num_kv_heads=*/2, /*head_dim=*/32, /*block_size=*/8};
  constexpr int32_t kGroup = 2, kPrompt = 20, kSteps = 60;
  CpuKvStore store(400, shape.block_size, shape.head_dim);
  auto bm_or = BlockManager::Create({shape, 400, 0}, &store);
  ASSERT_TRUE(bm_or.ok()) << bm_or.status();
  BlockManager& bm = **bm_or;
  auto small = [](const std::string& name) {
    PolicyConfig c = *DefaultPolicyConfig(name);
    std::visit(
        [](auto& cfg) {
          if constexpr (requires { cfg.budget; }) cfg.budget = 24;
          if constexpr (requires { cfg.interval; }) cfg.interval = 8;
          if constexpr (requires { cfg.window; }) cfg.window = 4;
          if constexpr (std::is_same_v<std::decay_t<decltype(cfg)>, BeaconConfig>) {
            cfg.n_recent = 4;
            cfg.n_beacons = 8;
            cfg.buffer_max = 32;
            cfg.buffer_min = 16;
            cfg.n_sinks = 2;
          }
        },
        c);
    return c;
  };
  std::vector<PolicyConfig> configs = {small("beacon"), small("beacon"), small("beacon"),
                                       small("h2o"), small("snapkv")};
  std::get<BeaconConfig>(configs[1]).redundancy = 0.5;
  std::get<BeaconConfig>(configs[1]).blur_speed = 0.02;
  std::get<BeaconConfig>(configs[2]).budget_mode = BudgetMode::kPooled;
  const PolicyGeometry geo{shape.num_layers, shape.num_kv_heads, kGroup, {shape.head_dim, 1e4}};
  const auto n = static_cast<int64_t>(configs.size());
  std::vector<std::unique_ptr<PolicyState>> alone, together;
  for (const PolicyConfig& c : configs) {
    for (auto* states : {&alone, &together}) {
      auto made = NewPolicyState(c, geo, kPrompt);
      ASSERT_TRUE(made.ok()) << made.status();
      states->push_back(*std::move(made));
    }
  }
  EXPECT_TRUE(together[0]->HeadsConcurrent());
  EXPECT_FALSE(together[2]->HeadsConcurrent());  // pooled: the layer's heads share a budget
  EXPECT_FALSE(together[3]->LayersConcurrent());
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<SlotRef> slots(shape.num_heads_total());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(bm.AddSequence(i, kPrompt).ok());
    for (int32_t l = 0; l < shape.num_layers; ++l)
      for (int32_t h = 0; h < shape.num_kv_heads; ++h)
        for (int32_t t = 0; t < kPrompt; ++t)
          for (int32_t x = 0; x < shape.head_dim; ++x)
            store.key(*bm.Slot(i, l, h, t))[x] = normal(rng);
  }
  int64_t compressed = 0, partial = 0;
  for (int32_t step = 0; step < kSteps; ++step) {
    std::vector<CompressTarget> targets;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t position = *bm.NextPosition(i);
      ASSERT_TRUE(bm.AppendToken(i, absl::MakeSpan(slots)).ok());
      for (const SlotRef& s : slots)
        for (int32_t x = 0; x < shape.head_dim; ++x) store.key(s)[x] = normal(rng);
      for (int32_t l = 0; l < shape.num_layers; ++l) {
        for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
          std::vector<float> pre(kGroup * shape.head_dim), post(pre.size()), keys;
          for (float& x : pre) x = normal(rng);
          for (float& x : post) x = normal(rng);
          std::vector<int32_t> positions;
          const HeadKeys hk = GatherHead(bm, store, i, l, h, &keys, &positions);
          for (auto* states : {&alone, &together}) {
            PolicyState& p = *(*states)[i];
            ASSERT_TRUE(p.Observe(l, h, {position, pre.data(), post.data()},
                                  p.NeedsKeysOnObserve() ? &hk : nullptr)
                            .ok());
          }
        }
      }
      targets.push_back({i, together[i].get(), position});
      // Now and then one head loses its three oldest slots, so that a layer's heads fall due
      // on different steps (uniform budgets): due sets of one head.
      if (step % 7 == 3 && *bm.RetainedTokens(i, 2, 1) > 3) {
        KeepSet drop{2, 1, {}};
        for (int32_t j = 3; j < *bm.RetainedTokens(i, 2, 1); ++j) drop.slots.push_back(j);
        ASSERT_TRUE(bm.ApplyKeepSets(i, {drop}).ok());
      }
    }
    {
      const int threads = 2 + step % 2;  // two threads and three
      const std::vector<absl::StatusOr<std::vector<KeepSet>>> got =
          HostKeepSets(bm, store, targets, threads);
      ASSERT_EQ(static_cast<int64_t>(got.size()), n);
      for (int64_t i = 0; i < n; ++i) {
        const absl::StatusOr<std::vector<KeepSet>> expected =
            EachLayerInTurn(bm, store, *alone[i], i, targets[i].current_position);
        ASSERT_TRUE(expected.ok()) << expected.status();
        ASSERT_TRUE(got[i].ok()) << got[i].status();
        ASSERT_EQ(got[i]->size(), expected->size()) << "sequence " << i << " step " << step;
        for (size_t k = 0; k < got[i]->size(); ++k) {
          EXPECT_EQ((*got[i])[k].layer, (*expected)[k].layer);
          EXPECT_EQ((*got[i])[k].kv_head, (*expected)[k].kv_head);
          EXPECT_EQ((*got[i])[k].slots, (*expected)[k].slots)
              << "sequence " << i << " step " << step;
        }
        if (expected->empty()) continue;
        for (int32_t l = 0; l < shape.num_layers; ++l) {
          const auto in_layer = std::count_if(expected->begin(), expected->end(),
                                              [&](const KeepSet& k) { return k.layer == l; });
          partial += in_layer == 1;
        }
        ASSERT_TRUE(bm.ApplyKeepSets(i, *expected).ok());
        ++compressed;
      }
    }
  }
  EXPECT_GE(compressed, n * 3);  // every sequence compressed on several steps
  EXPECT_GT(partial, 0);         // and some layers had one due head of two
}

// A target whose sequence the pool does not hold gets its own error; the others their sets.
TEST(HostKeepSetsTest, UnknownSequenceFailsAloneAmongTargets) {
  const KvShape shape{/*num_layers=*/2, /*num_kv_heads=*/2, /*head_dim=*/32, /*block_size=*/8};
  CpuKvStore store(64, shape.block_size, shape.head_dim);
  auto bm = BlockManager::Create({shape, 64, 0}, &store);
  ASSERT_TRUE(bm.ok()) << bm.status();
  PolicyConfig config = *DefaultPolicyConfig("streaming");
  std::get<StreamingConfig>(config).budget = 8;
  std::get<StreamingConfig>(config).interval = 4;
  const PolicyGeometry geo{shape.num_layers, shape.num_kv_heads, 2, {shape.head_dim, 1e4}};
  auto a = NewPolicyState(config, geo, 12), b = NewPolicyState(config, geo, 12);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*bm)->AddSequence(1, 12).ok());
  for (const int threads : {1, 2}) {
    const std::vector<absl::StatusOr<std::vector<KeepSet>>> got =
        HostKeepSets(**bm, store, {{1, a->get(), 11}, {99, b->get(), 11}}, threads);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_TRUE(got[0].ok()) << got[0].status();
    EXPECT_EQ(got[0]->size(), 4u);  // 12 tokens >= 8 + 4 in every head: all four compressed
    EXPECT_FALSE(got[1].ok());
    EXPECT_NE(got[1].status().message().find("99"), std::string::npos) << got[1].status();
  }
}

// beacon observes each head inside the attention's region when that region is split over
// threads (PolicyState::ObserveConcurrent): 32 sequences whose heads never hold fewer than
// the budget's 288 tokens split every step's attention, and every token is generated and
// evicted as with one thread, which observes in turn after each layer (ThreadSanitizer in CI).
TEST(EngineConcurrencyTest, BeaconObservedBesideTheAttentionMatchesOneThread) {
  constexpr int32_t kSequences = 32, kPrompt = 300, kBudget = 288, kNew = 96;
  const ModelWeights model = test_model::RandomModel(5);
  const ModelConfig& mc = model.config;
  kernels::PagedAttentionShape shape{kSequences, mc.num_heads, mc.num_kv_heads, mc.head_dim, 16, 0};
  const std::vector<int32_t> fewest(kSequences * mc.num_kv_heads, kBudget);
  ASSERT_TRUE(kernels::PagedDecodeAttentionSplits(fewest.data(), shape, 2));
  BeaconConfig beacon;
  beacon.budget = kBudget;
  beacon.n_recent = 16;
  std::vector<std::vector<RequestOutput>> runs;
  for (const int threads : {1, 2}) {
    EngineConfig config;
    config.max_batch = kSequences;
    config.num_threads = threads;
    config.policy = beacon;
    auto e = Engine::Create(model, config);
    ASSERT_TRUE(e.ok()) << e.status();
    for (int64_t i = 0; i < kSequences; ++i) {
      Request r;
      r.id = i;
      for (int32_t t = 0; t < kPrompt; ++t) r.prompt.push_back(1 + (i * 7 + t * t) % 21);
      r.sampling.max_new_tokens = kNew;
      r.sampling.ignore_eos = true;
      r.record_evictions = true;
      const absl::Status added = (*e)->AddRequest(r);
      ASSERT_TRUE(added.ok()) << added;
    }
    auto outs = (*e)->RunToCompletion();
    ASSERT_TRUE(outs.ok()) << outs.status();
    std::sort(outs->begin(), outs->end(),
              [](const RequestOutput& a, const RequestOutput& b) { return a.id < b.id; });
    EXPECT_GT((*e)->stats().compressions, kSequences);
    EXPECT_EQ((*e)->stats().peak_running, kSequences);
    // Every layer of every decode step observed inside the attention's threads at two threads;
    // none at one.
    const int64_t layers_fused = (*e)->stats().layers_observed_in_attention;
    EXPECT_EQ(layers_fused, threads == 1 ? 0 : int64_t{kNew - 1} * mc.num_layers);
    runs.push_back(*std::move(outs));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  int64_t evicted = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) {
    EXPECT_EQ(runs[1][i].output, runs[0][i].output) << "sequence " << i;
    EXPECT_EQ(runs[1][i].evictions.evicted_at, runs[0][i].evictions.evicted_at) << "sequence " << i;
    evicted += runs[0][i].tokens_evicted;
  }
  EXPECT_GT(evicted, 0);
}

}  // namespace
}  // namespace beaconkv

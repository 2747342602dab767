// The thread-safety contract of Engine: calls from several threads are serialized by the
// engine's mutex, so two threads stepping one engine while a third adds requests finish every
// request exactly once, with the same outputs as a single-threaded run.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/policy.h"
#include "engine/engine.h"
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

}  // namespace
}  // namespace beaconkv

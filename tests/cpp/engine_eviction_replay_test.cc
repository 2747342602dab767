// Engine::ReplayEvictions and Request::record_evictions: the engine's own record of when each
// position left each head. Checked against what the cache holds after every step, against a
// served (batched, generated) run of the same tokens, and for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <variant>

#include "engine/engine.h"
#include "tests/cpp/random_model.h"

namespace beaconkv {
namespace {

using test_model::RandomModel;

constexpr int32_t kVocab = 23;  // RandomModel's

std::vector<int32_t> RandomTokens(uint32_t seed, int32_t n) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& t : v) t = tok(rng);
  return v;
}

BeaconConfig SmallBeacon(BudgetMode mode) {
  BeaconConfig b;
  b.budget = 12;
  b.interval = 4;
  b.n_recent = 2;
  b.n_beacons = 2;
  b.buffer_max = 8;
  b.buffer_min = 4;
  b.budget_mode = mode;
  return b;
}

std::vector<std::pair<std::string, PolicyConfig>> Policies() {
  SnapKvConfig snap;
  snap.budget = 10;
  snap.window = 3;
  snap.interval = 5;
  RpcConfig rpc;
  rpc.period = 12;
  rpc.ratio = 3;
  rpc.window = 4;
  return {{"streaming", StreamingConfig{.budget = 9, .n_sinks = 2, .interval = 1}},
          {"h2o", H2OConfig{.budget = 11}},
          {"tova", TovaConfig{.budget = 7, .interval = 3}},
          {"snapkv", snap},
          {"rpc", rpc},
          {"beacon", SmallBeacon(BudgetMode::kUniform)},
          {"beacon_pooled", SmallBeacon(BudgetMode::kPooled)}};
}

int64_t EvictedAt(const EvictionRecord& r, int32_t layer, int32_t kv_head, int32_t position) {
  return r.evicted_at[(static_cast<size_t>(layer) * r.num_kv_heads + kv_head) * r.num_positions +
                      position];
}

class EvictionReplayTest
    : public ::testing::TestWithParam<std::tuple<int /*policy*/, int32_t /*block_size*/>> {};

// The record against the cache itself: after every step, each head holds exactly the
// positions cached so far that the record has not yet evicted. Then replaying the generated
// tokens teacher forced gives the same record as generating them.
TEST_P(EvictionReplayTest, RecordIsWhatTheCacheHolds) {
  const auto policies = Policies();
  const auto& [name, policy] = policies[std::get<0>(GetParam())];
  EngineConfig c;
  c.block_size = std::get<1>(GetParam());
  c.policy = policy;
  c.verify_integrity = true;
  auto engine = *Engine::Create(RandomModel(3), c);
  Request r;
  r.id = 5;
  r.prompt = RandomTokens(11, 9);
  r.sampling.max_new_tokens = 60;
  r.sampling.ignore_eos = true;
  r.sampling.temperature = 1.0f;  // seeded: varied tokens, reproducible
  r.sampling.seed = 4;
  r.record_evictions = true;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  // Retained token counts per step, checked against the record once it exists.
  std::vector<std::pair<int32_t, std::vector<int32_t>>> held;  // (newest position, [L * KV])
  std::vector<RequestOutput> done;
  const KvShape shape = engine->block_manager().shape();
  while (engine->HasUnfinished()) {
    ASSERT_TRUE(engine->Step(&done).ok());
    if (!engine->block_manager().HasSequence(r.id)) break;
    std::vector<int32_t> counts;
    for (int32_t l = 0; l < shape.num_layers; ++l)
      for (int32_t g = 0; g < shape.num_kv_heads; ++g)
        counts.push_back(*engine->block_manager().RetainedTokens(r.id, l, g));
    held.emplace_back(*engine->block_manager().NextPosition(r.id) - 1, counts);
  }
  ASSERT_EQ(done.size(), 1u);
  const RequestOutput& out = done[0];
  const EvictionRecord& rec = out.evictions;
  ASSERT_EQ(rec.num_layers, shape.num_layers);
  ASSERT_EQ(rec.num_kv_heads, shape.num_kv_heads);
  ASSERT_EQ(rec.num_positions, 9 + 60 - 1);
  ASSERT_EQ(rec.evicted_at.size(),
            static_cast<size_t>(rec.num_layers) * rec.num_kv_heads * rec.num_positions);
  int64_t evicted = 0, first = kNeverEvicted;
  for (int32_t l = 0; l < rec.num_layers; ++l) {
    for (int32_t g = 0; g < rec.num_kv_heads; ++g) {
      for (int32_t p = 0; p < rec.num_positions; ++p) {
        const int64_t at = EvictedAt(rec, l, g, p);
        if (at == kNeverEvicted) continue;
        ++evicted;
        first = std::min(first, at);
        // Evicted at a decode step after the position was cached, before the last step.
        EXPECT_GE(at, std::max(p, out.prompt_len)) << name << " L" << l << " H" << g << " p" << p;
        EXPECT_LT(at, rec.num_positions - 1) << name;
      }
    }
  }
  EXPECT_EQ(evicted, out.tokens_evicted) << name;
  EXPECT_GT(evicted, 0) << name;
  EXPECT_EQ(rec.first_step, first) << name;
  for (const auto& [newest, counts] : held) {
    for (int32_t l = 0; l < rec.num_layers; ++l) {
      for (int32_t g = 0; g < rec.num_kv_heads; ++g) {
        int32_t alive = 0;
        for (int32_t p = 0; p <= newest; ++p) alive += EvictedAt(rec, l, g, p) > newest;
        EXPECT_EQ(counts[l * rec.num_kv_heads + g], alive)
            << name << " after the step of position " << newest << " L" << l << " H" << g;
      }
    }
  }
  // Teacher forcing the generated tokens replays the same evictions (another policy configured:
  // the replay's own is used).
  std::vector<int32_t> tokens = r.prompt;
  tokens.insert(tokens.end(), out.output.begin(), out.output.end() - 1);
  EngineConfig other = c;
  other.policy = FullConfig{};
  other.max_batch = 1;
  auto replayer = *Engine::Create(RandomModel(3), other);
  absl::StatusOr<EvictionRecord> replay = replayer->ReplayEvictions(tokens, 9, policy);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->evicted_at, rec.evicted_at) << name;
  EXPECT_EQ(replay->first_step, rec.first_step) << name;
  EXPECT_EQ(replay->num_positions, static_cast<int32_t>(tokens.size()));
  EXPECT_EQ(replayer->block_manager().NumFreeBlocks(), replayer->block_manager().NumUsableBlocks())
      << "blocks leaked";
  EXPECT_FALSE(replayer->HasUnfinished());
}

INSTANTIATE_TEST_SUITE_P(PoliciesAndBlockSizes, EvictionReplayTest,
                         ::testing::Combine(::testing::Range(0, 7), ::testing::Values(1, 3, 16)));

// A replay batched with other requests in a served run records the same evictions.
TEST(EvictionReplay, BatchedServingRunRecordsTheSame) {
  const PolicyConfig policy = SmallBeacon(BudgetMode::kPooled);
  const std::vector<int32_t> tokens = RandomTokens(21, 50);
  const int32_t prompt_len = 17;
  EngineConfig c;
  c.policy = policy;
  auto engine = *Engine::Create(RandomModel(5), c);
  for (int64_t id : {0, 1, 2}) {
    Request r;
    r.id = id;
    r.prompt = RandomTokens(30 + id, 5 + static_cast<int32_t>(id) * 7);
    r.sampling.max_new_tokens = 40;
    r.sampling.ignore_eos = true;
    if (id == 1) {
      r.prompt.assign(tokens.begin(), tokens.begin() + prompt_len);
      r.forced_output.assign(tokens.begin() + prompt_len, tokens.end());
      r.forced_output.push_back(0);  // never fed: its step caches the last position
      r.sampling.max_new_tokens = static_cast<int32_t>(r.forced_output.size());
      r.record_evictions = true;
    }
    ASSERT_TRUE(engine->AddRequest(r).ok());
  }
  absl::StatusOr<std::vector<RequestOutput>> outs = engine->RunToCompletion();
  ASSERT_TRUE(outs.ok()) << outs.status();
  const RequestOutput* served = nullptr;
  for (const RequestOutput& o : *outs) {
    if (o.id == 1) served = &o;
    if (o.id != 1) {
      EXPECT_TRUE(o.evictions.evicted_at.empty()) << "not asked for";
    }
  }
  ASSERT_NE(served, nullptr);
  absl::StatusOr<EvictionRecord> replay = engine->ReplayEvictions(tokens, prompt_len, policy);
  ASSERT_TRUE(replay.ok()) << replay.status();
  EXPECT_EQ(replay->evicted_at, served->evictions.evicted_at);
  EXPECT_EQ(replay->first_step, served->evictions.first_step);
  EXPECT_NE(replay->first_step, kNeverEvicted);
}

TEST(EvictionReplay, FullCacheNeverEvicts) {
  auto engine = *Engine::Create(RandomModel(2), EngineConfig{});
  const std::vector<int32_t> tokens = RandomTokens(1, 30);
  for (int32_t prompt_len : {1, 10, 30}) {  // 30: the whole sequence is the prompt
    absl::StatusOr<EvictionRecord> r = engine->ReplayEvictions(tokens, prompt_len, FullConfig{});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->num_positions, 30);
    EXPECT_EQ(r->first_step, kNeverEvicted);
    EXPECT_TRUE(std::all_of(r->evicted_at.begin(), r->evicted_at.end(),
                            [](int64_t at) { return at == kNeverEvicted; }));
  }
}

void ExpectError(const absl::Status& st, absl::StatusCode code, const std::string& words) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_NE(std::string(st.message()).find(words), std::string::npos)
      << "'" << st.message() << "' does not say '" << words << "'";
}

TEST(EvictionReplay, BadInputIsAClearError) {
  EngineConfig c;
  c.max_model_len = 40;
  auto engine = *Engine::Create(RandomModel(1, 64), c);
  const std::vector<int32_t> tokens = RandomTokens(2, 20);
  const PolicyConfig stream = StreamingConfig{.budget = 6, .n_sinks = 2};
  ExpectError(engine->ReplayEvictions({}, 1, stream).status(), absl::StatusCode::kInvalidArgument,
              "empty");
  ExpectError(engine->ReplayEvictions(tokens, 0, stream).status(),
              absl::StatusCode::kInvalidArgument, "prompt_len 0 is outside [1, 20]");
  ExpectError(engine->ReplayEvictions(tokens, 21, stream).status(),
              absl::StatusCode::kInvalidArgument, "prompt_len 21");
  std::vector<int32_t> bad = tokens;
  bad[12] = kVocab;
  ExpectError(engine->ReplayEvictions(bad, 5, stream).status(), absl::StatusCode::kInvalidArgument,
              "outside the vocabulary");
  bad[12] = -1;
  ExpectError(engine->ReplayEvictions(bad, 5, stream).status(), absl::StatusCode::kInvalidArgument,
              "outside the vocabulary");
  ExpectError(engine->ReplayEvictions(RandomTokens(3, 40), 5, stream).status(),
              absl::StatusCode::kInvalidArgument, "max_model_len >= 41");
  ExpectError(
      engine->ReplayEvictions(tokens, 5, StreamingConfig{.budget = 2, .n_sinks = 3}).status(),
      absl::StatusCode::kInvalidArgument, "n_sinks");
  BeaconConfig beacon = SmallBeacon(BudgetMode::kUniform);
  beacon.buffer_min = beacon.buffer_max;
  ExpectError(engine->ReplayEvictions(tokens, 5, beacon).status(),
              absl::StatusCode::kInvalidArgument, "buffer_min");
  EXPECT_FALSE(engine->HasUnfinished()) << "a refused replay leaves nothing queued";

  // A queued request: the replay would share the engine, so it is refused, and a request
  // reusing a queued sequence id is refused as before.
  Request r;
  r.id = 0;
  r.prompt = {1, 2, 3};
  r.sampling.max_new_tokens = 3;
  r.record_evictions = true;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  ExpectError(engine->ReplayEvictions(tokens, 5, stream).status(),
              absl::StatusCode::kFailedPrecondition, "1 requests are unfinished");
  ExpectError(engine->AddRequest(r), absl::StatusCode::kInvalidArgument,
              "request id 0 is already queued");
  absl::StatusOr<std::vector<RequestOutput>> outs = engine->RunToCompletion();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_EQ(outs->at(0).evictions.num_positions, 3 + 3 - 1);

  // Idle again: the replay runs, and leaves the pool as it found it.
  absl::StatusOr<EvictionRecord> ok = engine->ReplayEvictions(tokens, 5, stream);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->first_step, 6);  // the step whose token makes budget + interval = 7
  EXPECT_EQ(engine->block_manager().NumFreeBlocks(), engine->block_manager().NumUsableBlocks());
}

TEST(EvictionReplay, APoolTooSmallIsResourceExhausted) {
  EngineConfig c;
  c.block_size = 4;
  // 2 layers x 2 kv heads: 3 blocks per head = 12 tokens a head, for a 30-token sequence.
  c.num_blocks = 1 + 4 * 3;
  auto engine = *Engine::Create(RandomModel(1), c);
  ExpectError(engine->ReplayEvictions(RandomTokens(4, 30), 8, FullConfig{}).status(),
              absl::StatusCode::kResourceExhausted, "cannot hold it");
  EXPECT_FALSE(engine->HasUnfinished());
  EXPECT_EQ(engine->block_manager().NumFreeBlocks(), engine->block_manager().NumUsableBlocks());
  // With eviction the same pool holds it.
  absl::StatusOr<EvictionRecord> r =
      engine->ReplayEvictions(RandomTokens(4, 30), 8, StreamingConfig{.budget = 8, .n_sinks = 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first_step, 8);
}

}  // namespace
}  // namespace beaconkv

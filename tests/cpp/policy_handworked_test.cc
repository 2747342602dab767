// One small case per policy whose keep-set is worked out by hand (see the comments). Every
// case also runs with the keys stored in a shuffled slot order: the kept POSITIONS must not
// change. "Hot" keys get logits of ~70, so softmax mass is ~1 on them and exactly equal tiny
// values on the zero ("cold") keys, which then tie and fall to the recency rule.
#include <vector>

#include "core/policy.h"
#include "core/rope.h"
#include "gtest/gtest.h"
#include "policy_test_util.h"

namespace beaconkv {
namespace {

using ::beaconkv::testing::HeadCase;
using ::beaconkv::testing::KeptPositions;
using Positions = std::vector<int32_t>;

const std::vector<float> kZero = {0, 0};
const std::vector<float> kE1 = {10, 0};
const std::vector<float> kE2 = {0, 10};

void ExpectKept(const PolicyConfig& config, const HeadCase& c, const Positions& expected) {
  for (uint32_t seed : {0u, 7u, 12345u}) {
    SCOPED_TRACE(::testing::Message() << "slot shuffle seed " << seed);
    absl::StatusOr<Positions> kept = KeptPositions(config, c, seed);
    ASSERT_TRUE(kept.ok()) << kept.status();
    EXPECT_EQ(*kept, expected);
  }
}

TEST(PolicyHandWorked, FullKeepsEverything) {
  HeadCase c;
  for (int32_t p = 0; p < 5; ++p) c.AddKey(p, {static_cast<float>(p), 1});
  ExpectKept(FullConfig{}, c, {0, 1, 2, 3, 4});
}

TEST(PolicyHandWorked, StreamingKeepsSinksAndNewest) {
  HeadCase c;
  for (int32_t p = 0; p < 9; ++p) c.AddKey(p, {1, static_cast<float>(p)});
  StreamingConfig cfg;
  cfg.budget = 5;
  cfg.n_sinks = 2;
  ExpectKept(cfg, c, {0, 1, 6, 7, 8});
}

// Keys: k1 = e1, k5 = e2, the rest zero. Queries at positions 0..4 point at e1, 5..7 at e2.
// Accumulated (causal): k0 = 1 (query 0 sees only k0), k1 ~ 4 (queries 1..4), k5 ~ 3
// (queries 5..7), the rest ~0. recent = 2 -> {6, 7}; heavy 2 -> {1, 5}.
HeadCase AccumulationCase() {
  HeadCase c;
  for (int32_t p = 0; p < 8; ++p) c.AddKey(p, p == 1 ? kE1 : p == 5 ? kE2 : kZero);
  for (int32_t p = 0; p < 8; ++p) c.AddStep(p, p < 5 ? kE1 : kE2, p < 5 ? kE1 : kE2);
  return c;
}

TEST(PolicyHandWorked, H2OAccumulatesCausalAttention) {
  H2OConfig cfg;
  cfg.budget = 4;
  cfg.recent_fraction = 0.5;
  ExpectKept(cfg, AccumulationCase(), {1, 5, 6, 7});
}

// Same data: the last query (e2) sees k5 ~1 and equal tiny mass elsewhere, so TOVA keeps
// k5 and the three newest others: {4, 6, 7} -- it forgets k1, which H2O keeps.
TEST(PolicyHandWorked, TovaUsesOnlyTheLastQuery) {
  TovaConfig cfg;
  cfg.budget = 4;
  ExpectKept(cfg, AccumulationCase(), {4, 5, 6, 7});
}

TEST(PolicyHandWorked, TovaAveragesTheGroup) {
  // Group of 2: head 0 points at k1 with logit ~70, head 1 at k2 with logit ~70. Mean over
  // the group gives k1 = k2 = 0.5; budget 2 keeps exactly those two.
  HeadCase c;
  c.group_size = 2;
  for (int32_t p = 0; p < 6; ++p) c.AddKey(p, p == 1 ? kE1 : p == 2 ? kE2 : kZero);
  c.AddStep(5, {10, 0, 0, 10}, {10, 0, 0, 10});
  TovaConfig cfg;
  cfg.budget = 2;
  ExpectKept(cfg, c, {1, 2});
}

// Window queries: q6 -> k1 (e1), q7 -> k3 (e2). Softmax over the non-window keys 0..5 and
// mean over the 2 queries: k1 = k3 = 0.5, the rest tiny and equal.
HeadCase SnapCase() {
  HeadCase c;
  for (int32_t p = 0; p < 8; ++p) c.AddKey(p, p == 1 ? kE1 : p == 3 ? kE2 : kZero);
  c.AddStep(6, kE1, kE1);
  c.AddStep(7, kE2, kE2);
  return c;
}

TEST(PolicyHandWorked, SnapKvWindowImportance) {
  SnapKvConfig cfg;
  cfg.budget = 4;
  cfg.window = 2;
  cfg.pool_kernel = 1;
  ExpectKept(cfg, SnapCase(), {1, 3, 6, 7});
}

TEST(PolicyHandWorked, SnapKvMaxPoolingSpreadsToNeighbours) {
  // maxpool 3 over [t, .5, t, .5, t, t]: indexes 0..4 all become exactly 0.5; the tie goes
  // to the two most recent, 3 and 4.
  SnapKvConfig cfg;
  cfg.budget = 4;
  cfg.window = 2;
  cfg.pool_kernel = 3;
  ExpectKept(cfg, SnapCase(), {3, 4, 6, 7});
}

TEST(PolicyHandWorked, SnapKvMaxOfLogitsOverGroup) {
  // Group 2, one window query per head. Head 0 -> k1 (logit ~70), head 1 -> k2 (logit ~35).
  // Max of logits then ONE softmax: k1 ~ 1, k2 ~ e^-35 > the cold keys; budget 3 keeps
  // k1, k2 + window {5}. (Mean of probabilities would give k1 = k2 = 0.5, same set; but the
  // max-logit softmax gives k2 far below k1, checked in scoring_test.)
  HeadCase c;
  c.group_size = 2;
  for (int32_t p = 0; p < 6; ++p) c.AddKey(p, p == 1 ? kE1 : p == 2 ? kE2 : kZero);
  c.AddStep(5, {10, 0, 0, 5}, {10, 0, 0, 5});
  SnapKvConfig cfg;
  cfg.budget = 3;
  cfg.window = 1;
  cfg.pool_kernel = 1;
  ExpectKept(cfg, c, {1, 2, 5});
}

// Keys k0 = k1 = k2 = e1, k3 = e2, k4 = -e1, k5 = -e2; zero queries (uniform importance).
// Cosine rows after zeroing the diagonal and each row's newest duplicate:
//   row0 [0 1 0 0 -1 0], row1 [1 0 0 0 -1 0], row2 [1 0 0 0 -1 0], row3 [0 0 0 0 0 -1],
//   row4 [-1 -1 -1 0 0 0], row5 [0 0 0 -1 0 0]
// column sums: [1, 0, -1, -1, -3, -1] -> redundancy ranks k0 > k1 > k2 = k3. Window {4, 5}.
HeadCase RedundancyCase() {
  HeadCase c;
  const std::vector<std::vector<float>> k = {{1, 0}, {1, 0}, {1, 0}, {0, 1}, {-1, 0}, {0, -1}};
  for (int32_t p = 0; p < 6; ++p) c.AddKey(p, k[p]);
  c.AddStep(4, kZero, kZero);
  c.AddStep(5, kZero, kZero);
  return c;
}

TEST(PolicyHandWorked, RkvDropsOlderDuplicates) {
  RkvConfig cfg;
  cfg.budget = 4;
  cfg.window = 2;
  ExpectKept(cfg, RedundancyCase(), {2, 3, 4, 5});  // the newest duplicate k2 survives
  cfg.budget = 3;
  ExpectKept(cfg, RedundancyCase(), {3, 4, 5});  // k2 = k3 tie -> the more recent, k3
}

TEST(PolicyHandWorked, RpcAveragesOverTheLayer) {
  // prompt 2, window R = 2, period P = 4, ratio 2 -> keep T = 2 of the region {2..5}.
  // Two kv heads with the same tokens. Head 0: both selectors -> k3; head 1: q6 -> k4,
  // q7 -> k5. Layer mean: k3 = 1, k4 = k5 = 0.5 (exactly), rest tiny: keep k3 and the more
  // recent of k4/k5.
  PolicyGeometry geo;
  geo.num_layers = 1;
  geo.num_kv_heads = 2;
  geo.group_size = 1;
  geo.rope = testing::TestRope(2);
  RpcConfig cfg;
  cfg.period = 4;
  cfg.window = 2;
  cfg.ratio = 2;
  cfg.pool_kernel = 1;
  auto state_or = NewPolicyState(cfg, geo, /*prompt_len=*/2);
  ASSERT_TRUE(state_or.ok()) << state_or.status();
  PolicyState& state = **state_or;
  std::vector<float> keys0, keys1;
  std::vector<int32_t> pos;
  for (int32_t p = 0; p < 8; ++p) {
    pos.push_back(p);
    const std::vector<float>& a = p == 3 ? kE1 : kZero;
    const std::vector<float>& b = p == 4 ? kE1 : p == 5 ? kE2 : kZero;
    keys0.insert(keys0.end(), a.begin(), a.end());
    keys1.insert(keys1.end(), b.begin(), b.end());
  }
  ASSERT_TRUE(state.Observe(0, 0, {6, kE1.data(), kE1.data()}, nullptr).ok());
  ASSERT_TRUE(state.Observe(0, 0, {7, kE1.data(), kE1.data()}, nullptr).ok());
  ASSERT_TRUE(state.Observe(0, 1, {6, kE1.data(), kE1.data()}, nullptr).ok());
  ASSERT_TRUE(state.Observe(0, 1, {7, kE2.data(), kE2.data()}, nullptr).ok());
  const std::vector<int32_t> tokens = {7, 7};
  EXPECT_TRUE(state.DueHeads(0, tokens).empty());  // fires at prompt + R + P = 8
  const std::vector<int32_t> full = {8, 8};
  ASSERT_EQ(state.DueHeads(0, full), (std::vector<int32_t>{0, 1}));
  const HeadKeys heads[2] = {{keys0.data(), pos.data(), 8}, {keys1.data(), pos.data(), 8}};
  auto keep = state.Compress(0, heads, std::vector<int32_t>{0, 1}, 7);
  ASSERT_TRUE(keep.ok()) << keep.status();
  ASSERT_EQ(keep->size(), 2u);
  for (const KeepSet& k : *keep) EXPECT_EQ(k.slots, (std::vector<int32_t>{0, 1, 3, 5, 6, 7}));
  // Second round: prompt 2 + kept 2 + R 2 + P 4 = 10, and it keeps 2T = 4.
  EXPECT_TRUE(state.DueHeads(0, std::vector<int32_t>{9, 9}).empty());
  EXPECT_EQ(state.DueHeads(0, std::vector<int32_t>{10, 10}).size(), 2u);
}

// Beacon. head_dim 2, group 1, prompt 1, budget 5, n_recent 2, 2 beacons, buffer 4 -> 2.
// Pre-RoPE history: a = e1 at every step except step 2, which is the planted b = 10 * e2.
// FPS keeps [a(step 0), b] at every reduction, so the beacons are {a, b} rotated to t = 9.
// Keys: k3 = 10 * R_9 b_hat (only the beacon b attends to it), k5 = 10 * R_9 a (the recent
// queries, 10 * R_9 a, attend to it), the rest zero.
// Beacon keeps prompt {0}, recent {8, 9}, then k3 and k5. SnapKV with the same window and
// budget sees only the recent queries: k5, then recency {6, 7}: it evicts k3.
HeadCase BeaconCase() {
  HeadCase c;
  c.prompt_len = 1;
  c.current_position = 9;
  auto rope = Rope::Create(testing::TestRope(2));
  std::vector<float> rb(2), ra(2);
  rope->Rotate(std::vector<float>{0, 10}.data(), 9, rb.data());
  rope->Rotate(std::vector<float>{10, 0}.data(), 9, ra.data());
  for (int32_t p = 0; p < 10; ++p) c.AddKey(p, p == 3 ? rb : p == 5 ? ra : kZero);
  for (int32_t p = 0; p < 10; ++p) {
    const std::vector<float> pre = p == 2 ? std::vector<float>{0, 10} : std::vector<float>{1, 0};
    c.AddStep(p, pre, ra);
  }
  return c;
}

// The small beacon the hand-worked cases share: scored selection (coverage:
// BeaconCoverageLayerKeepsAnEvenSpread), 2 recent queries, 2 beacons from a 4-query buffer, no
// sinks.
BeaconConfig SmallBeacon(int32_t budget) {
  BeaconConfig cfg;
  cfg.coverage_layers = 0;
  cfg.budget = budget;
  cfg.n_recent = 2;
  cfg.n_beacons = 2;
  cfg.buffer_max = 4;
  cfg.buffer_min = 2;
  cfg.n_sinks = 0;
  return cfg;
}

TEST(PolicyHandWorked, BeaconKeepsWhatTheBeaconsPredict) {
  BeaconConfig cfg = SmallBeacon(5);
  cfg.interval = 1;
  cfg.protect_prompt = true;  // the prompt (position 0) fits beside the recent window
  ExpectKept(cfg, BeaconCase(), {0, 3, 5, 8, 9});

  SnapKvConfig snap;
  snap.budget = 5;
  snap.window = 2;
  snap.pool_kernel = 1;
  ExpectKept(snap, BeaconCase(), {5, 6, 7, 8, 9});
}

TEST(PolicyHandWorked, BeaconCoverageLayerKeepsAnEvenSpread) {
  // Layer 0 as a coverage layer: protected {0 (prompt), 8, 9}; 2 free slots become 2 strata
  // of the free positions 1..7, [1, 4.5) and [4.5, 8): their first tokens 1 and 5, not the
  // beacon-predicted 3.
  BeaconConfig cfg = SmallBeacon(5);
  cfg.interval = 1;
  cfg.protect_prompt = true;
  cfg.coverage_layers = 1;
  ExpectKept(cfg, BeaconCase(), {0, 1, 5, 8, 9});
  // Budget 7: strata [1, 2.75) [2.75, 4.5) [4.5, 6.25) [6.25, 8) -> 1, 3, 5, 7.
  cfg.budget = 7;
  ExpectKept(cfg, BeaconCase(), {0, 1, 3, 5, 7, 8, 9});
}

TEST(PolicyHandWorked, BeaconWithoutBeaconsIsRecentOnly) {
  BeaconConfig cfg = SmallBeacon(5);
  cfg.n_beacons = 0;
  cfg.protect_prompt = true;
  ExpectKept(cfg, BeaconCase(), {0, 5, 7, 8, 9});
}

// Beacon with redundancy: keys k0 = e2, k1 = k2 = k3 = e1, k4 = -e2, k5 = -e1, zero queries
// (every score equal). Cosine rows after zeroing the diagonal and each row's newest duplicate
// (threshold 0.5): row0 [0 0 0 0 -1 0], row1 [0 0 1 0 0 -1], row2 [0 1 0 0 0 -1],
// row3 [0 1 0 0 0 -1], row4 [-1 0 0 0 0 0], row5 [0 -1 -1 -1 0 0]; column sums
// [-1, 1, 0, -1, -1, -3]. Recent {4, 5}; two more slots: equal scores keep the newest {2, 3},
// the redundancy term keeps the least redundant {0, 3} (k1, k2 duplicate k3).
TEST(PolicyHandWorked, BeaconRedundancyKeepsDistinctKeys) {
  HeadCase c;
  const std::vector<std::vector<float>> k = {{0, 1}, {1, 0}, {1, 0}, {1, 0}, {0, -1}, {-1, 0}};
  for (int32_t p = 0; p < 6; ++p) c.AddKey(p, k[p]);
  for (int32_t p = 0; p < 6; ++p) c.AddStep(p, kZero, kZero);
  BeaconConfig cfg = SmallBeacon(4);
  cfg.interval = 1;
  ExpectKept(cfg, c, {2, 3, 4, 5});
  cfg.redundancy = 1.0;
  ExpectKept(cfg, c, {0, 3, 4, 5});
  cfg.coverage_layers = 1;  // a coverage layer keeps its even sample and ignores redundancy
  ExpectKept(cfg, c, {0, 2, 4, 5});
}

TEST(PolicyHandWorked, BeaconUnprotectedPromptKeepsSinks) {
  BeaconConfig cfg = SmallBeacon(5);
  cfg.protect_prompt = false;
  cfg.n_sinks = 1;
  HeadCase c = BeaconCase();
  c.prompt_len = 4;  // would fit, but protection is off: only the sink (position 0) stays
  ExpectKept(cfg, c, {0, 3, 5, 8, 9});
  cfg.protect_prompt = true;  // prompt {0..3} + recent {8, 9} = 6 > budget 5: falls back
  ExpectKept(cfg, c, {0, 3, 5, 8, 9});
  c.prompt_len = 3;  // prompt {0, 1, 2} + recent {8, 9} = 5 = budget: all protected
  ExpectKept(cfg, c, {0, 1, 2, 8, 9});
}

// BeaconCase stretched to n tokens: the beacon (from the pre-RoPE query at position 2) reads
// k3, the recent queries read k5, and every other key is cold.
HeadCase LongBeaconCase(int32_t n) {
  HeadCase c;
  c.prompt_len = 4;
  c.current_position = n - 1;
  auto rope = Rope::Create(testing::TestRope(2));
  std::vector<float> rb(2), ra(2);
  rope->Rotate(std::vector<float>{0, 10}.data(), n - 1, rb.data());
  rope->Rotate(std::vector<float>{10, 0}.data(), n - 1, ra.data());
  for (int32_t p = 0; p < n; ++p) c.AddKey(p, p == 3 ? rb : p == 5 ? ra : kZero);
  for (int32_t p = 0; p < n; ++p) {
    const std::vector<float> pre = p == 2 ? std::vector<float>{0, 10} : std::vector<float>{1, 0};
    c.AddStep(p, pre, ra);
  }
  return c;
}

Positions Plus(Positions head, int32_t from, int32_t to) {  // head + [from, to]
  for (int32_t p = from; p <= to; ++p) head.push_back(p);
  return head;
}

// Prompt slots: 30 tokens, prompt {0..3} unprotected, recent {28, 29}. At budget 18 (16 free
// slots) score alone keeps 3 and 5, then the 14 newest cold tokens {14..27} (ties go to the
// newest). prompt_slots=4 gets 16 / 8 = 2 slots: the best prompt tokens, 3 and then 2 (the
// newest of the tied cold ones), go first; 5 and 13 cold tokens {15..27} fill the rest. At
// budget 26 (24 free) it gets 3 slots: 3, 2, 1, then 5 and {8..27}. One slot changes nothing
// there: 3 is the head's best token anyway. A coverage layer ignores the knob.
TEST(PolicyHandWorked, BeaconPromptSlotsKeepTheBestPromptTokens) {
  const HeadCase c = LongBeaconCase(30);
  BeaconConfig cfg = SmallBeacon(18);
  cfg.interval = 1;
  cfg.prompt_slots = 0;
  ExpectKept(cfg, c, Plus({3, 5}, 14, 29));
  cfg.prompt_slots = 4;
  ExpectKept(cfg, c, Plus({2, 3, 5}, 15, 29));
  cfg.budget = 26;
  ExpectKept(cfg, c, Plus({1, 2, 3, 5}, 8, 29));
  cfg.prompt_slots = 1;
  ExpectKept(cfg, c, Plus({3, 5}, 6, 29));
  cfg.prompt_slots = 0;
  ExpectKept(cfg, c, Plus({3, 5}, 6, 29));
  // Fewer than 8 free slots take none: budget 9 leaves 7.
  cfg.budget = 9;
  cfg.prompt_slots = 4;
  ExpectKept(cfg, c, Plus({3, 5}, 23, 29));
  BeaconConfig coverage = cfg;
  coverage.coverage_layers = 1;
  cfg.prompt_slots = 0;
  cfg.coverage_layers = 1;
  absl::StatusOr<Positions> with = KeptPositions(coverage, c, 0);
  absl::StatusOr<Positions> without = KeptPositions(cfg, c, 0);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(*with, *without);
}

// With pooled budgets the slots are taken per head, out of the layer's budget: the same
// tokens as uniform where there is one head.
TEST(PolicyHandWorked, BeaconPromptSlotsWithPooledBudgets) {
  const HeadCase c = LongBeaconCase(30);
  BeaconConfig cfg = SmallBeacon(18);
  cfg.interval = 1;
  cfg.budget_mode = BudgetMode::kPooled;
  cfg.prompt_slots = 4;
  ExpectKept(cfg, c, Plus({2, 3, 5}, 15, 29));
  cfg.prompt_slots = 0;
  ExpectKept(cfg, c, Plus({3, 5}, 14, 29));
}

TEST(PolicyHandWorked, BeaconPooledBudgetFavoursTheFlatHead) {
  // Two kv heads, budget 3 each (layer: 6), n_recent 1, no beacons, prompt 0.
  // Head 0's last query points at k1 only (peaked); head 1's is zero (flat: every key 1/6).
  // Normalised over the unprotected tokens 0..4: head 0 k1 ~ 1, others ~0; head 1: 0.2 each.
  // Protected: position 5 in each head (2). Free: 4 -> head 0 k1, then head 1 {4, 3, 2}.
  PolicyGeometry geo;
  geo.num_layers = 1;
  geo.num_kv_heads = 2;
  geo.rope = testing::TestRope(2);
  BeaconConfig cfg = SmallBeacon(3);
  cfg.n_recent = 1;
  cfg.n_beacons = 0;
  cfg.budget_mode = BudgetMode::kPooled;
  auto state_or = NewPolicyState(cfg, geo, 0);
  ASSERT_TRUE(state_or.ok()) << state_or.status();
  PolicyState& state = **state_or;
  std::vector<float> keys0, keys1;
  std::vector<int32_t> pos;
  for (int32_t p = 0; p < 6; ++p) {
    pos.push_back(p);
    const std::vector<float>& a = p == 1 ? kE1 : kZero;
    keys0.insert(keys0.end(), a.begin(), a.end());
    keys1.insert(keys1.end(), {static_cast<float>(p), 1.0f});
  }
  ASSERT_TRUE(state.Observe(0, 0, {5, kE1.data(), kE1.data()}, nullptr).ok());
  ASSERT_TRUE(state.Observe(0, 1, {5, kZero.data(), kZero.data()}, nullptr).ok());
  EXPECT_TRUE(state.DueHeads(0, std::vector<int32_t>{6, 5}).empty());  // 11 < (3+128)*2
  const HeadKeys heads[2] = {{keys0.data(), pos.data(), 6}, {keys1.data(), pos.data(), 6}};
  auto keep = state.Compress(0, heads, std::vector<int32_t>{0, 1}, 5);
  ASSERT_TRUE(keep.ok()) << keep.status();
  ASSERT_EQ(keep->size(), 2u);
  EXPECT_EQ((*keep)[0].slots, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ((*keep)[1].slots, (std::vector<int32_t>{2, 3, 4, 5}));
}

}  // namespace
}  // namespace beaconkv

// The policy registry: one entry per policy, knob defaults equal to the config structs',
// typed and range-checked knobs, and the one way a command line becomes a configuration.
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "core/policy.h"
#include "core/policy_config.h"
#include "gtest/gtest.h"

namespace beaconkv {
namespace {

bool Contains(const absl::Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

PolicyConfig Build(PolicyRequest request) {
  absl::StatusOr<PolicyConfig> c = BuildPolicyConfig(request);
  EXPECT_TRUE(c.ok()) << request.spec << ": " << c.status();
  return c.ok() ? *c : PolicyConfig(FullConfig{});
}

absl::Status BuildError(PolicyRequest request) { return BuildPolicyConfig(request).status(); }

TEST(PolicyRegistryTest, OneEntryPerPolicyWithTheStructDefaults) {
  ASSERT_EQ(PolicySpecs().size(), PolicyNames().size());
  for (size_t i = 0; i < PolicyNames().size(); ++i) {
    const PolicySpec& spec = PolicySpecs()[i];
    EXPECT_EQ(spec.name, PolicyNames()[i]);
    EXPECT_EQ(spec.budgeted, spec.name != "full") << spec.name;
    absl::StatusOr<PolicyConfig> defaults = DefaultPolicyConfig(spec.name);
    ASSERT_TRUE(defaults.ok());
    EXPECT_EQ(&SpecOf(*defaults), &spec);
    for (const KnobSpec& k : spec.knobs) {
      absl::StatusOr<KnobValue> v = GetKnob(*defaults, k.name);
      ASSERT_TRUE(v.ok()) << spec.name << "." << k.name;
      EXPECT_EQ(*v, k.default_value) << spec.name << "." << k.name;
      EXPECT_EQ(k.type == KnobType::kChoice, !k.choices.empty()) << k.name;
      // Setting the default back is always accepted.
      PolicyConfig c = *defaults;
      EXPECT_TRUE(SetKnob(c, k.name, k.default_value).ok()) << spec.name << "." << k.name;
    }
    EXPECT_EQ(spec.FindKnob("budget") != nullptr, spec.budgeted && spec.name != "rpc") << spec.name;
  }
  EXPECT_EQ(std::get<int64_t>(*GetKnob(BeaconConfig{}, "n_recent")), 48);
  EXPECT_EQ(std::get<std::string>(*GetKnob(RpcConfig{}, "pooling")), "avg");
  EXPECT_EQ(std::get<double>(*GetKnob(RkvConfig{}, "lambda_")), 0.1);
  EXPECT_FALSE(FindPolicySpec("lru").ok());
}

TEST(PolicyRegistryTest, SetKnobChecksNameTypeAndRange) {
  PolicyConfig c = BeaconConfig{};
  ASSERT_TRUE(SetKnob(c, "n_beacons", KnobValue(std::string("8"))).ok());
  ASSERT_TRUE(SetKnob(c, "protect_prompt", KnobValue(std::string("true"))).ok());
  ASSERT_TRUE(SetKnob(c, "budget_mode", KnobValue(std::string("pooled"))).ok());
  const BeaconConfig& b = std::get<BeaconConfig>(c);
  EXPECT_EQ(b.n_beacons, 8);
  EXPECT_TRUE(b.protect_prompt);
  EXPECT_EQ(b.budget_mode, BudgetMode::kPooled);

  absl::Status s = SetKnob(c, "window", KnobValue(int64_t{3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "policy beacon has no knob 'window'")) << s;
  s = SetKnob(c, "n_beacons", KnobValue(std::string("abc")));
  EXPECT_TRUE(Contains(s, "knob 'n_beacons' = 'abc': expected int")) << s;
  s = SetKnob(c, "n_beacons", KnobValue(true));
  EXPECT_TRUE(Contains(s, "expected int")) << s;
  s = SetKnob(c, "budget", KnobValue(int64_t{1} << 40));
  EXPECT_TRUE(Contains(s, "knob 'budget' = 1099511627776 is outside [1, 2147483647]")) << s;
  s = SetKnob(c, "budget_mode", KnobValue(std::string("shared")));
  EXPECT_TRUE(Contains(s, "expected one of uniform, pooled")) << s;
  EXPECT_EQ(std::get<BeaconConfig>(c).budget_mode, BudgetMode::kPooled);  // unchanged

  PolicyConfig r = RkvConfig{};
  EXPECT_TRUE(SetKnob(r, "lambda_", KnobValue(int64_t{1})).ok());  // an int is a float
  EXPECT_FALSE(SetKnob(r, "lambda_", KnobValue(1.5)).ok());
  EXPECT_FALSE(SetKnob(r, "redundancy_threshold", KnobValue(std::string("nan"))).ok());
  PolicyConfig full = FullConfig{};
  EXPECT_TRUE(Contains(SetKnob(full, "budget", KnobValue(int64_t{4})), "it has no knobs"));
}

TEST(PolicyRegistryTest, ValidationUsesTheRegistryRanges) {
  BeaconConfig b;
  b.coverage_layers = -1;
  const absl::Status s = ValidatePolicyConfig(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "coverage_layers")) << s;
  H2OConfig h;
  h.recent_fraction = 1.5;
  EXPECT_FALSE(ValidatePolicyConfig(h).ok());
}

TEST(PolicyRegistryTest, SpecTextParses) {
  absl::StatusOr<PolicySpecText> t = ParsePolicySpecText("beacon-pooled:n_recent=32,n_sinks=0");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "beacon");
  ASSERT_EQ(t->knobs.size(), 3u);
  EXPECT_EQ(t->knobs[0].first, "budget_mode");
  EXPECT_EQ(t->knobs[1].first, "n_recent");
  EXPECT_EQ(std::get<std::string>(t->knobs[1].second), "32");
  EXPECT_TRUE(Contains(ParsePolicySpecText("beacon:").status(), "KNOB=VALUE"));
  EXPECT_TRUE(Contains(ParsePolicySpecText("beacon:n_recent").status(), "NAME=VALUE"));
  absl::StatusOr<std::pair<std::string, std::string>> kv = ParseKnobAssignment(" pooling =max");
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->first, "pooling");
  EXPECT_EQ(kv->second, "max");
}

TEST(PolicyRegistryTest, BuildAppliesBudgetIntervalAndKnobsInOrder) {
  PolicyConfig c = Build({"beacon-pooled:n_recent=32", 96, 16, {{"n_recent", int64_t{8}}}});
  const BeaconConfig& b = std::get<BeaconConfig>(c);
  EXPECT_EQ(b.budget, 96);
  EXPECT_EQ(b.interval, 16);
  EXPECT_EQ(b.n_recent, 32);  // the spec's own knobs win over the request's
  EXPECT_EQ(b.budget_mode, BudgetMode::kPooled);

  // The budget reaches every budgeted policy; full ignores it.
  for (const std::string& name : PolicyNames()) {
    const PolicyConfig p = Build({name, 64, {}, {}});
    EXPECT_EQ(PolicyBudget(p), name == "full" ? std::nullopt : std::optional<int32_t>(64)) << name;
  }
  // rpc: period = ratio x budget (the final ratio), unless a knob sets the period.
  EXPECT_EQ(std::get<RpcConfig>(Build({"rpc", 64, {}, {}})).period, 256);
  EXPECT_EQ(std::get<RpcConfig>(Build({"rpc:ratio=2", 64, {}, {}})).period, 128);
  EXPECT_EQ(std::get<RpcConfig>(Build({"rpc:period=512", 64, {}, {}})).period, 512);
  // interval applies where the policy has one.
  EXPECT_EQ(std::get<RpcConfig>(Build({"rpc", {}, 8, {}})).period, RpcConfig{}.period);
  EXPECT_EQ(std::get<TovaConfig>(Build({"tova", {}, 8, {}})).interval, 8);
  // A `budget` knob is the budget.
  EXPECT_EQ(std::get<SnapKvConfig>(Build({"snapkv", {}, {}, {{"budget", int64_t{32}}}})).budget,
            32);
  EXPECT_EQ(std::get<SnapKvConfig>(Build({"snapkv:budget=32", 32, {}, {}})).budget, 32);
}

TEST(PolicyRegistryTest, BuildRefusesWhatItCannotUse) {
  absl::Status s = BuildError({"tova", 32, {}, {{"n_beacons", int64_t{4}}}});
  EXPECT_TRUE(Contains(s, "policy tova has no knob 'n_beacons'; its knobs: budget, interval")) << s;
  EXPECT_TRUE(Contains(BuildError({"full", {}, {}, {{"x", int64_t{1}}}}), "no knob 'x'"));
  EXPECT_TRUE(Contains(BuildError({"tova-pooled", 32, {}, {}}), "budget_mode"));
  EXPECT_TRUE(Contains(BuildError({"lru", {}, {}, {}}), "unknown policy \"lru\""));
  EXPECT_TRUE(Contains(BuildError({"snapkv:budget=32", 64, {}, {}}), "disagree"));
  EXPECT_TRUE(Contains(BuildError({"beacon", 0, {}, {}}), "knob 'budget' = 0"));
  EXPECT_TRUE(Contains(BuildError({"beacon:n_recent=1,n_recent=2", {}, {}, {}}), "twice"));
  EXPECT_TRUE(Contains(BuildError({"rpc", int64_t{1} << 30, {}, {}}), "period"));
  EXPECT_TRUE(Contains(BuildError({"beacon", 8, {}, {}}), "protected tokens"));  // validated
}

// "model" stands for the spec a model recommends: its knobs come after the defaults and
// before everything the user gives (interval, knobs, the spec's own), and the budget stays
// the user's.
TEST(PolicyRegistryTest, ModelStandsForTheModelsSpecUnderTheUsersKnobs) {
  constexpr char kModel[] = "beacon-pooled:n_recent=32,interval=64,n_beacons=128,blur_speed=0.02";
  absl::StatusOr<PolicyConfig> c = BuildPolicyConfig({"model", 96, {}, {}}, kModel);
  ASSERT_TRUE(c.ok()) << c.status();
  const BeaconConfig& b = std::get<BeaconConfig>(*c);
  EXPECT_EQ(b.budget, 96);
  EXPECT_EQ(b.budget_mode, BudgetMode::kPooled);
  EXPECT_EQ(b.n_recent, 32);
  EXPECT_EQ(b.interval, 64);
  EXPECT_EQ(b.n_beacons, 128);
  EXPECT_FLOAT_EQ(b.blur_speed, 0.02f);
  // The same configuration as the spec named directly.
  absl::StatusOr<PolicyConfig> direct = BuildPolicyConfig({kModel, 96, {}, {}});
  ASSERT_TRUE(direct.ok());
  for (const KnobSpec& knob : SpecOf(*direct).knobs) {
    EXPECT_EQ(KnobValueText(*GetKnob(*c, knob.name)), KnobValueText(*GetKnob(*direct, knob.name)))
        << knob.name;
  }

  // interval, then the request's knobs, then the spec's own override the model's.
  c = BuildPolicyConfig({"model:n_beacons=64", 112, 16, {{"n_recent", int64_t{24}}}}, kModel);
  ASSERT_TRUE(c.ok()) << c.status();
  const BeaconConfig& o = std::get<BeaconConfig>(*c);
  EXPECT_EQ(o.budget, 112);
  EXPECT_EQ(o.interval, 16);
  EXPECT_EQ(o.n_recent, 24);
  EXPECT_EQ(o.n_beacons, 64);
  EXPECT_EQ(o.budget_mode, BudgetMode::kPooled);
  EXPECT_FLOAT_EQ(o.blur_speed, 0.02f);
  // "-pooled" applies on top of a uniform model policy; a spec that does not name "model"
  // ignores the model's.
  c = BuildPolicyConfig({"model-pooled", 96, {}, {}}, "beacon:n_recent=32");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::get<BeaconConfig>(*c).budget_mode, BudgetMode::kPooled);
  c = BuildPolicyConfig({"tova", 96, {}, {}}, "beacon:n_recent=32");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(std::holds_alternative<TovaConfig>(*c));
  // rpc's period follows the user's budget, with the model's ratio.
  c = BuildPolicyConfig({"model", 64, {}, {}}, "rpc:ratio=2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::get<RpcConfig>(*c).period, 128);
  EXPECT_EQ(PolicyBudget(*c), 64);
}

TEST(PolicyRegistryTest, ModelRefusesAMissingOrMalformedModelSpec) {
  auto error = [](const PolicyRequest& request, std::string_view model_spec) {
    return BuildPolicyConfig(request, model_spec).status();
  };
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, ""), "no model policy was given"));
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "model:n_recent=8"),
                       "policy 'model' (the model's 'model:n_recent=8'): it must name a "
                       "policy of the registry"));
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "lru"), "unknown policy \"lru\""));
  // The budget is the user's: neither a budget nor rpc's period (its budget) in the model's.
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "beacon:budget=64"), "it sets 'budget'"));
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "rpc:period=512"), "it sets 'period'"));
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "beacon:n_recent=8,n_recent=9"), "twice"));
  EXPECT_TRUE(Contains(error({"model", 96, {}, {}}, "beacon:"), "expected KNOB=VALUE"));
  const absl::Status knob = error({"model", 96, {}, {}}, "beacon:n_becons=8");
  EXPECT_TRUE(Contains(knob, "policy 'model' (the model's 'beacon:n_becons=8')")) << knob;
  EXPECT_TRUE(Contains(knob, "no knob 'n_becons'")) << knob;
  // A model knob the user's knobs would override is still checked: the model's file is wrong.
  EXPECT_TRUE(
      Contains(error({"model:n_recent=8", 96, {}, {}}, "beacon:n_recent=-1"), "'n_recent'"));
  // The combination is validated as a whole, and its errors say what "model" stood for.
  const absl::Status small = error({"model", 8, {}, {}}, "beacon:n_recent=32");
  EXPECT_TRUE(Contains(small, "policy 'model' (the model's 'beacon:n_recent=32')")) << small;
  EXPECT_TRUE(Contains(small, "protected tokens")) << small;
  EXPECT_TRUE(Contains(error({"model-pooled", 96, {}, {}}, "rpc"), "no knob 'budget_mode'"));
}

// layer_budget_offsets: integers joined by '/', summing to 0, one per layer of the model, no
// layer below its protected tokens.
TEST(PolicyRegistryTest, LayerBudgetOffsetsAreAListThatSumsToZero) {
  const PolicyConfig c = Build({"beacon:layer_budget_offsets=0/-16/16/0", 96, 32, {}});
  const BeaconConfig& b = std::get<BeaconConfig>(c);
  EXPECT_EQ(b.layer_budget_offsets, (std::vector<int32_t>{0, -16, 16, 0}));
  EXPECT_EQ(LayerBudget(b, 1), 80);
  EXPECT_EQ(LayerBudget(b, 2), 112);
  EXPECT_EQ(LayerBudget(BeaconConfig{}, 2), BeaconConfig{}.budget);  // none: every layer alike
  EXPECT_EQ(std::get<std::string>(*GetKnob(c, "layer_budget_offsets")), "0/-16/16/0");
  EXPECT_EQ(std::get<std::string>(*GetKnob(BeaconConfig{}, "layer_budget_offsets")), "");
  ASSERT_TRUE(ValidatePolicyConfig(c).ok());

  PolicyConfig bad = BeaconConfig{};
  absl::Status s = SetKnob(bad, "layer_budget_offsets", KnobValue(std::string("0/x")));
  EXPECT_TRUE(Contains(s, "knob 'layer_budget_offsets' = '0/x': expected integers joined by '/'"))
      << s;
  EXPECT_FALSE(SetKnob(bad, "layer_budget_offsets", KnobValue(int64_t{3})).ok());
  EXPECT_TRUE(std::get<BeaconConfig>(bad).layer_budget_offsets.empty());  // unchanged
  BeaconConfig uneven = b;
  uneven.layer_budget_offsets = {0, -16, 8, 0};
  EXPECT_TRUE(Contains(ValidatePolicyConfig(uneven), "share budget x layers), got -8"));
  BeaconConfig starved = b;
  starved.layer_budget_offsets = {0, -48, 48, 0};  // 48 < n_recent + n_sinks = 52
  EXPECT_TRUE(Contains(ValidatePolicyConfig(starved),
                       "layer 1's budget (96 + -48 = 48) is smaller than the protected tokens"));
  BeaconConfig huge = b;
  huge.budget = std::numeric_limits<int32_t>::max();
  huge.layer_budget_offsets = {0, -5, 5, 0};
  EXPECT_TRUE(Contains(ValidatePolicyConfig(huge), "layer 2's budget (2147483647 + 5) is above"));
  // One offset per layer of the model, checked where the model is known.
  PolicyGeometry geo;
  geo.num_layers = 2;
  geo.num_kv_heads = 1;
  geo.group_size = 1;
  geo.rope.head_dim = 8;
  EXPECT_TRUE(Contains(NewPolicyState(c, geo, 4).status(),
                       "layer_budget_offsets has 4 entries for a model of 2 layers"));
}

TEST(PolicyRegistryTest, BlurKnobsRejectNegativeValues) {
  BeaconConfig b;
  b.budget = 96;
  b.blur_speed = -0.1;
  EXPECT_TRUE(Contains(ValidatePolicyConfig(b), "blur_speed"));
  b.blur_speed = 0.02;
  EXPECT_TRUE(ValidatePolicyConfig(b).ok());
  b.blurred_beacons = -1;
  EXPECT_TRUE(Contains(ValidatePolicyConfig(b), "blurred_beacons"));
}

// blur_layers: distinct layer indices joined by '/', only with blur_speed > 0, each below the
// model's layer count (checked where the model is known); empty = every layer.
TEST(PolicyRegistryTest, BlurLayersAreDistinctLayersOfTheModel) {
  const PolicyConfig c = Build({"beacon:blur_speed=0.02,blur_layers=3/1", 96, 32, {}});
  EXPECT_EQ(std::get<BeaconConfig>(c).blur_layers, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(std::get<std::string>(*GetKnob(c, "blur_layers")), "3/1");
  EXPECT_EQ(std::get<std::string>(*GetKnob(BeaconConfig{}, "blur_layers")), "");
  ASSERT_TRUE(ValidatePolicyConfig(c).ok());
  BeaconConfig b = std::get<BeaconConfig>(c);
  b.blur_layers = {1, -1};
  EXPECT_TRUE(Contains(ValidatePolicyConfig(b), "blur_layers: layer -1 is negative"));
  b.blur_layers = {1, 3, 1};
  EXPECT_TRUE(Contains(ValidatePolicyConfig(b), "blur_layers: layer 1 is listed twice"));
  b.blur_layers = {1};
  b.blur_speed = 0.0;
  EXPECT_TRUE(Contains(ValidatePolicyConfig(b), "blur_layers needs blur_speed > 0"));
  EXPECT_TRUE(
      Contains(BuildError({"beacon:blur_layers=x", 96, 32, {}}), "expected integers joined by"));
  PolicyGeometry geo;
  geo.num_layers = 2;
  geo.num_kv_heads = 1;
  geo.group_size = 1;
  geo.rope.head_dim = 8;
  EXPECT_TRUE(
      Contains(ValidatePolicyGeometry(c, geo), "blur_layers names layer 3 of a model of 2 layers"));
  EXPECT_TRUE(Contains(NewPolicyState(c, geo, 4).status(),
                       "blur_layers names layer 3 of a model of 2 layers"));
  geo.num_layers = 4;
  EXPECT_TRUE(ValidatePolicyGeometry(c, geo).ok());
  EXPECT_TRUE(NewPolicyState(c, geo, 4).ok());
}

TEST(PolicyRegistryTest, CountBiasGoesToTheCoverageLayersOfBeaconOnly) {
  BeaconConfig b;
  EXPECT_EQ(CountBiasLayers(b), 1);  // on by default, layer 0 the one coverage layer
  b.count_bias = false;
  EXPECT_EQ(CountBiasLayers(b), 0);
  b.count_bias = true;
  EXPECT_EQ(CountBiasLayers(b), 1);
  b.coverage_layers = 2;
  EXPECT_EQ(CountBiasLayers(b), 2);
  b.coverage_layers = 0;
  EXPECT_EQ(CountBiasLayers(b), 0);
  EXPECT_EQ(CountBiasLayers(SnapKvConfig{}), 0);
  EXPECT_EQ(CountBiasLayers(FullConfig{}), 0);
  EXPECT_FALSE(std::get<BeaconConfig>(Build({"beacon:count_bias=false", 64, {}, {}})).count_bias);
}

}  // namespace
}  // namespace beaconkv

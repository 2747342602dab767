// Configuration of every eviction policy: one struct per policy, every knob a named field
// with its default. Defaults follow the published methods (docs/policies.md names the sources);
// where a method is silent, DESIGN.md §3 fixes the value. docs/policies.md lists them all.
// The registry, knob access and command-line parsing are in policy_config.cc; the constraints
// between knobs and DescribePolicy in policy_config_checks.cc.
//
// Trigger convention shared by the budgeted policies: a head holding `budget + interval`
// tokens is compressed back to `budget`, so it oscillates between the two. interval = 1
// means "every step once over budget" (StreamingLLM, H2O, TOVA as published).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/scoring.h"

namespace beaconkv {

enum class BudgetMode {
  kUniform,  // every head keeps `budget` tokens
  kPooled,   // a layer keeps budget * num_kv_heads tokens; heads compete on normalised scores
};

// No eviction.
struct FullConfig {};

// StreamingLLM: the first n_sinks tokens plus the newest (budget - n_sinks). Positions are
// kept as originally assigned (the R-KV / kvpress reimplementation, not pos_shift).
struct StreamingConfig {
  int32_t budget = 2048;
  int32_t n_sinks = 4;   // start_size
  int32_t interval = 1;  // evict every step once over budget
};

// H2O: accumulated attention. Each head sums, for every key, the softmax attention every
// observed query row (all query heads of the group, prefill rows included) paid it. Keeps
// the newest `recent` = floor(budget * recent_fraction) tokens and the heaviest others.
struct H2OConfig {
  int32_t budget = 2048;
  double recent_fraction = 0.5;  // heavy_ratio = recent_ratio = 0.1 in the paper: half/half
  int32_t interval = 1;          // every step once over budget
};

// TOVA: keep the `budget` tokens the last query attends to most (mean over the group).
struct TovaConfig {
  int32_t budget = 2048;
  int32_t interval = 1;  // every step once over budget
};

// SnapKV, decode-time variant of R-KV's codebase: the newest `window` post-RoPE queries,
// max of logits over the group, softmax over the non-window keys, mean over the queries,
// max-pooling; keeps the top (budget - window) non-window tokens plus the window.
struct SnapKvConfig {
  int32_t budget = 2048;
  int32_t window = 8;       // alpha: observation queries and always-kept newest tokens
  int32_t pool_kernel = 7;  // 1 = no pooling
  Pooling pooling = Pooling::kMax;
  int32_t interval = 128;
  BudgetMode budget_mode = BudgetMode::kUniform;
};

// R-KV: z = lambda * importance - (1 - lambda) * redundancy; importance as SnapKvConfig.
struct RkvConfig {
  int32_t budget = 2048;
  int32_t window = 8;
  int32_t pool_kernel = 7;
  double lambda = 0.1;                // paper/README; the code's default is 0.07
  double redundancy_threshold = 0.5;  // cosine above which two keys are near-duplicates
  int32_t interval = 128;
  // Uniform budgets only: z can be negative, so pooled normalisation is undefined.
};

// RPC: periodic, ratio-based, one token set per layer (scores averaged over all heads).
// Fires when a layer holds prompt + kept + window + period tokens; the k-th compression
// (k = 1, 2, ...) keeps k * (period / ratio) generated tokens, plus the prompt and the
// newest `window` tokens. Previously kept tokens are re-scored.
struct RpcConfig {
  int32_t period = 1024;  // P
  int32_t window = 32;    // R: selector queries and always-kept newest tokens
  int32_t ratio = 4;      // c
  int32_t pool_kernel = 7;
  Pooling pooling = Pooling::kAvg;
};

// BeaconKV (DESIGN.md §3). n_recent, n_beacons, buffer_min and protect_prompt were tuned on
// the tiny reasoner's dev split (docs/results/accuracy.md): DESIGN's 16 / 16 / 64 (max 256) /
// true lost most revisits (16 beacons cover too few of the distinct re-read targets; a protected
// prompt spends the budget on tokens the model also finds in its own plan).
struct BeaconConfig {
  int32_t budget = 2048;
  // 32, not the other policies' 128: every token must outlive one compression inside the
  // protected newest n_recent, or it is judged before any query has shown that it is needed.
  // Above n_recent (48) the tiny reasoner loses 10-22 points at budget 128 (interval 56-128),
  // and 32 keeps more answers at a lower peak. Why: docs/results/accuracy.md, "The default
  // interval".
  int32_t interval = 32;
  int32_t n_recent = 48;        // recent post-RoPE queries per query head; newest tokens kept
  int32_t n_beacons = 256;      // beacons drawn from the buffer at each compression
  int32_t buffer_max = 512;     // pre-RoPE queries buffered per (layer, kv_head) before FPS
  int32_t buffer_min = 256;     // size FPS reduces the buffer to
  int32_t pool_kernel = 1;      // max-pooling over neighbouring tokens; 1 = off
  bool protect_prompt = false;  // true: keep the prompt whenever it fits beside n_recent
  int32_t n_sinks = 4;          // first tokens kept when the prompt is not protected
  BudgetMode budget_mode = BudgetMode::kUniform;
  // The first `coverage_layers` layers spread attention over the whole context: their heads
  // keep the protected tokens, then an evenly spaced sample of the rest (CoverageUnprotected,
  // one token per stratum, budget - protected strata), then the best scores for what is left.
  // 1 = layer 0 (why: docs/policies.md, "Coverage layers").
  int32_t coverage_layers = 1;
  // true: a compression reuses the beacons of the last FPS draw until the buffer would fill
  // before the next compression (the newest steps are covered by the recent queries); false:
  // every compression reduces the buffer and draws again (docs/policies.md, "When beacons
  // are drawn"). The same draws at interval >= 64 (GQA 2); fewer at short intervals, at the
  // same held-out accuracy.
  bool draw_on_fill = true;
  // > 0: outside the coverage layers a token's rank is its score minus `redundancy` x n x its
  // R-KV redundancy (core RedundancyScores over the head's n keys; n x redundancy is 1 on
  // average), so near-duplicate keys give way to distinct ones. 0 = off. Uniform budgets
  // only (a rank can be negative). Why: docs/results/accuracy.md, "Redundancy in BeaconKV".
  double redundancy = 0.0;
  double redundancy_threshold = 0.5;  // cosine above which two keys are near-duplicates
  // In the coverage layers, attention adds log(N / K) to the logit of each held token, with N
  // the tokens of its id the sequence has had so far and K those the head still holds: the
  // kept ones stand in for the evicted ones of their id. Applied by the attention, not the
  // selection (CountBiasLayers). On by default since 2026-12-05 (it helped at every setting
  // measured, both tasks, for 1-1.5 % of decode). Why: docs/results/accuracy.md, "The count
  // bias".
  bool count_bias = true;
  // > 0: outside the coverage layers each head keeps, besides its protected tokens, the
  // prompt tokens it scores best (after the redundancy term), ahead of every other scored
  // token: `prompt_slots` of them, but at most one in eight of the slots the protected tokens
  // leave ((budget - n_recent - n_sinks) / 8: 1 at budget 64, 4 from 84 up with the defaults).
  // 0 = off. On by default since 2026-12-05. Why: docs/results/accuracy.md, "Prompt slots".
  int32_t prompt_slots = 4;
  // Per-layer budgets: empty (every layer keeps `budget`), or one offset per layer, summing
  // to 0, so that layer l keeps budget + layer_budget_offsets[l] tokens per head and the
  // layers together hold what uniform layers would (the prompt slots' cap stays that of
  // `budget`). As a knob, offsets joined by '/', e.g. "0/-16/16/0". Why: docs/results/
  // accuracy.md, "Per-layer budgets".
  std::vector<int32_t> layer_budget_offsets;
  // > 0: a cosine distance (1 - cos); each head's FPS draw stops at the first query within
  // it of the queries drawn before, so a head whose queries are concentrated scores fewer
  // beacon rows and draws fewer points (BeaconBank). 0 = every draw takes buffer_min points
  // and n_beacons beacons. Why: docs/results/accuracy.md, "A beacon radius".
  double beacon_radius = 0.0;
  // > 0 (radians per token): each of the first `blurred_beacons` beacons (the bank's order:
  // FPS order once the buffer has been reduced) is scored
  // twice, as it is and as a "blurred" row with every RoPE pair that turns faster than
  // `blur_speed` zeroed (pair i = dims (i, i + head_dim / 2), rope_theta^(-2i / head_dim)
  // radians per token): the slow pairs still place a read roughly, the fast ones, which fix
  // its exact offset, are gone, so a blurred beacon also scores keys like the ones it read at
  // other offsets. 0 = off. Why: docs/results/accuracy.md, "Blurred beacons".
  double blur_speed = 0.0;
  int32_t blurred_beacons = 128;  // how many leading beacons get a blurred row (blur_speed > 0)
  // The layers whose heads score blurred rows (blur_speed > 0): distinct layer indices, each
  // below the model's layer count; empty = every layer. As a knob, joined by '/', e.g. "3".
  // Where blurred rows help is a property of the model, found on its tuning split like the
  // per-layer budgets. Why: docs/results/accuracy.md, "Blurred rows in chosen layers".
  std::vector<int32_t> blur_layers;
  // True: the scores' products take the queries and keys rounded to bfloat16 (ScoreSpec::bf16,
  // on the CPU and on the device alike): half the product's instructions with AVX-512 BF16,
  // the same answers on fresh splits. Why: docs/policies.md, "Scores from bfloat16".
  bool score_bf16 = true;
};

// Layer `layer`'s budget per head: `budget` plus the layer's entry of `offsets` (none past
// its end). The one rule for beacon's layer_budget_offsets and the forecasts (HeadTrigger).
int64_t LayerBudget(int64_t budget, const std::vector<int32_t>& offsets, int32_t layer);
inline int64_t LayerBudget(const BeaconConfig& c, int32_t layer) {
  return LayerBudget(c.budget, c.layer_budget_offsets, layer);
}

using PolicyConfig = std::variant<FullConfig, StreamingConfig, H2OConfig, TovaConfig, SnapKvConfig,
                                  RkvConfig, RpcConfig, BeaconConfig>;

// "full", "streaming", "h2o", "tova", "snapkv", "rkv", "rpc", "beacon".
const std::vector<std::string>& PolicyNames();
std::string_view PolicyName(const PolicyConfig& config);
// The default configuration of a policy by name; unknown names -> kInvalidArgument.
absl::StatusOr<PolicyConfig> DefaultPolicyConfig(std::string_view name);
// kInvalidArgument naming the policy and knob when a configuration cannot work: every knob
// in its range (CheckKnobRanges), then the constraints between knobs.
absl::Status ValidatePolicyConfig(const PolicyConfig& config);

std::string_view BudgetModeName(BudgetMode mode);
absl::StatusOr<BudgetMode> ParseBudgetMode(std::string_view name);

// The four choices every policy makes silently in its source paper/code, stated.
struct PolicyTraits {
  std::string query_space;    // which queries score the keys
  std::string gqa_reduction;  // how a GQA group's query heads are combined
  std::string pooling;        // smoothing over neighbouring tokens
  std::string trigger;        // when a head (or layer) is compressed
};
PolicyTraits DescribePolicy(const PolicyConfig& config);

// The layers [0, n) whose attention adds the count bias (BeaconConfig::count_bias): beacon's
// coverage layers when count_bias is on, else 0 for every policy.
int32_t CountBiasLayers(const PolicyConfig& config);

// The prompt tokens each head outside beacon's coverage layers keeps by score before the
// rest (BeaconConfig::prompt_slots): prompt_slots, but at most one in eight of the slots the
// protected tokens leave, (budget - n_recent - n_sinks) / 8; 0 for every other policy.
int32_t PromptSlotsInEffect(const PolicyConfig& config);
int32_t PromptSlotsInEffect(const BeaconConfig& config);

// ---------------------------------------------------------------------------------------
// The policy registry: the one place that says which policies exist, which take a budget,
// and every knob's type, default and range. Every entry point (the CLI, the study tools, the
// vLLM config, the Python config classes) asks it; none keeps its own list.

enum class KnobType { kInt, kFloat, kBool, kChoice, kIntList };
std::string_view KnobTypeName(KnobType type);  // "int", "float", "bool", "choice", "ints"

// A knob value. A string given for an int, float or bool knob is text to parse ("8", "0.5",
// "true"); for a choice knob it is the choice; an int list is always its text: integers
// joined by '/' ("0/-16/16/0"; "" = empty), the form a policy spec and a file name can carry.
using KnobValue = std::variant<bool, int64_t, double, std::string>;
std::string KnobValueText(const KnobValue& value);

struct KnobSpec {
  std::string name;
  KnobType type = KnobType::kInt;
  std::string help;
  KnobValue default_value;           // the config struct's own initialiser
  std::optional<double> min, max;    // kInt, kFloat: inclusive bounds (floats are also finite)
  std::vector<std::string> choices;  // kChoice
};

struct PolicySpec {
  std::string name;
  std::string summary;
  // Takes a budget: a `budget` knob, or for rpc period = ratio x budget (its first
  // compression round keeps `budget` generated tokens). full keeps everything and has none.
  bool budgeted = false;
  std::vector<KnobSpec> knobs;  // in declaration order of the config struct

  const KnobSpec* FindKnob(std::string_view knob) const;  // nullptr when absent
};

// One entry per policy, in PolicyNames() order.
const std::vector<PolicySpec>& PolicySpecs();
absl::StatusOr<const PolicySpec*> FindPolicySpec(std::string_view name);  // unknown -> error
const PolicySpec& SpecOf(const PolicyConfig& config);

// The knob's current value; kInvalidArgument when the policy has no such knob.
absl::StatusOr<KnobValue> GetKnob(const PolicyConfig& config, std::string_view knob);
// Sets one knob after checking its name, type and range (kInvalidArgument naming the policy
// and knob). Constraints between knobs are ValidatePolicyConfig's.
absl::Status SetKnob(PolicyConfig& config, std::string_view knob, const KnobValue& value);
// Every knob of `config` inside its registry range (a config built field by field in C++ never
// went through SetKnob); kInvalidArgument naming the first knob outside.
absl::Status CheckKnobRanges(const PolicyConfig& config);

// "NAME=VALUE" -> {NAME, VALUE as text}.
absl::StatusOr<std::pair<std::string, std::string>> ParseKnobAssignment(std::string_view item);

// A policy as named on a command line: NAME[-pooled][:KNOB=VALUE[,KNOB=VALUE...]].
// "-pooled" is short for budget_mode=pooled.
struct PolicySpecText {
  std::string name;
  std::vector<std::pair<std::string, KnobValue>> knobs;
};
absl::StatusOr<PolicySpecText> ParsePolicySpecText(std::string_view text);

// The name that stands for the policy a model recommends: "model[:KNOB=VALUE,...]" runs the
// spec the model ships (its config.json "beaconkv_policy", engine/model_policy.h) with the
// knobs given on top. It is not a policy of the registry.
inline constexpr std::string_view kModelPolicyName = "model";
// Whether `spec` (ParsePolicySpecText) names "model"; a malformed spec is an error.
absl::StatusOr<bool> NamesModelPolicy(std::string_view spec);

// Everything an entry point knows about the policy to run.
struct PolicyRequest {
  std::string spec;               // NAME[-pooled][:KNOB=VALUE,...] (ParsePolicySpecText)
  std::optional<int64_t> budget;  // see PolicySpec::budgeted; full ignores it
  // Sets the `interval` knob of the policies that have one (full and rpc have none): a grid
  // of policies shares it.
  std::optional<int64_t> interval;
  std::vector<std::pair<std::string, KnobValue>> knobs;  // applied before the spec's own
};

// `model_spec`: what the name "model" stands for, the spec the model recommends (a policy
// name and knobs, no budget; engine/model_policy.h reads it); empty when the model names none.
// Read only when `request.spec` names "model".
// Defaults, then the model's knobs (when `spec` names "model"), then `interval`, then
// `knobs`, then the spec's knobs (a knob given twice in one list is an error; the spec's own
// win over `knobs`), then the budget. A `budget` knob anywhere but in the model's spec is the
// budget: every budget given must agree. rpc's period follows the budget unless a knob sets
// it. The result is validated.
absl::StatusOr<PolicyConfig> BuildPolicyConfig(const PolicyRequest& request,
                                               std::string_view model_spec = {});

// The budget a configuration keeps per head: its `budget` knob, for rpc period / ratio (the
// generated tokens one compression round keeps), none for full.
std::optional<int32_t> PolicyBudget(const PolicyConfig& config);

}  // namespace beaconkv

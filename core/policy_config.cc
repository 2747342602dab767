#include "core/policy_config.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "core/overloaded.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::Status Invalid(std::string_view policy, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("policy %s: %s", policy, message));
}

// ---------------------------------------------------------------------------------------
// Registry entries: a knob's spec plus how to read and write it in its config struct.

struct KnobAccess {
  std::function<KnobValue(const PolicyConfig&)> get;
  // `value` already holds the knob's own alternative (int64_t, double, bool or the choice).
  std::function<void(PolicyConfig&, const KnobValue&)> set;
};

struct Knob {
  KnobSpec spec;
  KnobAccess access;
};

template <typename C>
Knob IntKnob(const char* name, int32_t C::*field, int64_t min, const char* help) {
  Knob k{{name, KnobType::kInt, help, {}, static_cast<double>(min), double{kInt32Max}, {}}, {}};
  k.access.get = [field](const PolicyConfig& c) {
    return KnobValue(int64_t{std::get<C>(c).*field});
  };
  k.access.set = [field](PolicyConfig& c, const KnobValue& v) {
    std::get<C>(c).*field = static_cast<int32_t>(std::get<int64_t>(v));
  };
  return k;
}

template <typename C>
Knob FloatKnob(const char* name, double C::*field, std::optional<double> min,
               std::optional<double> max, const char* help) {
  Knob k{{name, KnobType::kFloat, help, {}, min, max, {}}, {}};
  k.access.get = [field](const PolicyConfig& c) { return KnobValue(std::get<C>(c).*field); };
  k.access.set = [field](PolicyConfig& c, const KnobValue& v) {
    std::get<C>(c).*field = std::get<double>(v);
  };
  return k;
}

template <typename C>
Knob BoolKnob(const char* name, bool C::*field, const char* help) {
  Knob k{{name, KnobType::kBool, help, {}, {}, {}, {}}, {}};
  k.access.get = [field](const PolicyConfig& c) { return KnobValue(std::get<C>(c).*field); };
  k.access.set = [field](PolicyConfig& c, const KnobValue& v) {
    std::get<C>(c).*field = std::get<bool>(v);
  };
  return k;
}

// An enum knob; `values` names every value the knob may take, in the order listed to users.
template <typename C, typename E>
Knob ChoiceKnob(const char* name, E C::*field, std::vector<std::pair<E, std::string>> values,
                const char* help) {
  Knob k{{name, KnobType::kChoice, help, {}, {}, {}, {}}, {}};
  for (const auto& [value, text] : values) k.spec.choices.push_back(text);
  k.access.get = [field, values](const PolicyConfig& c) {
    for (const auto& [value, text] : values) {
      if (value == std::get<C>(c).*field) return KnobValue(text);
    }
    BKV_CHECK_MSG(false, "enum value without a name");
    return KnobValue(std::string());
  };
  k.access.set = [field, values](PolicyConfig& c, const KnobValue& v) {
    for (const auto& [value, text] : values) {
      if (text == std::get<std::string>(v)) std::get<C>(c).*field = value;
    }
  };
  return k;
}

// "a/b/c" -> {a, b, c} ("" -> {}); nullopt when an item is not an int32.
std::optional<std::vector<int32_t>> ParseIntList(const std::string& text) {
  std::vector<int32_t> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, '/')) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) return std::nullopt;
    out.push_back(v);
  }
  return out;
}

// A list of ints, carried as its text (KnobValue's string) so that it fits a policy spec.
template <typename C>
Knob IntListKnob(const char* name, std::vector<int32_t> C::*field, const char* help) {
  Knob k{{name, KnobType::kIntList, help, {}, {}, {}, {}}, {}};
  k.access.get = [field](const PolicyConfig& c) {
    return KnobValue(absl::StrJoin(std::get<C>(c).*field, "/"));
  };
  k.access.set = [field](PolicyConfig& c, const KnobValue& v) {
    std::get<C>(c).*field = *ParseIntList(std::get<std::string>(v));
  };
  return k;
}

const std::vector<std::pair<Pooling, std::string>>& PoolingChoices() {
  static const auto* choices = new std::vector<std::pair<Pooling, std::string>>{
      {Pooling::kMax, "max"}, {Pooling::kAvg, "avg"}, {Pooling::kNone, "none"}};
  return *choices;
}

const std::vector<std::pair<BudgetMode, std::string>>& BudgetModeChoices() {
  static const auto* choices = new std::vector<std::pair<BudgetMode, std::string>>{
      {BudgetMode::kUniform, "uniform"}, {BudgetMode::kPooled, "pooled"}};
  return *choices;
}

struct PolicyEntry {
  PolicySpec spec;
  PolicyConfig defaults;
  std::vector<KnobAccess> access;  // [spec.knobs.size()]
};

PolicyEntry Entry(PolicyConfig defaults, bool budgeted, const char* summary,
                  std::vector<Knob> knobs) {
  PolicyEntry e{{PolicyNames()[defaults.index()], summary, budgeted, {}}, defaults, {}};
  for (Knob& k : knobs) {
    k.spec.default_value = k.access.get(defaults);
    e.spec.knobs.push_back(std::move(k.spec));
    e.access.push_back(std::move(k.access));
  }
  return e;
}

constexpr char kBudgetHelp[] = "KV tokens kept per head after a compression";
constexpr char kIntervalHelp[] =
    "tokens a head may grow past the budget before it is compressed again (1 = every step)";
constexpr char kKernelHelp[] = "odd width of the pooling over neighbouring tokens; 1 = off";
constexpr char kBudgetModeHelp[] =
    "uniform: every head keeps `budget`; pooled: a layer keeps budget x kv heads, heads "
    "compete on normalised scores";

std::vector<PolicyEntry> MakeRegistry() {
  using S = StreamingConfig;
  using H = H2OConfig;
  using T = TovaConfig;
  using K = SnapKvConfig;
  using R = RkvConfig;
  using P = RpcConfig;
  using B = BeaconConfig;
  std::vector<PolicyEntry> r;
  r.push_back(Entry(FullConfig{}, false, "no eviction", {}));
  r.push_back(Entry(StreamingConfig{}, true, "StreamingLLM: the first n_sinks tokens + the newest",
                    {IntKnob("budget", &S::budget, 1, kBudgetHelp),
                     IntKnob("n_sinks", &S::n_sinks, 0, "first tokens always kept (<= budget)"),
                     IntKnob("interval", &S::interval, 1, kIntervalHelp)}));
  r.push_back(Entry(H2OConfig{}, true, "H2O: accumulated attention + the newest tokens",
                    {IntKnob("budget", &H::budget, 1, kBudgetHelp),
                     FloatKnob("recent_fraction", &H::recent_fraction, 0.0, 1.0,
                               "share of the budget kept for the newest tokens"),
                     IntKnob("interval", &H::interval, 1, kIntervalHelp)}));
  r.push_back(Entry(TovaConfig{}, true, "TOVA: the last query's attention",
                    {IntKnob("budget", &T::budget, 1, kBudgetHelp),
                     IntKnob("interval", &T::interval, 1, kIntervalHelp)}));
  r.push_back(Entry(
      SnapKvConfig{}, true, "SnapKV, decode-time variant: a window of the newest queries scores",
      {IntKnob("budget", &K::budget, 1, kBudgetHelp),
       IntKnob("window", &K::window, 1,
               "observation queries = always-kept newest tokens (< budget)"),
       IntKnob("pool_kernel", &K::pool_kernel, 1, kKernelHelp),
       ChoiceKnob("pooling", &K::pooling, PoolingChoices(), "pooling over neighbouring tokens"),
       IntKnob("interval", &K::interval, 1, kIntervalHelp),
       ChoiceKnob("budget_mode", &K::budget_mode, BudgetModeChoices(), kBudgetModeHelp)}));
  r.push_back(
      Entry(RkvConfig{}, true, "R-KV: lambda x importance - (1 - lambda) x redundancy",
            {IntKnob("budget", &R::budget, 1, kBudgetHelp),
             IntKnob("window", &R::window, 1,
                     "observation queries = always-kept newest tokens (< budget)"),
             IntKnob("pool_kernel", &R::pool_kernel, 1, kKernelHelp),
             FloatKnob("lambda_", &R::lambda, 0.0, 1.0, "weight of importance against redundancy"),
             FloatKnob("redundancy_threshold", &R::redundancy_threshold, std::nullopt, std::nullopt,
                       "cosine above which two keys are near-duplicates"),
             IntKnob("interval", &R::interval, 1, kIntervalHelp)}));
  r.push_back(Entry(
      RpcConfig{}, true,
      "RPC: periodic, ratio-based, one token set per layer (a budget B sets period = ratio x B)",
      {IntKnob("period", &P::period, 1, "P: generated tokens between compressions"),
       IntKnob("window", &P::window, 1, "R: selector queries = always-kept newest tokens"),
       IntKnob("ratio", &P::ratio, 1, "c: a round keeps period / ratio generated tokens"),
       IntKnob("pool_kernel", &P::pool_kernel, 1, kKernelHelp),
       ChoiceKnob("pooling", &P::pooling, PoolingChoices(), "pooling over neighbouring tokens")}));
  r.push_back(Entry(
      BeaconConfig{}, true, "BeaconKV: recent queries + beacons from a buffer of past queries",
      {IntKnob("budget", &B::budget, 1, kBudgetHelp),
       IntKnob("interval", &B::interval, 1, kIntervalHelp),
       IntKnob("n_recent", &B::n_recent, 0,
               "recent post-RoPE queries per query head; as many newest tokens are kept"),
       IntKnob("n_beacons", &B::n_beacons, 0, "beacons drawn at each compression (<= buffer_min)"),
       IntKnob("buffer_max", &B::buffer_max, 2, "pre-RoPE queries buffered per head before FPS"),
       IntKnob("buffer_min", &B::buffer_min, 1, "size FPS reduces the buffer to (< buffer_max)"),
       IntKnob("pool_kernel", &B::pool_kernel, 1,
               "odd width of max-pooling over neighbours; 1 = off"),
       BoolKnob("protect_prompt", &B::protect_prompt,
                "keep the prompt whenever it fits beside n_recent"),
       IntKnob("n_sinks", &B::n_sinks, 0, "first tokens kept when the prompt is not protected"),
       ChoiceKnob("budget_mode", &B::budget_mode, BudgetModeChoices(), kBudgetModeHelp),
       IntKnob("coverage_layers", &B::coverage_layers, 0,
               "first layers that keep an evenly spaced sample before the best scores"),
       BoolKnob("draw_on_fill", &B::draw_on_fill,
                "draw beacons again only when the buffer would fill before the next "
                "compression; compressions in between reuse the last draw"),
       FloatKnob("redundancy", &B::redundancy, 0.0, std::nullopt,
                 "weight of the R-KV redundancy (x tokens) subtracted from a token's score "
                 "outside the coverage layers; 0 = off"),
       FloatKnob("redundancy_threshold", &B::redundancy_threshold, std::nullopt, std::nullopt,
                 "cosine above which two keys are near-duplicates (redundancy > 0)"),
       BoolKnob("count_bias", &B::count_bias,
                "coverage layers' attention adds log(tokens of an id so far / those held) to "
                "each held token's logit"),
       IntKnob("prompt_slots", &B::prompt_slots, 0,
               "prompt tokens each head outside the coverage layers keeps by score ahead of "
               "the rest, at most (budget - n_recent - n_sinks) / 8; 0 = off"),
       IntListKnob("layer_budget_offsets", &B::layer_budget_offsets,
                   "per-layer budgets: one offset per layer added to budget, summing to 0, "
                   "joined by '/' (e.g. 0/-16/16/0); empty = every layer keeps budget"),
       FloatKnob("beacon_radius", &B::beacon_radius, 0.0, 1.0,
                 "cosine distance (1 - cos) at which a head's FPS draw stops: queries that "
                 "close to a drawn one are neither kept nor beacons; 0 = off"),
       FloatKnob("blur_speed", &B::blur_speed, 0.0, std::nullopt,
                 "radians per token above which a RoPE pair is zeroed in the blurred second "
                 "row of each leading beacon; 0 = off"),
       IntKnob("blurred_beacons", &B::blurred_beacons, 0,
               "leading beacons (in the bank's order) that also score as a blurred row (blur_speed "
               "> 0)"),
       IntListKnob("blur_layers", &B::blur_layers,
                   "layers whose heads score blurred rows (blur_speed > 0), distinct indices "
                   "joined by '/' (e.g. 3); empty = every layer"),
       BoolKnob("score_bf16", &B::score_bf16,
                "round queries and keys to bfloat16 before the scores' products (fp32 sums)")}));
  for (size_t i = 0; i < r.size(); ++i) BKV_CHECK(r[i].defaults.index() == i);
  return r;
}

const std::vector<PolicyEntry>& Registry() {
  static const auto* registry = new std::vector<PolicyEntry>(MakeRegistry());
  return *registry;
}

const PolicyEntry& EntryOf(const PolicyConfig& config) { return Registry()[config.index()]; }

absl::StatusOr<const PolicyEntry*> FindEntry(std::string_view name) {
  for (const PolicyEntry& e : Registry()) {
    if (e.spec.name == name) return &e;
  }
  return absl::InvalidArgumentError(absl::StrFormat("unknown policy \"%s\"; expected one of: %s",
                                                    name, absl::StrJoin(PolicyNames(), ", ")));
}

absl::StatusOr<int32_t> KnobIndex(const PolicyEntry& e, std::string_view knob) {
  for (size_t i = 0; i < e.spec.knobs.size(); ++i) {
    if (e.spec.knobs[i].name == knob) return static_cast<int32_t>(i);
  }
  std::vector<std::string> names;
  for (const KnobSpec& k : e.spec.knobs) names.push_back(k.name);
  return absl::InvalidArgumentError(
      absl::StrFormat("policy %s has no knob '%s'; %s", e.spec.name, knob,
                      names.empty() ? std::string("it has no knobs")
                                    : absl::StrCat("its knobs: ", absl::StrJoin(names, ", "))));
}

std::string QuotedValue(const KnobValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return absl::StrCat("'", *s, "'");
  return KnobValueText(v);
}

std::string Bound(const KnobSpec& k, std::optional<double> b, const char* unbounded) {
  if (!b) return unbounded;
  return k.type == KnobType::kInt ? absl::StrCat(static_cast<int64_t>(*b)) : absl::StrCat(*b);
}

// `value` converted to the knob's own alternative and checked against its range.
absl::StatusOr<KnobValue> Coerce(std::string_view policy, const KnobSpec& k,
                                 const KnobValue& value) {
  const std::string* text = std::get_if<std::string>(&value);
  auto wrong_type = [&] {
    std::string want(KnobTypeName(k.type));
    if (k.type == KnobType::kChoice) want = absl::StrCat("one of ", absl::StrJoin(k.choices, ", "));
    return Invalid(
        policy, absl::StrFormat("knob '%s' = %s: expected %s", k.name, QuotedValue(value), want));
  };
  KnobValue out;
  switch (k.type) {
    case KnobType::kInt: {
      int64_t v = 0;
      if (const auto* i = std::get_if<int64_t>(&value)) {
        v = *i;
      } else if (!text || !absl::SimpleAtoi(*text, &v)) {
        return wrong_type();
      }
      out = v;
      break;
    }
    case KnobType::kFloat: {
      double v = 0;
      if (const auto* d = std::get_if<double>(&value)) {
        v = *d;
      } else if (const auto* i = std::get_if<int64_t>(&value)) {
        v = static_cast<double>(*i);
      } else if (!text || !absl::SimpleAtod(*text, &v)) {
        return wrong_type();
      }
      if (!std::isfinite(v)) {
        return Invalid(policy, absl::StrFormat("knob '%s' = %s: expected a finite number", k.name,
                                               QuotedValue(value)));
      }
      out = v;
      break;
    }
    case KnobType::kBool: {
      bool v = false;
      if (const auto* b = std::get_if<bool>(&value)) {
        v = *b;
      } else if (text && absl::AsciiStrToLower(*text) == "true") {
        v = true;
      } else if (!text || absl::AsciiStrToLower(*text) != "false") {
        return wrong_type();
      }
      out = v;
      break;
    }
    case KnobType::kChoice:
      if (!text || std::find(k.choices.begin(), k.choices.end(), *text) == k.choices.end()) {
        return wrong_type();
      }
      out = *text;
      break;
    case KnobType::kIntList: {
      const std::optional<std::vector<int32_t>> list =
          text ? ParseIntList(*text) : std::optional<std::vector<int32_t>>();
      if (!list) {
        return Invalid(policy, absl::StrFormat("knob '%s' = %s: expected integers joined by '/' "
                                               "(e.g. \"0/-16/16/0\"), or \"\" for none",
                                               k.name, QuotedValue(value)));
      }
      out = absl::StrJoin(*list, "/");
      break;
    }
  }
  if (k.type == KnobType::kInt || k.type == KnobType::kFloat) {
    const double v = k.type == KnobType::kInt ? static_cast<double>(std::get<int64_t>(out))
                                              : std::get<double>(out);
    if ((k.min && v < *k.min) || (k.max && v > *k.max)) {
      return Invalid(
          policy, absl::StrFormat("knob '%s' = %s is outside [%s, %s]", k.name, KnobValueText(out),
                                  Bound(k, k.min, "-inf"), Bound(k, k.max, "inf")));
    }
  }
  return out;
}

// The budget as the `budget` knob takes it.
absl::StatusOr<int64_t> BudgetValue(std::string_view policy, const KnobValue& value) {
  static const auto* spec =
      new KnobSpec{"budget", KnobType::kInt, kBudgetHelp, {}, 1.0, double{kInt32Max}, {}};
  BKV_ASSIGN_OR_RETURN(KnobValue v, Coerce(policy, *spec, value));
  return std::get<int64_t>(v);
}

absl::Status ApplyBudget(PolicyConfig& config, int64_t budget, bool period_set) {
  if (auto* rpc = std::get_if<RpcConfig>(&config)) {
    if (period_set) return absl::OkStatus();
    const int64_t period = budget * rpc->ratio;
    if (period > kInt32Max) {
      return Invalid("rpc", absl::StrFormat("period = ratio (%d) x budget (%d) exceeds %d",
                                            rpc->ratio, budget, kInt32Max));
    }
    rpc->period = static_cast<int32_t>(period);
    return absl::OkStatus();
  }
  if (!SpecOf(config).budgeted) return absl::OkStatus();  // full keeps everything
  return SetKnob(config, "budget", KnobValue(budget));
}

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const auto* names = new std::vector<std::string>{"full",   "streaming", "h2o", "tova",
                                                          "snapkv", "rkv",       "rpc", "beacon"};
  return *names;
}

std::string_view PolicyName(const PolicyConfig& config) { return PolicyNames()[config.index()]; }

absl::StatusOr<PolicyConfig> DefaultPolicyConfig(std::string_view name) {
  BKV_ASSIGN_OR_RETURN(const PolicyEntry* e, FindEntry(name));
  return e->defaults;
}

std::string_view BudgetModeName(BudgetMode mode) {
  for (const auto& [value, text] : BudgetModeChoices()) {
    if (value == mode) return text;
  }
  return "?";
}

absl::StatusOr<BudgetMode> ParseBudgetMode(std::string_view name) {
  for (const auto& [value, text] : BudgetModeChoices()) {
    if (text == name) return value;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown budget mode \"%s\"; expected uniform or pooled", name));
}

std::string_view KnobTypeName(KnobType type) {
  switch (type) {
    case KnobType::kInt:
      return "int";
    case KnobType::kFloat:
      return "float";
    case KnobType::kBool:
      return "bool";
    case KnobType::kChoice:
      return "choice";
    case KnobType::kIntList:
      return "ints";
  }
  return "?";
}

std::string KnobValueText(const KnobValue& value) {
  return std::visit(Overloaded{
                        [](bool b) { return std::string(b ? "true" : "false"); },
                        [](int64_t i) { return absl::StrCat(i); },
                        [](double d) { return absl::StrCat(d); },
                        [](const std::string& s) { return s; },
                    },
                    value);
}

const KnobSpec* PolicySpec::FindKnob(std::string_view knob) const {
  for (const KnobSpec& k : knobs) {
    if (k.name == knob) return &k;
  }
  return nullptr;
}

const std::vector<PolicySpec>& PolicySpecs() {
  static const auto* specs = [] {
    auto* v = new std::vector<PolicySpec>;
    for (const PolicyEntry& e : Registry()) v->push_back(e.spec);
    return v;
  }();
  return *specs;
}

absl::StatusOr<const PolicySpec*> FindPolicySpec(std::string_view name) {
  BKV_ASSIGN_OR_RETURN(const PolicyEntry* e, FindEntry(name));
  return &PolicySpecs()[e->defaults.index()];
}

const PolicySpec& SpecOf(const PolicyConfig& config) { return PolicySpecs()[config.index()]; }

absl::StatusOr<KnobValue> GetKnob(const PolicyConfig& config, std::string_view knob) {
  const PolicyEntry& e = EntryOf(config);
  BKV_ASSIGN_OR_RETURN(int32_t i, KnobIndex(e, knob));
  return e.access[i].get(config);
}

absl::Status SetKnob(PolicyConfig& config, std::string_view knob, const KnobValue& value) {
  const PolicyEntry& e = EntryOf(config);
  BKV_ASSIGN_OR_RETURN(int32_t i, KnobIndex(e, knob));
  BKV_ASSIGN_OR_RETURN(KnobValue v, Coerce(e.spec.name, e.spec.knobs[i], value));
  e.access[i].set(config, v);
  return absl::OkStatus();
}

absl::Status CheckKnobRanges(const PolicyConfig& config) {
  const PolicyEntry& e = EntryOf(config);
  for (size_t i = 0; i < e.spec.knobs.size(); ++i) {
    BKV_RETURN_IF_ERROR(Coerce(e.spec.name, e.spec.knobs[i], e.access[i].get(config)).status());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::string>> ParseKnobAssignment(std::string_view item) {
  const size_t eq = item.find('=');
  std::string key(eq == std::string_view::npos ? std::string_view() : item.substr(0, eq));
  absl::StripAsciiWhitespace(&key);
  if (key.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat("knob '%s': expected NAME=VALUE", item));
  }
  return std::make_pair(std::move(key), std::string(item.substr(eq + 1)));
}

absl::StatusOr<PolicySpecText> ParsePolicySpecText(std::string_view text) {
  constexpr std::string_view kPooled = "-pooled";
  const size_t colon = text.find(':');
  PolicySpecText out;
  out.name = std::string(text.substr(0, colon));
  if (out.name.size() > kPooled.size() &&
      std::string_view(out.name).substr(out.name.size() - kPooled.size()) == kPooled) {
    out.name.resize(out.name.size() - kPooled.size());
    out.knobs.emplace_back("budget_mode", KnobValue(std::string("pooled")));
  }
  if (colon == std::string_view::npos) return out;
  const std::string knobs(text.substr(colon + 1));
  if (knobs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("policy '%s': expected KNOB=VALUE after ':'", text));
  }
  for (const std::string& item : std::vector<std::string>(absl::StrSplit(knobs, ','))) {
    BKV_ASSIGN_OR_RETURN(auto kv, ParseKnobAssignment(item));
    out.knobs.emplace_back(std::move(kv.first), KnobValue(std::move(kv.second)));
  }
  return out;
}

absl::StatusOr<bool> NamesModelPolicy(std::string_view spec) {
  BKV_ASSIGN_OR_RETURN(PolicySpecText text, ParsePolicySpecText(spec));
  return text.name == kModelPolicyName;
}

namespace {

absl::Status ModelSpecError(std::string_view model_spec, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("policy '%s' (the model's '%s'): %s", kModelPolicyName, model_spec, why));
}

// `model_spec` parsed, for a request whose spec names "model": a registry policy and its
// knobs, without a budget (the user's to choose; rpc's period is its budget).
absl::StatusOr<PolicySpecText> ModelSpecText(std::string_view model_spec) {
  if (model_spec.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy '%s' stands for the policy a model recommends (its config.json's "
        "\"beaconkv_policy\"), and no model policy was given; name a policy instead",
        kModelPolicyName));
  }
  auto fail = [&](absl::string_view why) { return ModelSpecError(model_spec, why); };
  absl::StatusOr<PolicySpecText> text = ParsePolicySpecText(model_spec);
  if (!text.ok()) return fail(text.status().message());
  if (text->name == kModelPolicyName) return fail("it must name a policy of the registry");
  if (absl::Status found = FindEntry(text->name).status(); !found.ok()) {
    return fail(found.message());
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& [knob, value] : text->knobs) {
    if (knob == "budget" || knob == "period") {
      return fail(absl::StrFormat("it sets '%s'; the budget is the user's to choose", knob));
    }
    if (!seen.insert(knob).second) return fail(absl::StrFormat("knob '%s' is given twice", knob));
  }
  return text;
}

// BuildPolicyConfig once the name is a registry policy's: `model_knobs` (the model's spec, for
// "model") come right after the defaults.
absl::StatusOr<PolicyConfig> BuildFromText(
    const PolicyRequest& request, const PolicySpecText& text,
    const std::vector<std::pair<std::string, KnobValue>>& model_knobs) {
  BKV_ASSIGN_OR_RETURN(const PolicyEntry* entry, FindEntry(text.name));
  const std::string& name = entry->spec.name;
  PolicyConfig config = entry->defaults;
  std::optional<int64_t> budget;
  auto take_budget = [&](const KnobValue& value) -> absl::Status {
    BKV_ASSIGN_OR_RETURN(int64_t b, BudgetValue(name, value));
    if (budget && *budget != b) {
      return Invalid(name, absl::StrFormat("budgets %d and %d disagree; give one", *budget, b));
    }
    budget = b;
    return absl::OkStatus();
  };
  if (request.budget) BKV_RETURN_IF_ERROR(take_budget(KnobValue(*request.budget)));
  for (const auto& [knob, value] : model_knobs) {  // distinct, budget-free: ModelSpecText
    BKV_RETURN_IF_ERROR(SetKnob(config, knob, value));
  }
  bool period_set = false;
  if (request.interval && entry->spec.FindKnob("interval") != nullptr) {
    BKV_RETURN_IF_ERROR(SetKnob(config, "interval", KnobValue(*request.interval)));
  }
  auto apply = [&](const std::vector<std::pair<std::string, KnobValue>>& knobs) -> absl::Status {
    absl::flat_hash_set<std::string> seen;
    for (const auto& [knob, value] : knobs) {
      if (!seen.insert(knob).second) {
        return Invalid(name, absl::StrFormat("knob '%s' is given twice", knob));
      }
    }
    for (const auto& [knob, value] : knobs) {
      if (knob == "budget") {
        BKV_RETURN_IF_ERROR(take_budget(value));
        continue;
      }
      period_set = period_set || knob == "period";
      BKV_RETURN_IF_ERROR(SetKnob(config, knob, value));
    }
    return absl::OkStatus();
  };
  BKV_RETURN_IF_ERROR(apply(request.knobs));
  BKV_RETURN_IF_ERROR(apply(text.knobs));
  if (budget) BKV_RETURN_IF_ERROR(ApplyBudget(config, *budget, period_set));
  BKV_RETURN_IF_ERROR(ValidatePolicyConfig(config));
  return config;
}

}  // namespace

absl::StatusOr<PolicyConfig> BuildPolicyConfig(const PolicyRequest& request,
                                               std::string_view model_spec) {
  BKV_ASSIGN_OR_RETURN(PolicySpecText text, ParsePolicySpecText(request.spec));
  if (text.name != kModelPolicyName) return BuildFromText(request, text, {});
  BKV_ASSIGN_OR_RETURN(PolicySpecText model, ModelSpecText(model_spec));
  text.name = std::move(model.name);
  absl::StatusOr<PolicyConfig> config = BuildFromText(request, text, model.knobs);
  // Whatever fails now (a model knob, or the user's on top of the model's), the message says
  // which spec "model" stood for.
  if (!config.ok()) return ModelSpecError(model_spec, config.status().message());
  return config;
}

std::optional<int32_t> PolicyBudget(const PolicyConfig& config) {
  if (const auto* rpc = std::get_if<RpcConfig>(&config)) return rpc->period / rpc->ratio;
  if (!SpecOf(config).budgeted) return std::nullopt;
  absl::StatusOr<KnobValue> budget = GetKnob(config, "budget");
  BKV_CHECK(budget.ok());  // every budgeted policy but rpc has the knob
  return static_cast<int32_t>(std::get<int64_t>(*budget));
}

}  // namespace beaconkv

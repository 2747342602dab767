// libFuzzer target: the eviction policies as a caller drives them (core/policy.h), on any
// registered policy with fuzzed knobs and geometry. The input picks the policy, its knobs
// (inside, at and past their ranges), the geometry, then a sequence of decode steps whose
// queries and keys may hold any float, NaN and infinities included, and of calls that are
// sometimes malformed: a head out of range, null queries, a due list out of order, heads of
// the wrong number, negative token counts, duplicate positions, null keys. Every call must
// return a status or keep its promises (never a crash or a sanitizer report):
//   - DueHeads: ascending heads of the layer;
//   - Compress: at most one keep-set per head of the layer, slots ascending, unique, in range;
//     the keep-sets are applied to the simulated cache, as the engine applies them;
//   - PlanScoring: tasks in ascending kv_head order, masks the size of their head, the
//     uniform plan's keep masks (protected + k picks) accepted by KeepSetsFromMasks, a pooled
//     plan's scores accepted by SelectFromScores, with the same keep-set promises.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/policy.h"
#include "core/policy_config.h"
#include "tests/fuzz/fuzz_check.h"

namespace beaconkv {
namespace {

// A float: mostly ordinary, sometimes extreme or not finite.
float AnyFloat(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -std::numeric_limits<float>::max();
    case 3:
      return std::numeric_limits<float>::denorm_min();
    case 4:
      return 0.0f;
    default:
      return in.ConsumeFloatingPointInRange<float>(-8.0f, 8.0f);
  }
}

// n floats from a seed (a hash pattern around `base`), so that a step costs the input a few
// bytes however many heads it fills.
void Pattern(float base, uint32_t seed, size_t n, std::vector<float>* out) {
  out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t h = (static_cast<uint32_t>(i) + 1u) * 2654435761u ^ seed * 40503u;
    (*out)[i] = base + static_cast<float>(h % 2001u) / 250.0f - 4.0f;
  }
}

// Fills `out` with n floats: a fuzzed pattern with, now and then, a fuzzed special.
void FillFloats(FuzzedDataProvider& in, size_t n, std::vector<float>* out) {
  Pattern(in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f), in.ConsumeIntegral<uint32_t>(), n,
          out);
  if (n > 0 && in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    (*out)[in.ConsumeIntegralInRange<size_t>(0, n - 1)] = AnyFloat(in);
  }
}

// A knob value for `knob`: inside its range mostly, at or past its bounds sometimes.
KnobValue AnyKnobValue(FuzzedDataProvider& in, const KnobSpec& knob) {
  switch (knob.type) {
    case KnobType::kBool:
      return in.ConsumeBool();
    case KnobType::kChoice:
      if (knob.choices.empty() || in.ConsumeIntegralInRange<int>(0, 7) == 0)
        return std::string("bogus");
      return knob.choices[in.ConsumeIntegralInRange<size_t>(0, knob.choices.size() - 1)];
    case KnobType::kIntList: {
      std::string text;
      for (int n = in.ConsumeIntegralInRange<int>(0, 5); n > 0; --n) {
        if (!text.empty()) text += '/';
        text += std::to_string(in.ConsumeIntegralInRange<int>(-40, 40));
      }
      return text;
    }
    case KnobType::kInt: {
      const int64_t lo = knob.min ? static_cast<int64_t>(*knob.min) : -8;
      const int64_t hi = knob.max ? static_cast<int64_t>(*knob.max) : lo + 600;
      switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0:
          return lo - 1;
        case 1:
          return hi;  // (2^31 - 1 for most: the knobs' own bound)
        case 2:
          return hi + 1;
        default:
          return in.ConsumeIntegralInRange<int64_t>(lo, std::max(lo, std::min(hi, lo + 600)));
      }
    }
    case KnobType::kFloat: {
      const double lo = knob.min.value_or(-4.0);
      const double hi = std::max(lo, std::min(knob.max.value_or(lo + 8.0), 1e6));
      switch (in.ConsumeIntegralInRange<int>(0, 9)) {
        case 0:
          return std::numeric_limits<double>::quiet_NaN();
        case 1:
          return lo - 1.0;
        case 2:
          return hi;
        default:
          return in.ConsumeFloatingPointInRange<double>(lo, hi);
      }
    }
  }
  return int64_t{0};
}

// The cache the engine would hold: per (layer, kv_head), each token's position and key, in
// slot order.
struct SimHead {
  std::vector<int32_t> positions;
  std::vector<float> keys;  // [tokens, head_dim]
};

class Driver {
 public:
  Driver(const PolicyGeometry& g, std::unique_ptr<PolicyState> state)
      : g_(g), state_(std::move(state)), heads_(g.num_heads_total()) {}

  void Step(FuzzedDataProvider& in) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0:
        Plan(in);
        break;
      case 1:
        Malformed(in);
        break;
      default:
        for (int n = in.ConsumeIntegralInRange<int>(1, 8); n > 0; --n) {
          Decode(in);
          Compress(in);
        }
        break;
    }
  }

 private:
  int32_t d() const { return g_.head_dim(); }
  SimHead& head(int32_t layer, int32_t kv_head) { return heads_[g_.HeadIndex(layer, kv_head)]; }

  // One decode step: every head gets the new token's key and observes its queries.
  void Decode(FuzzedDataProvider& in) {
    // Positions advance one a step, sometimes jump ahead (a caller's own numbering); they stay
    // unique, as HeadKeys promises (duplicates are one of the malformed calls).
    position_ +=
        in.ConsumeIntegralInRange<int>(0, 31) == 0 ? in.ConsumeIntegralInRange<int32_t>(1, 64) : 1;
    const float base = in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
    const uint32_t seed = in.ConsumeIntegral<uint32_t>();
    const bool special = in.ConsumeIntegralInRange<int>(0, 15) == 0;
    const size_t q = static_cast<size_t>(g_.group_size) * d();
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      for (int32_t h = 0; h < g_.num_kv_heads; ++h) {
        SimHead& s = head(l, h);
        const uint32_t head_seed = seed + 7919u * static_cast<uint32_t>(g_.HeadIndex(l, h));
        Pattern(base, head_seed, d(), &key_);
        Pattern(base, head_seed + 1u, q, &pre_);
        Pattern(base, head_seed + 2u, q, &post_);
        if (special && l == 0 && h == 0) {
          key_[0] = AnyFloat(in);
          pre_[q - 1] = AnyFloat(in);
        }
        s.positions.push_back(position_);
        s.keys.insert(s.keys.end(), key_.begin(), key_.end());
        const HeadKeys keys{s.keys.data(), s.positions.data(),
                            static_cast<int32_t>(s.positions.size())};
        (void)state_->Observe(l, h, StepQueries{position_, pre_.data(), post_.data()},
                              state_->NeedsKeysOnObserve() ? &keys : nullptr);
      }
    }
  }

  std::vector<HeadKeys> LayerHeads(int32_t layer, bool with_keys) {
    std::vector<HeadKeys> out(g_.num_kv_heads);
    for (int32_t h = 0; h < g_.num_kv_heads; ++h) {
      SimHead& s = head(layer, h);
      out[h] = {with_keys ? s.keys.data() : nullptr, s.positions.data(),
                static_cast<int32_t>(s.positions.size())};
    }
    return out;
  }

  std::vector<int32_t> Tokens(int32_t layer) {
    std::vector<int32_t> t(g_.num_kv_heads);
    for (int32_t h = 0; h < g_.num_kv_heads; ++h)
      t[h] = static_cast<int32_t>(head(layer, h).positions.size());
    return t;
  }

  // Keep-set promises for one compression of `layer`; applies the sets to the cache.
  void Apply(int32_t layer, const std::vector<KeepSet>& sets) {
    std::vector<uint8_t> seen(g_.num_kv_heads, 0);
    for (const KeepSet& k : sets) {
      FUZZ_CHECK(k.layer == layer);
      FUZZ_CHECK(k.kv_head >= 0 && k.kv_head < g_.num_kv_heads);
      FUZZ_CHECK(!seen[k.kv_head]);
      seen[k.kv_head] = 1;
      SimHead& s = head(layer, k.kv_head);
      const int32_t n = static_cast<int32_t>(s.positions.size());
      for (size_t i = 0; i < k.slots.size(); ++i) {
        FUZZ_CHECK(k.slots[i] >= 0 && k.slots[i] < n);
        FUZZ_CHECK(i == 0 || k.slots[i - 1] < k.slots[i]);
      }
      SimHead kept;
      for (const int32_t j : k.slots) {
        kept.positions.push_back(s.positions[j]);
        kept.keys.insert(kept.keys.end(), s.keys.begin() + static_cast<ptrdiff_t>(j) * d(),
                         s.keys.begin() + static_cast<ptrdiff_t>(j + 1) * d());
      }
      s = std::move(kept);
    }
  }

  // What the engine does after a step: each layer's due heads, compressed.
  void Compress(FuzzedDataProvider& in) {
    for (int32_t l = 0; l < g_.num_layers; ++l) {
      const std::vector<int32_t> due = state_->DueHeads(l, Tokens(l));
      for (size_t i = 0; i < due.size(); ++i) {
        FUZZ_CHECK(due[i] >= 0 && due[i] < g_.num_kv_heads);
        FUZZ_CHECK(i == 0 || due[i - 1] < due[i]);
      }
      if (due.empty() && in.ConsumeIntegralInRange<int>(0, 7) != 0) continue;
      const std::vector<HeadKeys> heads = LayerHeads(l, true);
      absl::StatusOr<std::vector<KeepSet>> sets = state_->Compress(l, heads, due, position_);
      if (sets.ok()) Apply(l, *sets);
    }
  }

  // The external scorer's route for one layer: plan, then keep masks or scores.
  void Plan(FuzzedDataProvider& in) {
    const int32_t l = in.ConsumeIntegralInRange<int32_t>(0, g_.num_layers - 1);
    std::vector<int32_t> due = state_->DueHeads(l, Tokens(l));
    if (due.empty()) {
      for (int32_t h = 0; h < g_.num_kv_heads; ++h) {
        if (in.ConsumeBool()) due.push_back(h);
      }
    }
    const std::vector<HeadKeys> heads = LayerHeads(l, in.ConsumeBool());
    absl::StatusOr<ScoringPlan> plan = state_->PlanScoring(l, heads, due, position_);
    if (!plan.ok()) return;
    FUZZ_CHECK(plan->layer == l);
    for (size_t t = 0; t < plan->tasks.size(); ++t) {
      const ScoringTask& task = plan->tasks[t];
      FUZZ_CHECK(task.kv_head >= 0 && task.kv_head < g_.num_kv_heads);
      FUZZ_CHECK(t == 0 || plan->tasks[t - 1].kv_head < task.kv_head);
      FUZZ_CHECK(task.num_tokens() == heads[task.kv_head].num_tokens);
      FUZZ_CHECK(task.reserve.empty() || task.reserve.size() == task.protect.size());
      FUZZ_CHECK(task.queries.size() ==
                 static_cast<size_t>(task.num_queries) * plan->group_size * d());
      FUZZ_CHECK(task.rotated_rows >= 0 && task.rotated_rows <= task.num_queries);
      FUZZ_CHECK(task.k >= 0);
    }
    absl::StatusOr<std::vector<KeepSet>> sets;
    if (plan->pooled) {
      std::vector<std::vector<float>> scores(plan->tasks.size());
      std::vector<absl::Span<const float>> spans;
      for (size_t t = 0; t < plan->tasks.size(); ++t) {
        FillFloats(in, plan->tasks[t].num_tokens(), &scores[t]);
        spans.emplace_back(scores[t]);
      }
      sets = state_->SelectFromScores(*plan, heads, spans);
    } else {
      // The protected slots and the first k others, as a scorer whose scores all tie would.
      std::vector<std::vector<uint8_t>> masks(plan->tasks.size());
      std::vector<absl::Span<const uint8_t>> spans;
      for (size_t t = 0; t < plan->tasks.size(); ++t) {
        const ScoringTask& task = plan->tasks[t];
        masks[t] = task.protect;
        int64_t k = task.k;
        for (uint8_t& m : masks[t]) {
          if (!m && k > 0) m = 1, --k;
        }
        spans.emplace_back(masks[t]);
      }
      sets = KeepSetsFromMasks(*plan, spans);
      FUZZ_CHECK(sets.ok());
    }
    if (sets.ok()) Apply(l, *sets);
  }

  // A call with a bad argument: must return a status (or, where the API allows any input,
  // keep its promises), and leave the state usable.
  void Malformed(FuzzedDataProvider& in) {
    const int32_t l = in.ConsumeIntegralInRange<int32_t>(-1, g_.num_layers);
    const int32_t h = in.ConsumeIntegralInRange<int32_t>(-1, g_.num_kv_heads);
    const bool layer_ok = l >= 0 && l < g_.num_layers;
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: {  // observe: a head out of range or null queries
        FillFloats(in, static_cast<size_t>(g_.group_size) * d(), &pre_);
        const bool null = in.ConsumeBool();
        (void)state_->Observe(
            l, h, StepQueries{position_, null ? nullptr : pre_.data(), pre_.data()}, nullptr);
        break;
      }
      case 1: {  // due heads of any counts, any number of them
        std::vector<int32_t> tokens(in.ConsumeIntegralInRange<size_t>(0, g_.num_kv_heads + 1));
        for (int32_t& t : tokens) t = in.ConsumeIntegralInRange<int32_t>(-3, 4096);
        if (!layer_ok) break;  // DueHeads takes the layer from the caller's own loop
        (void)state_->DueHeads(l, tokens);
        break;
      }
      default: {  // compress with a due list, heads or keys that do not fit
        if (!layer_ok) {
          (void)state_->Compress(l, {}, {}, position_);
          break;
        }
        std::vector<int32_t> due;
        for (int n = in.ConsumeIntegralInRange<int>(0, 3); n > 0; --n)
          due.push_back(in.ConsumeIntegralInRange<int32_t>(-1, g_.num_kv_heads));
        std::vector<HeadKeys> heads = LayerHeads(l, !in.ConsumeBool());
        std::vector<int32_t> positions;
        if (!heads.empty()) {
          HeadKeys& victim = heads[in.ConsumeIntegralInRange<size_t>(0, heads.size() - 1)];
          switch (in.ConsumeIntegralInRange<int>(0, 3)) {
            case 0:
              victim.num_tokens = -in.ConsumeIntegralInRange<int32_t>(1, 5);
              break;
            case 1:  // a duplicate position
              positions.assign(victim.positions, victim.positions + victim.num_tokens);
              if (positions.size() >= 2) positions.back() = positions.front();
              victim.positions = positions.data();
              break;
            case 2:
              heads.pop_back();
              break;
            default:
              victim.positions = nullptr;
              break;
          }
        }
        absl::StatusOr<std::vector<KeepSet>> sets =
            state_->Compress(l, heads, due, in.ConsumeIntegralInRange<int32_t>(-5, position_ + 5));
        // A call that was accepted must still keep its promises on the real heads.
        if (sets.ok() && heads.size() == static_cast<size_t>(g_.num_kv_heads)) {
          bool intact = positions.empty();
          for (int32_t k = 0; k < g_.num_kv_heads; ++k) {
            intact = intact &&
                     heads[k].num_tokens == static_cast<int32_t>(head(l, k).positions.size()) &&
                     heads[k].positions != nullptr;
          }
          if (intact) Apply(l, *sets);
        }
        break;
      }
    }
  }

  PolicyGeometry g_;
  std::unique_ptr<PolicyState> state_;
  std::vector<SimHead> heads_;
  int32_t position_ = -1;
  std::vector<float> key_, pre_, post_;
};

}  // namespace
}  // namespace beaconkv

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace beaconkv;
  FuzzedDataProvider in(data, size);
  const std::vector<PolicySpec>& specs = PolicySpecs();
  const PolicySpec& spec = specs[in.ConsumeIntegralInRange<size_t>(0, specs.size() - 1)];
  PolicyRequest request;
  request.spec = spec.name;
  if (spec.budgeted) request.budget = in.ConsumeIntegralInRange<int64_t>(-1, 48);
  // Short intervals, so that a short input reaches compressions.
  if (in.ConsumeBool()) request.interval = in.ConsumeIntegralInRange<int64_t>(0, 24);
  for (int n = in.ConsumeIntegralInRange<int>(0, 5); n > 0 && !spec.knobs.empty(); --n) {
    const KnobSpec& knob = spec.knobs[in.ConsumeIntegralInRange<size_t>(0, spec.knobs.size() - 1)];
    if (knob.name == "budget") continue;  // the request's budget
    bool repeated = false;
    for (const auto& [name, value] : request.knobs) repeated = repeated || name == knob.name;
    if (!repeated) request.knobs.emplace_back(knob.name, AnyKnobValue(in, knob));
  }
  absl::StatusOr<PolicyConfig> config = BuildPolicyConfig(request);
  if (!config.ok()) return 0;

  PolicyGeometry g;
  g.num_layers = in.ConsumeIntegralInRange<int32_t>(0, 3);
  g.num_kv_heads = in.ConsumeIntegralInRange<int32_t>(0, 3);
  g.group_size = in.ConsumeIntegralInRange<int32_t>(0, 3);
  constexpr int32_t kDims[] = {0, 1, 2, 4, 6, 8, 16, 32, 34};
  g.rope.head_dim = kDims[in.ConsumeIntegralInRange<size_t>(0, std::size(kDims) - 1)];
  constexpr double kThetas[] = {1e4, 1e6, 10.0, 0.0, -1.0};
  g.rope.rope_theta = kThetas[in.ConsumeIntegralInRange<size_t>(0, std::size(kThetas) - 1)];
  const int32_t prompt_len = in.ConsumeIntegralInRange<int32_t>(-1, 24);
  absl::StatusOr<std::unique_ptr<PolicyState>> state = NewPolicyState(*config, g, prompt_len);
  if (!state.ok()) return 0;
  FUZZ_CHECK(g.num_layers > 0 && g.num_kv_heads > 0 && g.group_size > 0 && g.head_dim() > 0);

  Driver driver(g, *std::move(state));
  for (int ops = 0; ops < 200 && in.remaining_bytes() > 0; ++ops) driver.Step(in);
  return 0;
}

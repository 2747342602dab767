// What a policy configuration may hold and what it does: the constraints between knobs (each
// knob's own range is the registry's, core/policy_config.cc) and the four choices a policy
// makes silently, stated.
#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <variant>

#include "absl/strings/str_format.h"
#include "core/overloaded.h"
#include "core/policy_config.h"
#include "core/status_macros.h"

namespace beaconkv {
namespace {

absl::Status Invalid(std::string_view policy, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("policy %s: %s", policy, message));
}

absl::Status CheckKernel(std::string_view policy, int32_t kernel) {
  return ValidatePoolKernel(kernel, absl::StrFormat("policy %s", policy).c_str());
}

absl::Status CheckWindowed(std::string_view policy, int32_t budget, int32_t window,
                           int32_t kernel) {
  if (budget <= window) {
    return Invalid(policy, absl::StrFormat("budget (%d) must exceed the protected window (%d)",
                                           budget, window));
  }
  return CheckKernel(policy, kernel);
}

// The trigger of a policy whose heads are compressed at budget + interval (64 bits: both
// knobs may be at their 2^31 - 1 bound).
std::string HeadTrigger(int32_t budget, int32_t interval) {
  return absl::StrFormat("head holds budget + interval = %d tokens", int64_t{budget} + interval);
}

}  // namespace

absl::Status ValidatePolicyConfig(const PolicyConfig& config) {
  BKV_RETURN_IF_ERROR(CheckKnobRanges(config));
  // Constraints between knobs; each knob's own range is the registry's.
  return std::visit(
      Overloaded{
          [](const FullConfig&) { return absl::OkStatus(); },
          [](const StreamingConfig& c) {
            if (c.n_sinks > c.budget) {
              return Invalid("streaming", absl::StrFormat("n_sinks (%d) must be in [0, budget=%d]",
                                                          c.n_sinks, c.budget));
            }
            return absl::OkStatus();
          },
          [](const H2OConfig&) { return absl::OkStatus(); },
          [](const TovaConfig&) { return absl::OkStatus(); },
          [](const SnapKvConfig& c) {
            return CheckWindowed("snapkv", c.budget, c.window, c.pool_kernel);
          },
          [](const RkvConfig& c) {
            return CheckWindowed("rkv", c.budget, c.window, c.pool_kernel);
          },
          [](const RpcConfig& c) {
            if (c.period / c.ratio < 1) {
              return Invalid("rpc",
                             absl::StrFormat("period / ratio must keep >= 1 token, got %d / %d",
                                             c.period, c.ratio));
            }
            return CheckKernel("rpc", c.pool_kernel);
          },
          [](const BeaconConfig& c) {
            const int64_t protected_tokens = int64_t{c.n_recent} + c.n_sinks;  // (no overflow)
            if (c.budget < protected_tokens) {
              return Invalid("beacon",
                             absl::StrFormat("budget (%d) is smaller than the protected tokens "
                                             "n_recent + n_sinks = %d",
                                             c.budget, protected_tokens));
            }
            int64_t offsets = 0;
            for (size_t l = 0; l < c.layer_budget_offsets.size(); ++l) {
              offsets += c.layer_budget_offsets[l];
              const int64_t b = LayerBudget(c, static_cast<int32_t>(l));
              if (b < protected_tokens) {
                return Invalid("beacon", absl::StrFormat("layer %d's budget (%d + %d = %d) is "
                                                         "smaller than the protected tokens "
                                                         "n_recent + n_sinks = %d",
                                                         l, c.budget, c.layer_budget_offsets[l], b,
                                                         protected_tokens));
              }
              if (b > std::numeric_limits<int32_t>::max()) {
                return Invalid("beacon", absl::StrFormat("layer %d's budget (%d + %d) is above "
                                                         "%d",
                                                         l, c.budget, c.layer_budget_offsets[l],
                                                         std::numeric_limits<int32_t>::max()));
              }
            }
            if (offsets != 0) {
              return Invalid("beacon",
                             absl::StrFormat("layer_budget_offsets must sum to 0 (the layers "
                                             "share budget x layers), got %d",
                                             offsets));
            }
            if (c.buffer_min >= c.buffer_max) {
              return Invalid("beacon",
                             absl::StrFormat("need 1 <= buffer_min < buffer_max, got buffer_min=%d "
                                             "buffer_max=%d",
                                             c.buffer_min, c.buffer_max));
            }
            if (c.n_beacons > c.buffer_min) {
              return Invalid("beacon",
                             absl::StrFormat("n_beacons (%d) must not exceed buffer_min (%d)",
                                             c.n_beacons, c.buffer_min));
            }
            if (c.redundancy > 0 && c.budget_mode != BudgetMode::kUniform) {
              return Invalid("beacon",
                             "redundancy > 0 needs budget_mode=uniform (a rank with the "
                             "redundancy subtracted can be negative, which pooled budgets "
                             "cannot normalise)");
            }
            if (!c.blur_layers.empty() && c.blur_speed <= 0.0) {
              return Invalid("beacon",
                             "blur_layers needs blur_speed > 0 (without it no layer "
                             "scores blurred rows)");
            }
            for (size_t i = 0; i < c.blur_layers.size(); ++i) {
              if (c.blur_layers[i] < 0) {
                return Invalid("beacon", absl::StrFormat("blur_layers: layer %d is negative",
                                                         c.blur_layers[i]));
              }
              if (std::find(c.blur_layers.begin(), c.blur_layers.begin() + i, c.blur_layers[i]) !=
                  c.blur_layers.begin() + i) {
                return Invalid("beacon", absl::StrFormat("blur_layers: layer %d is listed twice",
                                                         c.blur_layers[i]));
              }
            }
            return CheckKernel("beacon", c.pool_kernel);
          },
      },
      config);
}

int32_t CountBiasLayers(const PolicyConfig& config) {
  const BeaconConfig* b = std::get_if<BeaconConfig>(&config);
  return b != nullptr && b->count_bias ? b->coverage_layers : 0;
}

int64_t LayerBudget(int64_t budget, const std::vector<int32_t>& offsets, int32_t layer) {
  const bool offset = layer >= 0 && layer < static_cast<int32_t>(offsets.size());
  return budget + (offset ? offsets[layer] : 0);
}

int32_t PromptSlotsInEffect(const BeaconConfig& c) {
  const int64_t free = int64_t{c.budget} - c.n_recent - c.n_sinks;
  return static_cast<int32_t>(std::clamp<int64_t>(free / 8, 0, std::max(c.prompt_slots, 0)));
}

int32_t PromptSlotsInEffect(const PolicyConfig& config) {
  const BeaconConfig* b = std::get_if<BeaconConfig>(&config);
  return b == nullptr ? 0 : PromptSlotsInEffect(*b);
}

PolicyTraits DescribePolicy(const PolicyConfig& config) {
  return std::visit(
      Overloaded{
          [](const FullConfig&) {
            return PolicyTraits{"none", "none", "none", "never"};
          },
          [](const StreamingConfig& c) {
            return PolicyTraits{"none (position rule)", "none", "none",
                                HeadTrigger(c.budget, c.interval)};
          },
          [](const H2OConfig& c) {
            return PolicyTraits{"post-RoPE, every observed query (prefill and decode), accumulated",
                                "sum of softmax probabilities over the group's query heads", "none",
                                HeadTrigger(c.budget, c.interval)};
          },
          [](const TovaConfig& c) {
            return PolicyTraits{"post-RoPE, last query only",
                                GqaReductionName(GqaReduction::kMeanProbs), "none",
                                HeadTrigger(c.budget, c.interval)};
          },
          [](const SnapKvConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE, last %d queries; mean over queries", c.window),
                GqaReductionName(GqaReduction::kMaxLogits),
                absl::StrFormat("%s kernel %d", PoolingName(c.pooling), c.pool_kernel),
                HeadTrigger(c.budget, c.interval)};
          },
          [](const RkvConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE, last %d queries; mean over queries", c.window),
                GqaReductionName(GqaReduction::kMaxLogits),
                absl::StrFormat("maxpool kernel %d (importance only)", c.pool_kernel),
                HeadTrigger(c.budget, c.interval)};
          },
          [](const RpcConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE, last %d queries; sum over queries", c.window),
                "softmax per query head, then mean over ALL heads of the layer (one token set "
                "per layer)",
                absl::StrFormat("%s kernel %d", PoolingName(c.pooling), c.pool_kernel),
                absl::StrFormat("layer holds prompt + kept + window + period (%d) tokens",
                                c.period)};
          },
          [](const BeaconConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE last %d queries of every query head + %d beacons "
                                "(pre-RoPE buffer, rotated to the current position)%s; max; "
                                "the first %d layer(s) keep an evenly spaced sample first%s",
                                c.n_recent, c.n_beacons, c.score_bf16 ? ", scored in bfloat16" : "",
                                c.coverage_layers,
                                c.redundancy > 0
                                    ? absl::StrFormat("; the others rank by score - %g x n x "
                                                      "redundancy (cosine > %g)",
                                                      c.redundancy, c.redundancy_threshold)
                                    : std::string()),
                GqaReductionName(GqaReduction::kMaxProbs),
                c.pool_kernel > 1 ? absl::StrFormat("maxpool kernel %d", c.pool_kernel)
                                  : std::string("none"),
                c.budget_mode == BudgetMode::kUniform
                    ? HeadTrigger(c.budget, c.interval)
                    : absl::StrFormat("layer holds (budget + interval) * num_kv_heads = %d "
                                      "* num_kv_heads tokens",
                                      int64_t{c.budget} + c.interval)};
          },
      },
      config);
}

}  // namespace beaconkv

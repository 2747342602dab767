#include "core/policy_config.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace beaconkv {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
// Clang 14 does not deduce aggregate template arguments yet (the TSan and fuzz builds).
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

absl::Status Invalid(std::string_view policy, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("policy %s: %s", policy, message));
}

absl::Status CheckBudgetInterval(std::string_view policy, int32_t budget, int32_t interval) {
  if (budget < 1) return Invalid(policy, absl::StrFormat("budget must be >= 1, got %d", budget));
  if (interval < 1) {
    return Invalid(policy, absl::StrFormat("interval must be >= 1, got %d", interval));
  }
  return absl::OkStatus();
}

absl::Status CheckKernel(std::string_view policy, int32_t kernel) {
  if (kernel < 1 || kernel % 2 == 0) {
    return Invalid(policy,
                   absl::StrFormat("pool_kernel must be odd and >= 1 (1 = off), got %d", kernel));
  }
  return absl::OkStatus();
}

absl::Status CheckWindowed(std::string_view policy, int32_t budget, int32_t window,
                           int32_t interval, int32_t kernel) {
  if (absl::Status s = CheckBudgetInterval(policy, budget, interval); !s.ok()) return s;
  if (window < 1) return Invalid(policy, absl::StrFormat("window must be >= 1, got %d", window));
  if (budget <= window) {
    return Invalid(policy, absl::StrFormat("budget (%d) must exceed the protected window (%d)",
                                           budget, window));
  }
  return CheckKernel(policy, kernel);
}

}  // namespace

const std::vector<std::string>& PolicyNames() {
  static const auto* names = new std::vector<std::string>{"full",   "streaming", "h2o", "tova",
                                                          "snapkv", "rkv",       "rpc", "beacon"};
  return *names;
}

std::string_view PolicyName(const PolicyConfig& config) { return PolicyNames()[config.index()]; }

absl::StatusOr<PolicyConfig> DefaultPolicyConfig(std::string_view name) {
  if (name == "full") return PolicyConfig(FullConfig{});
  if (name == "streaming") return PolicyConfig(StreamingConfig{});
  if (name == "h2o") return PolicyConfig(H2OConfig{});
  if (name == "tova") return PolicyConfig(TovaConfig{});
  if (name == "snapkv") return PolicyConfig(SnapKvConfig{});
  if (name == "rkv") return PolicyConfig(RkvConfig{});
  if (name == "rpc") return PolicyConfig(RpcConfig{});
  if (name == "beacon") return PolicyConfig(BeaconConfig{});
  return absl::InvalidArgumentError(absl::StrFormat("unknown policy \"%s\"; expected one of: %s",
                                                    name, absl::StrJoin(PolicyNames(), ", ")));
}

std::string_view BudgetModeName(BudgetMode mode) {
  return mode == BudgetMode::kUniform ? "uniform" : "pooled";
}

absl::StatusOr<BudgetMode> ParseBudgetMode(std::string_view name) {
  if (name == "uniform") return BudgetMode::kUniform;
  if (name == "pooled") return BudgetMode::kPooled;
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown budget mode \"%s\"; expected uniform or pooled", name));
}

absl::Status ValidatePolicyConfig(const PolicyConfig& config) {
  return std::visit(
      Overloaded{
          [](const FullConfig&) { return absl::OkStatus(); },
          [](const StreamingConfig& c) {
            if (absl::Status s = CheckBudgetInterval("streaming", c.budget, c.interval); !s.ok())
              return s;
            if (c.n_sinks < 0 || c.n_sinks > c.budget) {
              return Invalid("streaming", absl::StrFormat("n_sinks (%d) must be in [0, budget=%d]",
                                                          c.n_sinks, c.budget));
            }
            return absl::OkStatus();
          },
          [](const H2OConfig& c) {
            if (absl::Status s = CheckBudgetInterval("h2o", c.budget, c.interval); !s.ok())
              return s;
            if (!(c.recent_fraction >= 0.0 && c.recent_fraction <= 1.0)) {
              return Invalid("h2o", absl::StrFormat("recent_fraction must be in [0, 1], got %g",
                                                    c.recent_fraction));
            }
            return absl::OkStatus();
          },
          [](const TovaConfig& c) { return CheckBudgetInterval("tova", c.budget, c.interval); },
          [](const SnapKvConfig& c) {
            return CheckWindowed("snapkv", c.budget, c.window, c.interval, c.pool_kernel);
          },
          [](const RkvConfig& c) {
            if (absl::Status s =
                    CheckWindowed("rkv", c.budget, c.window, c.interval, c.pool_kernel);
                !s.ok())
              return s;
            if (!(c.lambda >= 0.0 && c.lambda <= 1.0)) {
              return Invalid("rkv", absl::StrFormat("lambda must be in [0, 1], got %g", c.lambda));
            }
            if (!std::isfinite(c.redundancy_threshold)) {
              return Invalid("rkv", "redundancy_threshold must be finite");
            }
            return absl::OkStatus();
          },
          [](const RpcConfig& c) {
            if (c.period < 1 || c.window < 1 || c.ratio < 1) {
              return Invalid("rpc",
                             absl::StrFormat("period (%d), window (%d) and ratio (%d) must be >= 1",
                                             c.period, c.window, c.ratio));
            }
            if (c.period / c.ratio < 1) {
              return Invalid("rpc",
                             absl::StrFormat("period / ratio must keep >= 1 token, got %d / %d",
                                             c.period, c.ratio));
            }
            return CheckKernel("rpc", c.pool_kernel);
          },
          [](const BeaconConfig& c) {
            if (absl::Status s = CheckBudgetInterval("beacon", c.budget, c.interval); !s.ok())
              return s;
            if (c.n_recent < 0 || c.n_beacons < 0 || c.n_sinks < 0 || c.coverage_layers < 0) {
              return Invalid(
                  "beacon", absl::StrFormat("n_recent (%d), n_beacons (%d), n_sinks (%d) and "
                                            "coverage_layers (%d) must be >= 0",
                                            c.n_recent, c.n_beacons, c.n_sinks, c.coverage_layers));
            }
            if (c.budget < c.n_recent + c.n_sinks) {
              return Invalid("beacon",
                             absl::StrFormat("budget (%d) is smaller than the protected tokens "
                                             "n_recent + n_sinks = %d",
                                             c.budget, c.n_recent + c.n_sinks));
            }
            if (c.buffer_min < 1 || c.buffer_min >= c.buffer_max) {
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
            return CheckKernel("beacon", c.pool_kernel);
          },
      },
      config);
}

PolicyTraits DescribePolicy(const PolicyConfig& config) {
  return std::visit(
      Overloaded{
          [](const FullConfig&) {
            return PolicyTraits{"none", "none", "none", "never"};
          },
          [](const StreamingConfig& c) {
            return PolicyTraits{
                "none (position rule)", "none", "none",
                absl::StrFormat("head holds budget + interval = %d tokens", c.budget + c.interval)};
          },
          [](const H2OConfig& c) {
            return PolicyTraits{
                "post-RoPE, every observed query (prefill and decode), accumulated",
                "sum of softmax probabilities over the group's query heads", "none",
                absl::StrFormat("head holds budget + interval = %d tokens", c.budget + c.interval)};
          },
          [](const TovaConfig& c) {
            return PolicyTraits{
                "post-RoPE, last query only", GqaReductionName(GqaReduction::kMeanProbs), "none",
                absl::StrFormat("head holds budget + interval = %d tokens", c.budget + c.interval)};
          },
          [](const SnapKvConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE, last %d queries; mean over queries", c.window),
                GqaReductionName(GqaReduction::kMaxLogits),
                absl::StrFormat("%s kernel %d", PoolingName(c.pooling), c.pool_kernel),
                absl::StrFormat("head holds budget + interval = %d tokens", c.budget + c.interval)};
          },
          [](const RkvConfig& c) {
            return PolicyTraits{
                absl::StrFormat("post-RoPE, last %d queries; mean over queries", c.window),
                GqaReductionName(GqaReduction::kMaxLogits),
                absl::StrFormat("maxpool kernel %d (importance only)", c.pool_kernel),
                absl::StrFormat("head holds budget + interval = %d tokens", c.budget + c.interval)};
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
                                "(pre-RoPE buffer, rotated to the current position); max; "
                                "the first %d layer(s) keep an evenly spaced sample first",
                                c.n_recent, c.n_beacons, c.coverage_layers),
                GqaReductionName(GqaReduction::kMaxProbs),
                c.pool_kernel > 1 ? absl::StrFormat("maxpool kernel %d", c.pool_kernel)
                                  : std::string("none"),
                c.budget_mode == BudgetMode::kUniform
                    ? absl::StrFormat("head holds budget + interval = %d tokens",
                                      c.budget + c.interval)
                    : absl::StrFormat("layer holds (budget + interval) * num_kv_heads = %d "
                                      "* num_kv_heads tokens",
                                      c.budget + c.interval)};
          },
      },
      config);
}

}  // namespace beaconkv

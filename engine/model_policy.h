// The policy a model directory recommends: config.json's "beaconkv_policy", a policy spec
// (NAME[-pooled][:KNOB=VALUE,...], no budget) chosen for that model on its tuning splits. The
// policy name "model" stands for it (kModelPolicyName, core/policy_config.h).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "core/policy_config.h"

namespace beaconkv {

// `model_dir`/config.json's "beaconkv_policy"; "" when the model names none (absent or null).
// kNotFound when config.json cannot be read; kInvalidArgument naming the file and field when
// it is not JSON, the field is not a string, or the spec does not build (an unknown policy or
// knob, a bad value, a budget or rpc period, or "model" itself).
absl::StatusOr<std::string> ModelPolicySpec(const std::string& model_dir);
// The same on the text of a config.json; `file_name_for_errors` prefixes every error.
absl::StatusOr<std::string> ModelPolicySpecFromJson(const std::string& text,
                                                    const std::string& file_name_for_errors);

// BuildPolicyConfig, with the model's spec read from `model_dir` when `request.spec` names
// "model" (a model that names none: kInvalidArgument naming its config.json).
absl::StatusOr<PolicyConfig> BuildModelPolicyConfig(const PolicyRequest& request,
                                                    const std::string& model_dir);

}  // namespace beaconkv

#include "engine/model_policy.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "engine/json_file.h"
#include "nlohmann/json.hpp"

namespace beaconkv {
namespace {

constexpr char kField[] = "beaconkv_policy";

std::string ConfigPath(const std::string& model_dir) { return model_dir + "/config.json"; }

}  // namespace

absl::StatusOr<std::string> ModelPolicySpec(const std::string& model_dir) {
  if (model_dir.empty()) {
    return absl::InvalidArgumentError("model directory: the path is empty");
  }
  const std::string path = ConfigPath(model_dir);
  BKV_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "model config"));
  return ModelPolicySpecFromJson(text, path);
}

absl::StatusOr<std::string> ModelPolicySpecFromJson(const std::string& text,
                                                    const std::string& path) {
  BKV_ASSIGN_OR_RETURN(nlohmann::json obj, ParseJsonObject(text, path));
  auto it = obj.find(kField);
  if (it == obj.end() || it->is_null()) return std::string();
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s' %s", path, kField, why));
  };
  if (!it->is_string()) {
    return fail(
        absl::StrFormat("must be a policy spec string, got %s %s", it->type_name(), it->dump()));
  }
  std::string spec = it->get<std::string>();
  if (spec.empty()) return fail("is empty (leave it out when the model names no policy)");
  PolicyRequest check;
  check.spec = std::string(kModelPolicyName);
  if (absl::Status built = BuildPolicyConfig(check, spec).status(); !built.ok()) {
    return fail(absl::StrCat("does not build: ", built.message()));
  }
  return spec;
}

absl::StatusOr<PolicyConfig> BuildModelPolicyConfig(const PolicyRequest& request,
                                                    const std::string& model_dir) {
  BKV_ASSIGN_OR_RETURN(bool names_model, NamesModelPolicy(request.spec));
  if (!names_model) return BuildPolicyConfig(request);
  BKV_ASSIGN_OR_RETURN(std::string model_spec, ModelPolicySpec(model_dir));
  if (model_spec.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "policy '%s': %s names no policy of the model (no field '%s'); name a policy instead",
        kModelPolicyName, ConfigPath(model_dir), kField));
  }
  return BuildPolicyConfig(request, model_spec);
}

}  // namespace beaconkv

#include "engine/model_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "engine/json_file.h"
#include "nlohmann/json.hpp"

namespace beaconkv {
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& file, const std::string& field,
                        const std::string& message) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: field '%s' %s", file, field, message));
}

// A present, non-null value of `key`, or nullptr. HF writes null for "not set".
const json* Find(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

// Reads an integer field into `out`; `out` keeps its value when the field is optional and absent.
absl::Status GetInt(const json& obj, const char* key, bool required, const std::string& file,
                    int32_t* out) {
  const json* v = Find(obj, key);
  if (v == nullptr) {
    if (required) return FieldError(file, key, "is missing (an integer is required)");
    return absl::OkStatus();
  }
  if (!v->is_number_integer()) {
    return FieldError(file, key,
                      absl::StrFormat("must be an integer, got %s %s", v->type_name(), v->dump()));
  }
  const bool fits = v->is_number_unsigned()
                        ? v->get<uint64_t>() <= std::numeric_limits<int32_t>::max()
                        : v->get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                              v->get<int64_t>() <= std::numeric_limits<int32_t>::max();
  if (!fits) return FieldError(file, key, absl::StrFormat("%s does not fit in int32", v->dump()));
  *out = static_cast<int32_t>(v->get<int64_t>());
  return absl::OkStatus();
}

absl::Status GetFloat(const json& obj, const char* key, const std::string& file, float* out) {
  const json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) {
    return FieldError(file, key,
                      absl::StrFormat("must be a number, got %s %s", v->type_name(), v->dump()));
  }
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > std::numeric_limits<float>::max()) {
    return FieldError(file, key, absl::StrFormat("%s is outside the float32 range", v->dump()));
  }
  *out = static_cast<float>(d);
  return absl::OkStatus();
}

absl::Status GetBool(const json& obj, const char* key, const std::string& file, bool* out) {
  const json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) {
    return FieldError(
        file, key, absl::StrFormat("must be true or false, got %s %s", v->type_name(), v->dump()));
  }
  *out = v->get<bool>();
  return absl::OkStatus();
}

// Rejects configuration keys that change the computation in ways the engine does not implement.
absl::Status RejectUnsupported(const json& obj, const std::string& file) {
  if (const json* v = Find(obj, "rope_scaling"); v != nullptr) {
    return FieldError(file, "rope_scaling",
                      absl::StrFormat("is %s, but RoPE scaling is not supported (only null or "
                                      "absent)",
                                      v->dump()));
  }
  if (const json* v = Find(obj, "hidden_act"); v != nullptr && *v != "silu") {
    return FieldError(file, "hidden_act",
                      absl::StrFormat("is %s, but only \"silu\" (SwiGLU) is supported", v->dump()));
  }
  bool flag = false;
  BKV_RETURN_IF_ERROR(GetBool(obj, "mlp_bias", file, &flag));
  if (flag) return FieldError(file, "mlp_bias", "is true, but MLP biases are not supported");
  BKV_RETURN_IF_ERROR(GetBool(obj, "use_sliding_window", file, &flag));
  if (flag) {
    return FieldError(file, "use_sliding_window",
                      "is true, but sliding-window attention is not supported");
  }
  float partial_rotary = 1.0f;
  BKV_RETURN_IF_ERROR(GetFloat(obj, "partial_rotary_factor", file, &partial_rotary));
  if (partial_rotary != 1.0f) {
    return FieldError(file, "partial_rotary_factor",
                      absl::StrFormat("is %g, but only full rotary embeddings (1.0) are supported",
                                      partial_rotary));
  }
  return absl::OkStatus();
}

absl::Status Positive(const char* name, int64_t value) {
  if (value >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat("%s must be >= 1, got %d", name, value));
}

}  // namespace

bool IsSupportedArchitecture(const std::string& architecture) {
  return architecture == "LlamaForCausalLM" || architecture == "Qwen2ForCausalLM" ||
         architecture == "Qwen3ForCausalLM";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& text,
                                                  const std::string& file_name_for_errors) {
  const std::string& file = file_name_for_errors;
  BKV_ASSIGN_OR_RETURN(json parsed, ParseJsonObject(text, file));
  const json& obj = parsed;
  BKV_RETURN_IF_ERROR(RejectUnsupported(obj, file));

  ModelConfig c;
  struct IntField {
    const char* key;
    bool required;
    int32_t* out;
  };
  const IntField int_fields[] = {
      {"vocab_size", true, &c.vocab_size},
      {"hidden_size", true, &c.hidden_size},
      {"intermediate_size", true, &c.intermediate_size},
      {"num_hidden_layers", true, &c.num_layers},
      {"num_attention_heads", true, &c.num_heads},
      {"num_key_value_heads", false, &c.num_kv_heads},
      {"head_dim", false, &c.head_dim},
      {"max_position_embeddings", true, &c.max_position_embeddings},
  };
  for (const IntField& f : int_fields) {
    BKV_RETURN_IF_ERROR(GetInt(obj, f.key, f.required, file, f.out));
  }
  BKV_RETURN_IF_ERROR(GetFloat(obj, "rope_theta", file, &c.rope_theta));
  BKV_RETURN_IF_ERROR(GetFloat(obj, "rms_norm_eps", file, &c.rms_norm_eps));
  BKV_RETURN_IF_ERROR(GetBool(obj, "tie_word_embeddings", file, &c.tie_word_embeddings));

  if (const json* v = Find(obj, "architectures"); v != nullptr) {
    if (!v->is_array() || v->empty() || !(*v)[0].is_string()) {
      return FieldError(file, "architectures",
                        absl::StrFormat("must be a non-empty list of strings, got %s", v->dump()));
    }
    c.architecture = (*v)[0].get<std::string>();
    if (!IsSupportedArchitecture(c.architecture)) {
      return FieldError(file, "architectures",
                        absl::StrFormat("names \"%s\"; supported: LlamaForCausalLM, "
                                        "Qwen2ForCausalLM, Qwen3ForCausalLM",
                                        c.architecture));
    }
  }

  if (Find(obj, "num_key_value_heads") == nullptr) c.num_kv_heads = c.num_heads;
  if (Find(obj, "head_dim") == nullptr) {
    if (c.num_heads < 1 || c.hidden_size % c.num_heads != 0) {
      return FieldError(
          file, "head_dim",
          absl::StrFormat("is absent and hidden_size (%d) is not a positive multiple of "
                          "num_attention_heads (%d), so it cannot be derived",
                          c.hidden_size, c.num_heads));
    }
    c.head_dim = c.hidden_size / c.num_heads;
  }
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", file, s.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  BKV_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path, "model config"));
  return FromJson(text, path);
}

absl::Status ModelConfig::Validate() const {
  const struct {
    const char* name;
    int32_t value;
  } sizes[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_layers (num_hidden_layers)", num_layers},
      {"num_heads (num_attention_heads)", num_heads},
      {"num_kv_heads (num_key_value_heads)", num_kv_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& f : sizes) {
    BKV_RETURN_IF_ERROR(Positive(f.name, f.value));
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("num_heads (num_attention_heads = %d) must be a multiple of num_kv_heads "
                        "(num_key_value_heads = %d)",
                        num_heads, num_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head_dim must be even for rotary embeddings, got %d", head_dim));
  }
  if (static_cast<int64_t>(num_heads) * head_dim > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "num_heads * head_dim (%d * %d) does not fit in int32", num_heads, head_dim));
  }
  if (!std::isfinite(rope_theta) || rope_theta <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rope_theta must be positive and finite, got %g", rope_theta));
  }
  if (!std::isfinite(rms_norm_eps) || rms_norm_eps <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rms_norm_eps must be positive and finite, got %g", rms_norm_eps));
  }
  if (!architecture.empty() && !IsSupportedArchitecture(architecture)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("architecture \"%s\" is not supported", architecture));
  }
  return absl::OkStatus();
}

}  // namespace beaconkv

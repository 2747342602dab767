// The hyper-parameters of a Llama-architecture model (Llama, Mistral, Qwen2, Qwen3), read from
// an HF-style `config.json`.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace beaconkv {

struct ModelConfig {
  int32_t vocab_size = 0;         // rows of the embedding and of lm_head
  int32_t hidden_size = 0;        // width of the residual stream
  int32_t intermediate_size = 0;  // width of the SwiGLU MLP
  int32_t num_layers = 0;         // HF: num_hidden_layers
  int32_t num_heads = 0;          // HF: num_attention_heads (query heads)
  int32_t num_kv_heads = 0;       // HF: num_key_value_heads; defaults to num_heads
  int32_t head_dim = 0;           // HF: head_dim; defaults to hidden_size / num_heads
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-6f;
  int32_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;  // lm_head shares the embedding matrix
  std::string architecture;          // HF: architectures[0], e.g. "Qwen2ForCausalLM"

  int32_t q_dim() const { return num_heads * head_dim; }           // rows of q_proj
  int32_t kv_dim() const { return num_kv_heads * head_dim; }       // rows of k_proj and v_proj
  int32_t group_size() const { return num_heads / num_kv_heads; }  // query heads per kv head

  // Parses the text of a config.json. `file_name_for_errors` prefixes every error message.
  // Unknown keys are ignored; features the engine cannot run (rope_scaling, sliding windows,
  // activations other than SiLU, MLP biases) are rejected by name. The result is validated.
  static absl::StatusOr<ModelConfig> FromJson(const std::string& text,
                                              const std::string& file_name_for_errors);
  // Reads and parses `path` (a config.json file).
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);

  // Positive sizes, num_heads % num_kv_heads == 0, even head_dim, positive finite rope_theta
  // and rms_norm_eps, and products small enough for int32 arithmetic.
  absl::Status Validate() const;
};

// Architectures (HF `architectures[0]`) whose weights the engine knows how to run.
bool IsSupportedArchitecture(const std::string& architecture);

}  // namespace beaconkv

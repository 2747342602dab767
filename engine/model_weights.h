// The float32 weights of a Llama-architecture model (Llama, Qwen2 with q/k/v biases, Qwen3 with
// per-head q/k RMSNorm), loaded from an HF-style directory. All matrices are row-major in HF
// layout: [out_features, in_features].
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace beaconkv {

struct LayerWeights {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> q_proj;      // [num_heads * head_dim, hidden]
  std::vector<float> k_proj;      // [num_kv_heads * head_dim, hidden]
  std::vector<float> v_proj;      // [num_kv_heads * head_dim, hidden]
  std::vector<float> o_proj;      // [hidden, num_heads * head_dim]
  std::vector<float> q_bias;      // [num_heads * head_dim], or empty when absent (Llama)
  std::vector<float> k_bias;      // [num_kv_heads * head_dim], or empty
  std::vector<float> v_bias;      // [num_kv_heads * head_dim], or empty
  std::vector<float> q_norm;      // [head_dim], or empty; Qwen3 RMSNorm over each query head
  std::vector<float> k_norm;      // [head_dim], or empty; Qwen3 RMSNorm over each key head
  std::vector<float> post_norm;   // [hidden]; post_attention_layernorm, before the MLP
  std::vector<float> gate_proj;   // [intermediate, hidden]
  std::vector<float> up_proj;     // [intermediate, hidden]
  std::vector<float> down_proj;   // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> embed;          // [vocab, hidden]
  std::vector<LayerWeights> layers;  // [num_layers]
  std::vector<float> final_norm;     // [hidden]
  std::vector<float> lm_head;        // [vocab, hidden]; a copy of embed when tie_word_embeddings
};

struct WeightLoadOptions {
  // Load weights holding NaN or Inf with a warning on stderr instead of failing.
  bool allow_nonfinite = false;
};

// Loads <model_dir>/config.json and <model_dir>/model.safetensors. Tensor names follow HF:
// model.embed_tokens.weight, model.layers.N.self_attn.{q,k,v,o}_proj.weight,
// model.layers.N.self_attn.{q,k,v}_proj.bias (optional), model.layers.N.self_attn.{q,k}_norm.weight
// (optional), model.layers.N.mlp.{gate,up,down}_proj.weight,
// model.layers.N.{input_layernorm,post_attention_layernorm}.weight, model.norm.weight,
// lm_head.weight (optional when tie_word_embeddings). Every shape is checked against the config;
// a tensor the engine would not use (extra layers, o_proj or MLP biases) is an error rather than
// silently ignored. A NaN or Inf value is an error unless options.allow_nonfinite. Errors name
// the file and the field or tensor.
absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& model_dir,
                                              const WeightLoadOptions& options = {});

// The same, from an already parsed config and opened file (`config` must be valid).
absl::StatusOr<ModelWeights> LoadModelWeightsFrom(const ModelConfig& config,
                                                  const SafetensorsFile& file,
                                                  const WeightLoadOptions& options = {});

}  // namespace beaconkv

// A small random Llama-architecture model built in memory, for engine tests that need any
// model rather than a trained one (the reliability, concurrency and stress tests).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/model_weights.h"

namespace beaconkv::test_model {

inline ModelWeights RandomModel(uint32_t seed, int32_t max_position_embeddings = 512) {
  ModelWeights w;
  ModelConfig& c = w.config;
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.max_position_embeddings = max_position_embeddings;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.5f);
  auto fill = [&](std::vector<float>& v, size_t size) {
    v.resize(size);
    for (float& x : v) x = n(rng);
  };
  auto ones = [](std::vector<float>& v, size_t size) { v.assign(size, 1.0f); };
  fill(w.embed, c.vocab_size * c.hidden_size);
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    ones(l.input_norm, c.hidden_size);
    ones(l.post_norm, c.hidden_size);
    fill(l.q_proj, c.num_heads * c.head_dim * c.hidden_size);
    fill(l.k_proj, c.num_kv_heads * c.head_dim * c.hidden_size);
    fill(l.v_proj, c.num_kv_heads * c.head_dim * c.hidden_size);
    fill(l.o_proj, c.hidden_size * c.num_heads * c.head_dim);
    fill(l.gate_proj, c.intermediate_size * c.hidden_size);
    fill(l.up_proj, c.intermediate_size * c.hidden_size);
    fill(l.down_proj, c.hidden_size * c.intermediate_size);
  }
  ones(w.final_norm, c.hidden_size);
  fill(w.lm_head, c.vocab_size * c.hidden_size);
  return w;
}

}  // namespace beaconkv::test_model

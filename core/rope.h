// Rotary position embedding (RoPE) in the HF Llama / Qwen "rotate-half" layout: dimension i
// and i + head_dim/2 form one rotation pair with frequency rope_theta^(-2i/head_dim).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace beaconkv {

struct RopeConfig {
  int32_t head_dim = 128;   // must be even
  double rope_theta = 1e6;  // Qwen2/3 use 1e6; Llama-2 10000, Llama-3 500000

  absl::Status Validate() const;
};

// Precomputed inverse frequencies for one RopeConfig.
class Rope {
 public:
  static absl::StatusOr<Rope> Create(const RopeConfig& config);

  int32_t head_dim() const { return config_.head_dim; }
  const RopeConfig& config() const { return config_; }

  // dst = RoPE(src, position); src and dst are [head_dim] and may alias. Angles are formed
  // as float(position) * float(inv_freq) in float32, as HF does, then cos/sin in double.
  void Rotate(const float* src, int64_t position, float* dst) const;
  // Rotates `num_vectors` contiguous vectors ([num_vectors, head_dim]) to one position
  // (one cos/sin table for all of them).
  void RotateMany(const float* src, int64_t num_vectors, int64_t position, float* dst) const;
  // cos and sin of every pair's angle at `position`: cs, sn are [head_dim / 2].
  void Angles(int64_t position, float* cs, float* sn) const;
  // Each pair's angle per token (radians), pair i = dims (i, i + head_dim / 2): falling with i.
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  explicit Rope(const RopeConfig& config);

  RopeConfig config_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

}  // namespace beaconkv

// Token sampling: greedy (ties -> lowest id) or temperature + top-p with a per-request seed,
// so a request samples the same tokens whatever it is batched with.
#pragma once

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace beaconkv {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  uint64_t seed = 0;
  int32_t max_new_tokens = 256;
  bool ignore_eos = false;

  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t Sample(absl::Span<const float> logits);  // [vocab]

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

int32_t Argmax(absl::Span<const float> logits);

}  // namespace beaconkv

#include "core/rope.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace beaconkv {

absl::Status RopeConfig::Validate() const {
  if (head_dim < 2 || head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("RoPE head_dim must be even and >= 2, got %d", head_dim));
  }
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rope_theta must be finite and > 1, got %g", rope_theta));
  }
  return absl::OkStatus();
}

absl::StatusOr<Rope> Rope::Create(const RopeConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return Rope(config);
}

Rope::Rope(const RopeConfig& config) : config_(config), inv_freq_(config.head_dim / 2) {
  const int32_t half = config.head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), stored as float32.
    inv_freq_[i] = static_cast<float>(
        1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / config.head_dim));
  }
}

void Rope::Rotate(const float* src, int64_t position, float* dst) const {
  const int32_t half = config_.head_dim / 2;
  const float pos = static_cast<float>(position);
  for (int32_t i = 0; i < half; ++i) {
    const float angle = pos * inv_freq_[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(angle)));
    const float s = static_cast<float>(std::sin(static_cast<double>(angle)));
    const float x1 = src[i];
    const float x2 = src[i + half];
    dst[i] = x1 * c - x2 * s;
    dst[i + half] = x2 * c + x1 * s;
  }
}

void Rope::RotateMany(const float* src, int64_t num_vectors, int64_t position, float* dst) const {
  for (int64_t v = 0; v < num_vectors; ++v) {
    Rotate(src + v * config_.head_dim, position, dst + v * config_.head_dim);
  }
}

}  // namespace beaconkv

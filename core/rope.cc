#include "core/rope.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/status_macros.h"

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
  BKV_RETURN_IF_ERROR(config.Validate());
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

namespace {

// Rotates each pair (x_i, x_{i+half}) by the angle whose cos / sin are cs[i] / sn[i].
void RotatePairs(const float* cs, const float* sn, int32_t half, const float* src, float* dst) {
  for (int32_t i = 0; i < half; ++i) {
    const float x1 = src[i];
    const float x2 = src[i + half];
    dst[i] = x1 * cs[i] - x2 * sn[i];
    dst[i + half] = x2 * cs[i] + x1 * sn[i];
  }
}

}  // namespace

void Rope::Angles(int64_t position, float* cs, float* sn) const {
  const float pos = static_cast<float>(position);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double angle = static_cast<double>(pos * inv_freq_[i]);
    cs[i] = static_cast<float>(std::cos(angle));
    sn[i] = static_cast<float>(std::sin(angle));
  }
}

void Rope::Rotate(const float* src, int64_t position, float* dst) const {
  RotateMany(src, 1, position, dst);
}

void Rope::RotateMany(const float* src, int64_t num_vectors, int64_t position, float* dst) const {
  // The angles depend on the position only: one cos/sin table for every vector.
  const int32_t half = config_.head_dim / 2;
  thread_local std::vector<float> table;
  table.resize(2 * static_cast<size_t>(half));
  Angles(position, table.data(), table.data() + half);
  for (int64_t v = 0; v < num_vectors; ++v) {
    RotatePairs(table.data(), table.data() + half, half, src + v * config_.head_dim,
                dst + v * config_.head_dim);
  }
}

}  // namespace beaconkv

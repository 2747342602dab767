#include "core/rope.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
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

#if defined(__x86_64__)
bool HasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

// RotatePairs on `n` vectors of 2 * half floats (half % 16 == 0), 16 pairs per step: the same
// multiplies, subtraction and addition per element as RotatePairs, so the same bits. (The
// explicitly rounded forms: GCC contracts plain vector multiplies and adds into FMAs, which
// round once where RotatePairs rounds twice.) dst == src (in place) is allowed: each step
// reads its two halves before writing them.
__attribute__((target("avx512f"))) void RotateRowsAvx512(const float* cs, const float* sn,
                                                         int32_t half, int64_t n, const float* src,
                                                         float* dst) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t v = 0; v < n; ++v) {
    const float* s = src + v * 2 * half;
    float* d = dst + v * 2 * half;
    for (int32_t i = 0; i < half; i += 16) {
      const __m512 c = _mm512_loadu_ps(cs + i), t = _mm512_loadu_ps(sn + i);
      const __m512 x1 = _mm512_loadu_ps(s + i), x2 = _mm512_loadu_ps(s + i + half);
      const __m512 x1c = _mm512_mul_round_ps(x1, c, kNearest);
      const __m512 x2t = _mm512_mul_round_ps(x2, t, kNearest);
      const __m512 x2c = _mm512_mul_round_ps(x2, c, kNearest);
      const __m512 x1t = _mm512_mul_round_ps(x1, t, kNearest);
      _mm512_storeu_ps(d + i, _mm512_sub_round_ps(x1c, x2t, kNearest));
      _mm512_storeu_ps(d + i + half, _mm512_add_round_ps(x2c, x1t, kNearest));
    }
  }
}
#endif

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
#if defined(__x86_64__)
  static const bool avx512 = HasAvx512();
  if (avx512 && half % 16 == 0) {
    RotateRowsAvx512(table.data(), table.data() + half, half, num_vectors, src, dst);
    return;
  }
#endif
  for (int64_t v = 0; v < num_vectors; ++v) {
    RotatePairs(table.data(), table.data() + half, half, src + v * config_.head_dim,
                dst + v * config_.head_dim);
  }
}

}  // namespace beaconkv

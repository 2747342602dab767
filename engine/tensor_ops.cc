#include "engine/tensor_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/multiversion.h"

namespace beaconkv {

namespace {

[[gnu::always_inline]] inline float DotInline(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

BKV_MULTIVERSION float Dot(const float* a, const float* b, int64_t n) { return DotInline(a, b, n); }

BKV_MULTIVERSION void Linear(const float* x, const float* w, const float* bias, int64_t rows,
                             int64_t in, int64_t out, float* y, int num_threads) {
  // Parallel over output features; each (row, feature) is one Dot in a fixed order.
  // Below ~1M multiply-adds a parallel region costs more than it saves.
  const bool parallel = num_threads > 1 && rows * in * out >= (1 << 20);
#pragma omp parallel for num_threads(num_threads) if (parallel) schedule(static)
  for (int64_t n = 0; n < out; ++n) {
    const float* wn = w + n * in;
    const float b = bias != nullptr ? bias[n] : 0.0f;
    for (int64_t m = 0; m < rows; ++m) y[m * out + n] = DotInline(x + m * in, wn, in) + b;
  }
}

void LinearGemm(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
                int64_t out, float* y, int num_threads) {
  // Output features split into one contiguous slice per thread, 16-aligned for the kernel.
  const bool parallel = num_threads > 1 && rows * in * out >= (1 << 20);
  const int64_t parts = parallel ? num_threads : 1;
  const int64_t chunk = ((out + parts - 1) / parts + 15) / 16 * 16;
#pragma omp parallel for num_threads(num_threads) if (parallel) schedule(static)
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t n0 = p * chunk, n = std::min(out, n0 + chunk) - n0;
    if (n <= 0) continue;
    if (bias != nullptr) {
      for (int64_t m = 0; m < rows; ++m) std::copy_n(bias + n0, n, y + m * out + n0);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(rows),
                static_cast<blasint>(n), static_cast<blasint>(in), 1.0f, x,
                static_cast<blasint>(in), w + n0 * in, static_cast<blasint>(in),
                bias != nullptr ? 1.0f : 0.0f, y + n0, static_cast<blasint>(out));
  }
}

void SetBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

BKV_MULTIVERSION void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim,
                              float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    const float ms = DotInline(xr, xr, dim) / static_cast<float>(dim);
    const float scale = 1.0f / std::sqrt(ms + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * scale);
  }
}

void SiluMul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void SoftmaxInPlace(float* x, int64_t n) {
  if (n <= 0) return;
  const float mx = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace beaconkv

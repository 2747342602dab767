#include "core/beacon_bank.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/check.h"

namespace beaconkv {
namespace {

// Points per block. The FPS passes read the unit vectors block by block, each block stored as
// [dim][kBlock] floats (64 points x 32 dims = 8 KB, contiguous): a pass streams memory in
// order and a block's cosines are `dim` FMAs per lane, no horizontal sums.
constexpr int32_t kBlock = 64;

int32_t Padded(int32_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// One pass over every point: min_dist = min(min_dist, 1 - cos(point, v)), cos = the FMA chain
// over d of unit[d] * v[d] (d = 0, 1, ...); returns the largest min_dist and sets *far_block to
// the start of the first block holding it. min_dist is padded to whole blocks; padding and
// chosen points hold -1, below every distance, so they never win the max. Every ISA path
// computes the same chain per point, so the result does not depend on the machine.
using UpdateFn = float (*)(const float* blocked, int32_t n, int32_t dim, const float* v,
                           float* min_dist, int32_t* far_block);

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float UpdateAvx512(const float* blocked, int32_t n, int32_t dim,
                                                      const float* v, float* min_dist,
                                                      int32_t* far_block) {
  const __m512 one = _mm512_set1_ps(1.0f);
  float far = -1.0f;
  *far_block = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* block = blocked + static_cast<size_t>(i0) * dim;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps()};
    for (int32_t d = 0; d < dim; ++d) {
      const __m512 vd = _mm512_set1_ps(v[d]);
      const float* col = block + static_cast<size_t>(d) * kBlock;
      for (int32_t q = 0; q < 4; ++q) {
        acc[q] = _mm512_fmadd_ps(_mm512_loadu_ps(col + 16 * q), vd, acc[q]);
      }
    }
    __m512 block_far = _mm512_set1_ps(-1.0f);
    for (int32_t q = 0; q < 4; ++q) {
      float* md = min_dist + i0 + 16 * q;
      const __m512 m = _mm512_min_ps(_mm512_loadu_ps(md), _mm512_sub_ps(one, acc[q]));
      _mm512_storeu_ps(md, m);
      block_far = _mm512_max_ps(block_far, m);
    }
    float lanes[16];  // (_mm512_reduce_max_ps trips GCC 12's -Wuninitialized)
    _mm512_storeu_ps(lanes, block_far);
    const float m = *std::max_element(lanes, lanes + 16);
    if (m > far) {
      far = m;
      *far_block = i0;
    }
  }
  return far;
}

__attribute__((target("avx2,fma"))) float UpdateAvx2(const float* blocked, int32_t n, int32_t dim,
                                                     const float* v, float* min_dist,
                                                     int32_t* far_block) {
  const __m256 one = _mm256_set1_ps(1.0f);
  float far = -1.0f;
  *far_block = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* block = blocked + static_cast<size_t>(i0) * dim;
    __m256 block_far = _mm256_set1_ps(-1.0f);
    for (int32_t half = 0; half < 2; ++half) {  // 32 points at a time: 4 accumulators of 8
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      for (int32_t d = 0; d < dim; ++d) {
        const __m256 vd = _mm256_set1_ps(v[d]);
        const float* col = block + static_cast<size_t>(d) * kBlock + 32 * half;
        for (int32_t q = 0; q < 4; ++q) {
          acc[q] = _mm256_fmadd_ps(_mm256_loadu_ps(col + 8 * q), vd, acc[q]);
        }
      }
      for (int32_t q = 0; q < 4; ++q) {
        float* md = min_dist + i0 + 32 * half + 8 * q;
        const __m256 m = _mm256_min_ps(_mm256_loadu_ps(md), _mm256_sub_ps(one, acc[q]));
        _mm256_storeu_ps(md, m);
        block_far = _mm256_max_ps(block_far, m);
      }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, block_far);
    const float m = *std::max_element(lanes, lanes + 8);
    if (m > far) {
      far = m;
      *far_block = i0;
    }
  }
  return far;
}
#endif

float UpdatePortable(const float* blocked, int32_t n, int32_t dim, const float* v, float* min_dist,
                     int32_t* far_block) {
  float far = -1.0f;
  *far_block = 0;
  for (int32_t i = 0; i < Padded(n); ++i) {
    const float* col = blocked + static_cast<size_t>(i / kBlock) * dim * kBlock + i % kBlock;
    float acc = 0.0f;
    for (int32_t d = 0; d < dim; ++d)
      acc = std::fma(col[static_cast<size_t>(d) * kBlock], v[d], acc);
    min_dist[i] = std::min(min_dist[i], 1.0f - acc);
    if (min_dist[i] > far) {
      far = min_dist[i];
      *far_block = i / kBlock * kBlock;
    }
  }
  return far;
}

bool Supported(internal::FpsKernel kernel) {
  switch (kernel) {
    case internal::FpsKernel::kPortable:
      return true;
#if defined(__x86_64__)
    case internal::FpsKernel::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case internal::FpsKernel::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

UpdateFn Kernel(internal::FpsKernel kernel) {
  switch (kernel) {
#if defined(__x86_64__)
    case internal::FpsKernel::kAvx512:
      return UpdateAvx512;
    case internal::FpsKernel::kAvx2:
      return UpdateAvx2;
#endif
    default:
      return UpdatePortable;
  }
}

// The fastest kernel this machine runs (all give the same result).
UpdateFn PickUpdate() {
  for (internal::FpsKernel k : {internal::FpsKernel::kAvx512, internal::FpsKernel::kAvx2}) {
    if (Supported(k)) return Kernel(k);
  }
  return UpdatePortable;
}

// Unit-normalised `points` ([n, dim]; zero rows stay zero) in the blocked layout:
// element (i, d) at (i / kBlock) * dim * kBlock + d * kBlock + i % kBlock; padding is zero.
void PackUnit(const float* points, int32_t n, int32_t dim, std::vector<float>* blocked) {
  blocked->assign(static_cast<size_t>(Padded(n)) * dim, 0.0f);
  for (int32_t i = 0; i < n; ++i) {
    const float* p = points + static_cast<size_t>(i) * dim;
    // Four independent partial sums of the squared norm (one serial chain is 4x slower).
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int32_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      s0 += static_cast<double>(p[d]) * p[d];
      s1 += static_cast<double>(p[d + 1]) * p[d + 1];
      s2 += static_cast<double>(p[d + 2]) * p[d + 2];
      s3 += static_cast<double>(p[d + 3]) * p[d + 3];
    }
    for (; d < dim; ++d) s0 += static_cast<double>(p[d]) * p[d];
    const double sq = (s0 + s1) + (s2 + s3);
    const float inv = sq > 0.0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
    float* out = blocked->data() + static_cast<size_t>(i / kBlock) * dim * kBlock + i % kBlock;
    for (d = 0; d < dim; ++d) out[static_cast<size_t>(d) * kBlock] = p[d] * inv;
  }
}

}  // namespace

namespace internal {

bool FpsKernelSupported(FpsKernel kernel) {
  return kernel == FpsKernel::kAuto || Supported(kernel);
}

std::vector<int32_t> FpsOrder(const float* points, int32_t n, int32_t dim, int32_t count,
                              FpsKernel kernel) {
  BKV_CHECK(count >= 0 && count <= n);
  std::vector<int32_t> order;
  if (count == 0) return order;
  order.reserve(count);
  static const UpdateFn best = PickUpdate();
  BKV_CHECK(FpsKernelSupported(kernel));
  const UpdateFn update = kernel == FpsKernel::kAuto ? best : Kernel(kernel);
  std::vector<float> blocked;
  PackUnit(points, n, dim, &blocked);
  const int32_t stride = Padded(n);
  auto unit = [&](int32_t i, int32_t d) {
    return blocked[static_cast<size_t>(i / kBlock) * dim * kBlock +
                   static_cast<size_t>(d) * kBlock + i % kBlock];
  };
  constexpr float kChosen = -1.0f;
  std::vector<float> min_dist(stride, kChosen);
  float* md = min_dist.data();
  std::vector<float> v(dim, 0.0f);
  // The first index at or after `block` holding `far` (ties go to the earliest point).
  auto first_at = [&](float far, int32_t block) {
    int32_t i = block;
    while (md[i] != far) ++i;
    return i;
  };

  // Seed: the point farthest from the direction of the mean of the unit vectors, found with
  // the same pass as a pick (min_dist starts at 2, so it becomes 1 - cos).
  std::vector<double> sum(dim, 0.0);
  for (int32_t b = 0; b < stride; b += kBlock) {  // padding is zero
    for (int32_t d = 0; d < dim; ++d) {
      const float* col =
          blocked.data() + static_cast<size_t>(b) * dim + static_cast<size_t>(d) * kBlock;
      double s = 0.0;
      for (int32_t l = 0; l < kBlock; ++l) s += col[l];
      sum[d] += s;
    }
  }
  double sq = 0.0;
  for (double s : sum) sq += s * s;
  if (sq > 0.0) {
    for (int32_t d = 0; d < dim; ++d) v[d] = static_cast<float>(sum[d] / std::sqrt(sq));
  }
  std::fill_n(md, n, 2.0f);
  int32_t block = 0;
  float far = update(blocked.data(), n, dim, v.data(), md, &block);
  int32_t pick = first_at(far, block);
  std::fill_n(md, n, 2.0f);

  // Each pick: one fused cosine + min + max pass, then the first index holding the max.
  for (;;) {
    order.push_back(pick);
    md[pick] = kChosen;
    if (static_cast<int32_t>(order.size()) == count) break;
    for (int32_t d = 0; d < dim; ++d) v[d] = unit(pick, d);
    far = update(blocked.data(), n, dim, v.data(), md, &block);
    pick = first_at(far, block);
  }
  return order;
}

}  // namespace internal

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  return internal::FpsOrder(points, n, dim, count, internal::FpsKernel::kAuto);
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max)
    : head_dim_(head_dim),
      buffer_min_(buffer_min),
      buffer_max_(buffer_max),
      buffer_(static_cast<size_t>(buffer_max) * head_dim) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
}

int64_t BeaconBank::CapacityBytes() const {
  return static_cast<int64_t>(buffer_max_) * head_dim_ * static_cast<int64_t>(sizeof(float));
}

void BeaconBank::Append(const float* query) {
  std::copy_n(query, head_dim_, buffer_.data() + static_cast<size_t>(size_) * head_dim_);
  ++size_;
  fps_ordered_ = false;
  if (size_ == buffer_max_) Reduce();
}

void BeaconBank::Reduce() {
  if (size_ <= buffer_min_) return;
  const std::vector<int32_t> keep =
      CosineFarthestPointOrder(buffer_.data(), size_, head_dim_, buffer_min_);
  // Survivors in FPS order, so the first n of them are the first n of the ordering.
  scratch_.resize(static_cast<size_t>(buffer_min_) * head_dim_);
  for (int32_t i = 0; i < buffer_min_; ++i) {
    std::copy_n(buffer_.data() + static_cast<size_t>(keep[i]) * head_dim_, head_dim_,
                scratch_.data() + static_cast<size_t>(i) * head_dim_);
  }
  std::copy(scratch_.begin(), scratch_.end(), buffer_.begin());
  size_ = buffer_min_;
  fps_ordered_ = true;
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) {
  // Reuse the draw: the FPS that picks the beacons also reduces the buffer, so the next
  // compression starts from these survivors instead of drawing again from the same points.
  Reduce();
  const int32_t n = std::min(n_beacons, size_);
  out->resize(static_cast<size_t>(n) * head_dim_);
  if (fps_ordered_ || n == size_) {
    // The first n rows (all of them, or an FPS prefix).
    std::copy_n(buffer_.data(), static_cast<size_t>(n) * head_dim_, out->data());
  } else {
    const std::vector<int32_t> order =
        CosineFarthestPointOrder(buffer_.data(), size_, head_dim_, n);
    for (int32_t b = 0; b < n; ++b) {
      std::copy_n(buffer_.data() + static_cast<size_t>(order[b]) * head_dim_, head_dim_,
                  out->data() + static_cast<size_t>(b) * head_dim_);
    }
  }
  rope.RotateMany(out->data(), n, position, out->data());
  return n;
}

}  // namespace beaconkv

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
// over d of unit[d] * v[d] (d = 0, 1, ...); returns the largest min_dist and writes each
// block's largest into block_far[block]. min_dist is padded to whole blocks; padding and
// chosen points hold -1, below every distance, so they never win the max. Every ISA path
// computes the same chain per point, so the result does not depend on the machine.
using UpdateFn = float (*)(const float* blocked, int32_t n, int32_t dim, const float* v,
                           float* min_dist, float* block_far);

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float UpdateAvx512(const float* blocked, int32_t n, int32_t dim,
                                                      const float* v, float* min_dist,
                                                      float* block_far) {
  const __m512 one = _mm512_set1_ps(1.0f);
  float far = -1.0f;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* block = blocked + static_cast<size_t>(i0) * dim;
    // Four named accumulators, not an array: GCC kept an array on the stack, so every FMA
    // went through a store and a reload (3x slower).
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    for (int32_t d = 0; d < dim; ++d) {
      const __m512 vd = _mm512_set1_ps(v[d]);
      const float* col = block + static_cast<size_t>(d) * kBlock;
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(col), vd, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(col + 16), vd, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(col + 32), vd, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(col + 48), vd, a3);
    }
    const __m512 acc[4] = {a0, a1, a2, a3};
    __m512 vmax = _mm512_set1_ps(-1.0f);
    for (int32_t q = 0; q < 4; ++q) {
      float* md = min_dist + i0 + 16 * q;
      const __m512 m = _mm512_min_ps(_mm512_loadu_ps(md), _mm512_sub_ps(one, acc[q]));
      _mm512_storeu_ps(md, m);
      vmax = _mm512_max_ps(vmax, m);
    }
    float lanes[16];  // (_mm512_reduce_max_ps trips GCC 12's -Wuninitialized)
    _mm512_storeu_ps(lanes, vmax);
    const float m = *std::max_element(lanes, lanes + 16);
    block_far[i0 / kBlock] = m;
    far = std::max(far, m);
  }
  return far;
}

__attribute__((target("avx2,fma"))) float UpdateAvx2(const float* blocked, int32_t n, int32_t dim,
                                                     const float* v, float* min_dist,
                                                     float* block_far) {
  const __m256 one = _mm256_set1_ps(1.0f);
  float far = -1.0f;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* block = blocked + static_cast<size_t>(i0) * dim;
    __m256 vmax = _mm256_set1_ps(-1.0f);
    for (int32_t half = 0; half < 2; ++half) {  // 32 points at a time: 4 accumulators of 8
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps();
      for (int32_t d = 0; d < dim; ++d) {
        const __m256 vd = _mm256_set1_ps(v[d]);
        const float* col = block + static_cast<size_t>(d) * kBlock + 32 * half;
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(col), vd, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 8), vd, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 16), vd, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 24), vd, a3);
      }
      const __m256 acc[4] = {a0, a1, a2, a3};
      for (int32_t q = 0; q < 4; ++q) {
        float* md = min_dist + i0 + 32 * half + 8 * q;
        const __m256 m = _mm256_min_ps(_mm256_loadu_ps(md), _mm256_sub_ps(one, acc[q]));
        _mm256_storeu_ps(md, m);
        vmax = _mm256_max_ps(vmax, m);
      }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    const float m = *std::max_element(lanes, lanes + 8);
    block_far[i0 / kBlock] = m;
    far = std::max(far, m);
  }
  return far;
}
#endif

float UpdatePortable(const float* blocked, int32_t n, int32_t dim, const float* v, float* min_dist,
                     float* block_far) {
  float far = -1.0f;
  for (int32_t i = 0; i < Padded(n); ++i) {
    const float* col = blocked + static_cast<size_t>(i / kBlock) * dim * kBlock + i % kBlock;
    float acc = 0.0f;
    for (int32_t d = 0; d < dim; ++d)
      acc = std::fma(col[static_cast<size_t>(d) * kBlock], v[d], acc);
    min_dist[i] = std::min(min_dist[i], 1.0f - acc);
    if (i % kBlock == 0) block_far[i / kBlock] = -1.0f;
    block_far[i / kBlock] = std::max(block_far[i / kBlock], min_dist[i]);
    far = std::max(far, min_dist[i]);
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
  auto at = [&](int32_t i, int32_t d) -> float& {
    return blocked[static_cast<size_t>(i / kBlock) * dim * kBlock +
                   static_cast<size_t>(d) * kBlock + i % kBlock];
  };
  constexpr float kChosen = -1.0f;
  std::vector<float> min_dist(stride, kChosen);
  float* md = min_dist.data();
  std::vector<float> v(dim, 0.0f);
  // The points still unchosen are the first `active` slots; a chosen point is swapped to the
  // end of that range (slot order is then no longer index order: `index` maps a slot to its
  // point), so each pass covers only the points that can still be picked and the work per draw
  // falls from count * n to about count * (n - count / 2) cosines.
  std::vector<int32_t> index(stride);
  for (int32_t i = 0; i < stride; ++i) index[i] = i;
  int32_t active = n;
  // The slot holding the pick: among the unchosen slots whose distance is `far` (only blocks
  // whose largest is `far` can hold one), the one of the earliest point (the tie rule).
  std::vector<float> block_far(stride / kBlock, kChosen);
  auto pick_at = [&](float far) {
    int32_t best = -1;
    for (int32_t b = 0; b * kBlock < active; ++b) {
      if (block_far[b] != far) continue;
      for (int32_t i = b * kBlock; i < std::min(active, (b + 1) * kBlock); ++i) {
        if (md[i] == far && (best < 0 || index[i] < index[best])) best = i;
      }
    }
    BKV_CHECK(best >= 0);
    return best;
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
  float far = update(blocked.data(), n, dim, v.data(), md, block_far.data());
  int32_t slot = pick_at(far);
  std::fill_n(md, n, 2.0f);

  // Each pick: take the slot out of the active range, then one fused cosine + min + max pass
  // over the rest and the slot of the earliest point holding the max.
  for (;;) {
    order.push_back(index[slot]);
    for (int32_t d = 0; d < dim; ++d) v[d] = at(slot, d);
    --active;
    if (slot != active) {
      for (int32_t d = 0; d < dim; ++d) std::swap(at(slot, d), at(active, d));
      std::swap(md[slot], md[active]);
      std::swap(index[slot], index[active]);
    }
    md[active] = kChosen;  // stays inside the last block's pass: -1 never wins the max
    if (static_cast<int32_t>(order.size()) == count) break;
    far = update(blocked.data(), active, dim, v.data(), md, block_far.data());
    slot = pick_at(far);
  }
  return order;
}

}  // namespace internal

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  return internal::FpsOrder(points, n, dim, count, internal::FpsKernel::kAuto);
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max, bool draw_on_fill)
    : head_dim_(head_dim),
      buffer_min_(buffer_min),
      buffer_max_(buffer_max),
      draw_on_fill_(draw_on_fill),
      buffer_(static_cast<size_t>(buffer_max) * head_dim) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
}

int64_t BeaconBank::CapacityBytes() const {
  return static_cast<int64_t>(buffer_max_) * head_dim_ * static_cast<int64_t>(sizeof(float));
}

void BeaconBank::Append(const float* query) {
  std::copy_n(query, head_dim_, buffer_.data() + static_cast<size_t>(size_) * head_dim_);
  ++size_;
  ++arrivals_;
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
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) {
  // Reuse the draw: the FPS that picks the beacons also reduces the buffer, so the next
  // compression starts from these survivors instead of drawing again from the same points.
  // With draw_on_fill a draw that still has n_beacons survivors is reused as it is, unless
  // as many arrivals as came since the last call would fill the buffer: then the buffer is
  // reduced here, in the compression, rather than in the middle of a later Append.
  const bool due = !draw_on_fill_ || ordered() < std::min(n_beacons, size_) ||
                   int64_t{size_} + arrivals_ >= buffer_max_;
  arrivals_ = 0;
  if (due) Reduce();
  const int32_t n = std::min(n_beacons, size_);
  out->resize(static_cast<size_t>(n) * head_dim_);
  if (ordered() >= n || n == size_) {
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

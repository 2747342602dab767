#include "core/beacon_bank.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "absl/types/span.h"
#include "core/check.h"

namespace beaconkv {
namespace {

// The FPS passes work on unit vectors rounded to integers: component u is stored as
// round(u * 2^14) in an int16, and a cosine is the exact integer dot product of two such
// vectors over 2^28. Integer dot products make the ordering the same on every machine and ISA,
// and int16 pairs go through one multiply-add instruction (vpmaddwd: 32 products per
// instruction); the buffer (512 x 32) is 32 KB and stays in L1. No overflow: by
// Cauchy-Schwarz every partial sum is at most |a| |b| <= 2^28 (+ rounding) in magnitude.
constexpr float kQuant = 16384.0f;
constexpr float kDotScale = 1.0f / (16384.0f * 16384.0f);  // exact: a power of two
// Points per block. A block stores [dim / 2][kBlock][2]: for each pair of dims, the two
// components of each of its 64 points side by side, so one 64-byte load holds 16 points x 2
// dims, the operand of one vpmaddwd. Dims are padded to even with a zero.
constexpr int32_t kBlock = 64;

int32_t PaddedDim(int32_t dim) { return (dim + 1) / 2 * 2; }

size_t Offset(int32_t i, int32_t d, int32_t dim_padded) {
  return static_cast<size_t>(i / kBlock) * dim_padded * kBlock +
         static_cast<size_t>(d / 2) * kBlock * 2 + static_cast<size_t>(i % kBlock) * 2 + d % 2;
}

// round(u * kQuant) of the unit vector of `p` ([dim]; zero stays zero) into `out[d]`; returns
// the norm of p.
float QuantiseUnit(const float* p, int32_t dim, int16_t* out) {
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
  const float scale = sq > 0.0 ? static_cast<float>(kQuant / std::sqrt(sq)) : 0.0f;
  for (d = 0; d < dim; ++d) {
    // |v| <= 2^14 up to rounding (int16 holds 2^15 - 1: no clamp needed); adding and
    // removing 1.5 * 2^23 rounds it to the nearest integer (ties to even) without a branch.
    const float v = p[d] * scale;
    constexpr float kRound = 12582912.0f;
    out[d] = static_cast<int16_t>(static_cast<int32_t>((v + kRound) - kRound));
  }
  return static_cast<float>(std::sqrt(sq));
}

// One pass over every point: min_dist = min(min_dist, 1 - dot(point, v) * 2^-28); returns the
// largest min_dist and sets *far_block to the start of the first block holding it. `pairs`
// holds v's dims two by two ((v[2k] & 0xffff) | v[2k+1] << 16), [dim_padded / 2]. min_dist is
// padded to whole blocks; padding and chosen points hold -1, below every distance, so they
// never win the max.
using UpdateFn = float (*)(const int16_t* blocked, int32_t n, int32_t dim_padded,
                           const int32_t* pairs, float* min_dist, int32_t* far_block);

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw"))) float UpdateAvx512(const int16_t* blocked, int32_t n,
                                                               int32_t dim_padded,
                                                               const int32_t* pairs,
                                                               float* min_dist,
                                                               int32_t* far_block) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 scale = _mm512_set1_ps(kDotScale);
  float far = -1.0f;
  *far_block = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const int16_t* block = blocked + static_cast<size_t>(i0) * dim_padded;
    __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    for (int32_t k = 0; k < dim_padded / 2; ++k) {
      const __m512i vk = _mm512_set1_epi32(pairs[k]);
      const int16_t* col = block + static_cast<size_t>(k) * kBlock * 2;
      for (int32_t q = 0; q < 4; ++q) {
        const __m512i x = _mm512_loadu_si512(col + 32 * q);
        acc[q] = _mm512_add_epi32(acc[q], _mm512_madd_epi16(x, vk));
      }
    }
    __m512 block_far = _mm512_set1_ps(-1.0f);
    for (int32_t q = 0; q < 4; ++q) {
      float* md = min_dist + i0 + 16 * q;
      const __m512 dist = _mm512_sub_ps(one, _mm512_mul_ps(_mm512_cvtepi32_ps(acc[q]), scale));
      const __m512 m = _mm512_min_ps(_mm512_loadu_ps(md), dist);
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

__attribute__((target("avx2"))) float UpdateAvx2(const int16_t* blocked, int32_t n,
                                                 int32_t dim_padded, const int32_t* pairs,
                                                 float* min_dist, int32_t* far_block) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 scale = _mm256_set1_ps(kDotScale);
  float far = -1.0f;
  *far_block = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const int16_t* block = blocked + static_cast<size_t>(i0) * dim_padded;
    __m256 block_far = _mm256_set1_ps(-1.0f);
    for (int32_t half = 0; half < 2; ++half) {  // 32 points at a time: 4 accumulators of 8
      __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                        _mm256_setzero_si256()};
      for (int32_t k = 0; k < dim_padded / 2; ++k) {
        const __m256i vk = _mm256_set1_epi32(pairs[k]);
        const int16_t* col = block + static_cast<size_t>(k) * kBlock * 2 + 64 * half;
        for (int32_t q = 0; q < 4; ++q) {
          const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(col + 16 * q));
          acc[q] = _mm256_add_epi32(acc[q], _mm256_madd_epi16(x, vk));
        }
      }
      for (int32_t q = 0; q < 4; ++q) {
        float* md = min_dist + i0 + 32 * half + 8 * q;
        const __m256 dist = _mm256_sub_ps(one, _mm256_mul_ps(_mm256_cvtepi32_ps(acc[q]), scale));
        const __m256 m = _mm256_min_ps(_mm256_loadu_ps(md), dist);
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

float UpdatePortable(const int16_t* blocked, int32_t n, int32_t dim_padded, const int32_t* pairs,
                     float* min_dist, int32_t* far_block) {
  float far = -1.0f;
  *far_block = 0;
  const int32_t stride = (n + kBlock - 1) / kBlock * kBlock;
  for (int32_t i = 0; i < stride; ++i) {
    int32_t acc = 0;
    for (int32_t d = 0; d < dim_padded; ++d) {
      const int32_t pair = pairs[d / 2];
      const int32_t v = d % 2 == 0 ? static_cast<int16_t>(pair & 0xffff) : (pair >> 16);
      acc += int32_t{blocked[Offset(i, d, dim_padded)]} * v;
    }
    const float dist = 1.0f - static_cast<float>(acc) * kDotScale;
    min_dist[i] = std::min(min_dist[i], dist);
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
      return __builtin_cpu_supports("avx2");
    case internal::FpsKernel::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
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

}  // namespace

namespace internal {

void PackedUnitVectors::Reset(int32_t dim, int32_t capacity) {
  dim_ = dim;
  size_ = 0;
  data_.assign(static_cast<size_t>((capacity + kBlock - 1) / kBlock) * kBlock * PaddedDim(dim), 0);
  norms_.assign(capacity, 0.0f);
}

int64_t PackedUnitVectors::CapacityBytes() const {
  return static_cast<int64_t>(data_.size() * sizeof(int16_t) + norms_.size() * sizeof(float));
}

void PackedUnitVectors::Unpack(int32_t i, float* out) const {
  const float scale = norms_[i] / kQuant;
  for (int32_t d = 0; d < dim_; ++d) out[d] = static_cast<float>(At(i, d)) * scale;
}

int16_t PackedUnitVectors::At(int32_t i, int32_t d) const {
  return data_[Offset(i, d, PaddedDim(dim_))];
}

void PackedUnitVectors::Set(int32_t i, const int16_t* row) {
  // Dims 2k and 2k+1 of row i are adjacent; pairs are kBlock * 2 apart.
  int16_t* out = data_.data() + Offset(i, 0, PaddedDim(dim_));
  for (int32_t d = 0; d < dim_; ++d) out[static_cast<size_t>(d / 2) * kBlock * 2 + d % 2] = row[d];
}

void PackedUnitVectors::Append(const float* point) {
  BKV_CHECK(static_cast<size_t>(size_ + 1) * PaddedDim(dim_) <= data_.size());
  int16_t row[kMaxDim];
  BKV_CHECK(dim_ <= kMaxDim);
  norms_[size_] = QuantiseUnit(point, dim_, row);
  Set(size_, row);
  ++size_;
}

void PackedUnitVectors::Keep(absl::Span<const int32_t> rows) {
  std::vector<int16_t> kept(static_cast<size_t>(rows.size()) * dim_);
  std::vector<float> kept_norms(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int32_t d = 0; d < dim_; ++d) kept[r * dim_ + d] = At(rows[r], d);
    kept_norms[r] = norms_[rows[r]];
  }
  std::copy(kept_norms.begin(), kept_norms.end(), norms_.begin());
  std::fill(data_.begin(), data_.end(), 0);  // rows past size() stay zero
  for (size_t r = 0; r < rows.size(); ++r) Set(static_cast<int32_t>(r), kept.data() + r * dim_);
  size_ = static_cast<int32_t>(rows.size());
}

bool FpsKernelSupported(FpsKernel kernel) {
  return kernel == FpsKernel::kAuto || Supported(kernel);
}

std::vector<int32_t> FpsOrder(const PackedUnitVectors& points, int32_t count, FpsKernel kernel) {
  const int32_t n = points.size(), dim = points.dim(), dp = PaddedDim(dim);
  BKV_CHECK(count >= 0 && count <= n);
  std::vector<int32_t> order;
  if (count == 0) return order;
  order.reserve(count);
  static const UpdateFn best = PickUpdate();
  BKV_CHECK(FpsKernelSupported(kernel));
  const UpdateFn update = kernel == FpsKernel::kAuto ? best : Kernel(kernel);
  const int16_t* blocked = points.data();
  constexpr float kChosen = -1.0f;
  const int32_t stride = (n + kBlock - 1) / kBlock * kBlock;
  std::vector<float> min_dist(stride, kChosen);
  float* md = min_dist.data();
  std::vector<int32_t> pairs(dp / 2, 0);

  // The first index at or after `block` holding `far` (ties go to the earliest point).
  auto first_at = [&](float far, int32_t block) {
    int32_t i = block;
    while (md[i] != far) ++i;
    return i;
  };

  // Seed: the point farthest from the mean direction of the stored unit vectors (itself
  // rounded like them), found with the same pass as a pick (min_dist starts at 2, so it
  // becomes 1 - cos).
  std::vector<int64_t> sum(dp, 0);
  for (int32_t b = 0; b < stride; b += kBlock) {  // rows past n are zero
    for (int32_t k = 0; k < dp / 2; ++k) {
      const int16_t* col = blocked + Offset(b, 2 * k, dp);
      int32_t lo = 0, hi = 0;  // |.| <= 64 * 2^14
      for (int32_t l = 0; l < kBlock; ++l) {
        lo += col[2 * l];
        hi += col[2 * l + 1];
      }
      sum[2 * k] += lo;
      sum[2 * k + 1] += hi;
    }
  }
  double sq = 0.0;
  for (int64_t x : sum) sq += static_cast<double>(x) * static_cast<double>(x);
  const double to_quant = sq > 0.0 ? kQuant / std::sqrt(sq) : 0.0;
  for (int32_t k = 0; k < dp / 2; ++k) {
    const auto lo = static_cast<int32_t>(std::lrint(static_cast<double>(sum[2 * k]) * to_quant));
    const auto hi =
        static_cast<int32_t>(std::lrint(static_cast<double>(sum[2 * k + 1]) * to_quant));
    pairs[k] = static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xffffu) |
                                    (static_cast<uint32_t>(hi) << 16));
  }
  std::fill_n(md, n, 2.0f);
  int32_t block = 0;
  float far = update(blocked, n, dp, pairs.data(), md, &block);
  int32_t pick = first_at(far, block);
  std::fill_n(md, n, 2.0f);

  // Each pick: one fused dot + min + max pass, then the first index holding the max.
  for (;;) {
    order.push_back(pick);
    md[pick] = kChosen;
    if (static_cast<int32_t>(order.size()) == count) break;
    // The pick's dims, two by two, are adjacent int16 in its block: one 32-bit load each.
    const int16_t* row = blocked + Offset(pick, 0, dp);
    for (int32_t k = 0; k < dp / 2; ++k) {
      std::memcpy(&pairs[k], row + static_cast<size_t>(k) * kBlock * 2, sizeof(int32_t));
    }
    far = update(blocked, n, dp, pairs.data(), md, &block);
    pick = first_at(far, block);
  }
  return order;
}

}  // namespace internal

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  internal::PackedUnitVectors packed;
  packed.Reset(dim, n);
  for (int32_t i = 0; i < n; ++i) packed.Append(points + static_cast<size_t>(i) * dim);
  return internal::FpsOrder(packed, count);
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max)
    : head_dim_(head_dim), buffer_min_(buffer_min), buffer_max_(buffer_max) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
  BKV_CHECK(head_dim <= internal::PackedUnitVectors::kMaxDim);
  packed_.Reset(head_dim, buffer_max);
}

int64_t BeaconBank::CapacityBytes() const { return packed_.CapacityBytes(); }

std::vector<float> BeaconBank::Queries() const {
  std::vector<float> out(static_cast<size_t>(size()) * head_dim_);
  for (int32_t i = 0; i < size(); ++i)
    packed_.Unpack(i, out.data() + static_cast<size_t>(i) * head_dim_);
  return out;
}

void BeaconBank::Append(const float* query) {
  packed_.Append(query);
  fps_ordered_ = false;
  if (packed_.size() == buffer_max_) Reduce();
}

void BeaconBank::Reduce() {
  if (packed_.size() <= buffer_min_) return;
  // Survivors in FPS order, so the first n of them are the first n of the ordering.
  packed_.Keep(internal::FpsOrder(packed_, buffer_min_));
  fps_ordered_ = true;
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) {
  // Reuse the draw: the FPS that picks the beacons also reduces the buffer, so the next
  // compression starts from these survivors instead of drawing again from the same points.
  Reduce();
  const int32_t n = std::min(n_beacons, size());
  out->resize(static_cast<size_t>(n) * head_dim_);
  std::vector<int32_t> rows;
  if (!fps_ordered_ && n < size()) rows = internal::FpsOrder(packed_, n);
  for (int32_t b = 0; b < n; ++b) {
    // The first n rows (all of them, or an FPS prefix), or the first n of a fresh ordering.
    packed_.Unpack(rows.empty() ? b : rows[b], out->data() + static_cast<size_t>(b) * head_dim_);
  }
  rope.RotateMany(out->data(), n, position, out->data());
  return n;
}

}  // namespace beaconkv

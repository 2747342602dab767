#include "core/beacon_bank.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/capped_growth.h"
#include "core/check.h"
#include "core/multiversion.h"
#include "core/scoring.h"
#include "core/transpose16.h"

namespace beaconkv {
namespace {

// The FPS measures cosines on quantised unit vectors. A unit vector u is stored as 16-bit
// integers q_d = round(u_d * 2^14) (to nearest, ties to even; |u_d| <= 1, so |q_d| <= 2^14),
// two dimensions per 32-bit word (dimension 2k in the low half, 2k + 1 in the high half, 0
// past an odd dim), and 2^28 cos(a, b) is taken to be the integer dot product q_a . q_b.
// Integer sums are exact in any order, so every ISA path (and the CUDA kernel) gets the same
// bits without fixing an order of operations, and the passes stream half the bytes of float
// vectors (a 512-point buffer of 32 dimensions, 32 KB, stays in L1). Rounding moves a cosine
// by about 1e-4 at most. No overflow: |q| <= 2^14 + sqrt(dim) / 2, so by Cauchy-Schwarz every
// partial sum of a dot product is below 2^29 for dim <= kMaxFpsDim.
constexpr float kQuantScale = 16384.0f;                         // 2^14
constexpr int32_t kUnitDot = kFpsDistanceOne;                   // q . q of a unit vector (2^28)
constexpr int32_t kNone = std::numeric_limits<int32_t>::min();  // chosen or padding slot
constexpr int32_t kFar = std::numeric_limits<int32_t>::max();   // before the first pick

// A non-finite component quantises to 0, as vcvtps2dq's 0x80000000 truncated to 16 bits does
// on the AVX-512 path. They arise from a row holding a NaN or an infinity (normalised to NaN)
// and from a row whose norm is below 1 / FLT_MAX (all components subnormal: 1 / norm
// overflows to +inf, so its components become +-inf, or NaN where 0): such a row is a zero
// vector to the FPS.
int32_t Quantise(float u) {
  return std::isfinite(u) ? static_cast<int32_t>(std::nearbyint(u * kQuantScale)) : 0;
}
int32_t PairWord(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(lo) & 0xFFFFu) |
                              (static_cast<uint32_t>(hi) << 16));
}
int32_t LowHalf(int32_t w) { return static_cast<int16_t>(static_cast<uint32_t>(w) & 0xFFFFu); }
int32_t HighHalf(int32_t w) { return static_cast<int16_t>(static_cast<uint32_t>(w) >> 16); }
int32_t Pairs(int32_t dim) { return (dim + 1) / 2; }

// Slots per block. The FPS passes read the quantised vectors block by block, each block
// stored as [pairs][kBlock] words (64 points x 16 words for 32 dims = 4 KB, contiguous): a
// pass streams memory in order and a block's dot products are `pairs` multiply-adds per lane,
// no horizontal sums.
constexpr int32_t kBlock = 64;

int32_t Padded(int32_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// Where word (slot, k) of the blocked layout sits: blocks of kBlock slots, each [pairs][kBlock].
size_t BlockedAt(int32_t slot, int32_t k, int32_t pairs) {
  return static_cast<size_t>(slot / kBlock) * pairs * kBlock + static_cast<size_t>(k) * kBlock +
         slot % kBlock;
}

// One pass over the first Padded(n) slots: min_dist = min(min_dist, 2^28 - q . v); returns
// the largest min_dist. min_dist is padded to whole blocks; padding and chosen slots hold
// kNone, below every distance, so they never win the max.
using UpdateFn = int32_t (*)(const int32_t* blocked, int32_t n, int32_t pairs, const int32_t* v,
                             int32_t* min_dist);
// For every block below Padded(n): bit l of eq[block] set when slot block * 64 + l holds
// `value` (the slots a pick chooses among, found without a scalar scan).
using EqualFn = void (*)(const int32_t* min_dist, int32_t n, int32_t value, uint64_t* eq);

using internal::CacheAligned;
using AlignedInts = std::vector<int32_t, CacheAligned<int32_t>>;

// Working memory of one FpsOrder call, kept per thread between calls: a draw allocates
// nothing once the thread has drawn as large a set before (fresh buffers of this size come
// from and go back to the OS on every call, and the page faults cost more than the packing).
struct FpsScratch {
  std::vector<int32_t> first, next_copy, slot_of, table, index, group, picked, v;
  std::vector<uint64_t> group_hash, eq;
  AlignedInts blocked, staged, min_dist;
  std::vector<float> unit;
  std::vector<double> sum, part;
};

// Unit-normalises and quantises `points` ([n, dim]) into s->blocked and sums the unit
// vectors into s->sum; see PackUnit.
using PackFn = void (*)(const float* points, int32_t n, int32_t dim, FpsScratch* s);

struct FpsKernels {
  UpdateFn update;
  EqualFn equal;
  PackFn pack;
};

#if defined(__x86_64__)
// min_dist[0, 16) = min(min_dist, 2^28 - dot); returns max(vmax, the new values).
__attribute__((target("avx512f"))) inline __m512i FinishLanesAvx512(__m512i dot, int32_t* min_dist,
                                                                    __m512i vmax) {
  const __m512i m = _mm512_min_epi32(_mm512_loadu_si512(min_dist),
                                     _mm512_sub_epi32(_mm512_set1_epi32(kUnitDot), dot));
  _mm512_storeu_si512(min_dist, m);
  return _mm512_max_epi32(vmax, m);
}

__attribute__((target("avx512f"))) int32_t MaxLanesAvx512(__m512i vmax) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, vmax);
  return *std::max_element(lanes, lanes + 16);
}

// Four accumulators of 16 slots per block; one vpdpwssd (AVX-512 VNNI) per 16 slots and word.
// (AVX-512 machines without VNNI take the AVX2 pass, whose vpmaddwd + vpaddd give the same
// sums.)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t UpdateAvx512(
    const int32_t* blocked, int32_t n, int32_t pairs, const int32_t* v, int32_t* min_dist) {
  __m512i vmax = _mm512_set1_epi32(kNone);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const int32_t* x = blocked + static_cast<size_t>(i0) * pairs;
    // Named accumulators, not an array (GCC kept an array on the stack).
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int32_t k = 0; k < pairs; ++k) {
      const __m512i vk = _mm512_set1_epi32(v[k]);
      const int32_t* cx = x + static_cast<size_t>(k) * kBlock;
      a0 = _mm512_dpwssd_epi32(a0, _mm512_loadu_si512(cx), vk);
      a1 = _mm512_dpwssd_epi32(a1, _mm512_loadu_si512(cx + 16), vk);
      a2 = _mm512_dpwssd_epi32(a2, _mm512_loadu_si512(cx + 32), vk);
      a3 = _mm512_dpwssd_epi32(a3, _mm512_loadu_si512(cx + 48), vk);
    }
    vmax = FinishLanesAvx512(a0, min_dist + i0, vmax);
    vmax = FinishLanesAvx512(a1, min_dist + i0 + 16, vmax);
    vmax = FinishLanesAvx512(a2, min_dist + i0 + 32, vmax);
    vmax = FinishLanesAvx512(a3, min_dist + i0 + 48, vmax);
  }
  return MaxLanesAvx512(vmax);
}

__attribute__((target("avx512f"))) void EqualAvx512(const int32_t* min_dist, int32_t n,
                                                    int32_t value, uint64_t* eq) {
  const __m512i x = _mm512_set1_epi32(value);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    uint64_t bits = 0;
    for (int32_t q = 0; q < 4; ++q) {
      const __m512i m = _mm512_loadu_si512(min_dist + i0 + 16 * q);
      bits |= uint64_t{_mm512_cmpeq_epi32_mask(m, x)} << (16 * q);
    }
    eq[i0 / kBlock] = bits;
  }
}

__attribute__((target("avx2"))) int32_t UpdateAvx2(const int32_t* blocked, int32_t n, int32_t pairs,
                                                   const int32_t* v, int32_t* min_dist) {
  const __m256i unit = _mm256_set1_epi32(kUnitDot);
  __m256i vmax = _mm256_set1_epi32(kNone);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const int32_t* block = blocked + static_cast<size_t>(i0) * pairs;
    for (int32_t half = 0; half < 2; ++half) {  // 32 slots at a time: 4 accumulators of 8
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
      for (int32_t k = 0; k < pairs; ++k) {
        const __m256i vk = _mm256_set1_epi32(v[k]);
        const auto* col =
            reinterpret_cast<const __m256i*>(block + static_cast<size_t>(k) * kBlock + 32 * half);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_loadu_si256(col), vk));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_loadu_si256(col + 1), vk));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_loadu_si256(col + 2), vk));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_loadu_si256(col + 3), vk));
      }
      const __m256i acc[4] = {a0, a1, a2, a3};
      for (int32_t q = 0; q < 4; ++q) {
        auto* md = reinterpret_cast<__m256i*>(min_dist + i0 + 32 * half + 8 * q);
        const __m256i m = _mm256_min_epi32(_mm256_loadu_si256(md), _mm256_sub_epi32(unit, acc[q]));
        _mm256_storeu_si256(md, m);
        vmax = _mm256_max_epi32(vmax, m);
      }
    }
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  return *std::max_element(lanes, lanes + 8);
}

__attribute__((target("avx2"))) void EqualAvx2(const int32_t* min_dist, int32_t n, int32_t value,
                                               uint64_t* eq) {
  const __m256i x = _mm256_set1_epi32(value);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    uint64_t bits = 0;
    for (int32_t q = 0; q < 8; ++q) {
      const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(min_dist + i0 + 8 * q));
      const auto mask =
          static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(m, x))));
      bits |= uint64_t{mask} << (8 * q);
    }
    eq[i0 / kBlock] = bits;
  }
}
#endif

int32_t UpdatePortable(const int32_t* blocked, int32_t n, int32_t pairs, const int32_t* v,
                       int32_t* min_dist) {
  int32_t far = kNone;
  for (int32_t i = 0; i < Padded(n); ++i) {
    const int32_t* col = blocked + BlockedAt(i, 0, pairs);
    int32_t dot = 0;
    for (int32_t k = 0; k < pairs; ++k) {
      const int32_t w = col[static_cast<size_t>(k) * kBlock];
      dot += LowHalf(w) * LowHalf(v[k]) + HighHalf(w) * HighHalf(v[k]);
    }
    min_dist[i] = std::min(min_dist[i], kUnitDot - dot);
    far = std::max(far, min_dist[i]);
  }
  return far;
}

void EqualPortable(const int32_t* min_dist, int32_t n, int32_t value, uint64_t* eq) {
  for (int32_t b = 0; b < Padded(n) / kBlock; ++b) {
    uint64_t bits = 0;
    for (int32_t l = 0; l < kBlock; ++l) bits |= uint64_t{min_dist[b * kBlock + l] == value} << l;
    eq[b] = bits;
  }
}

// The sum of the unit-normalised `points` ([n, dim]; zero rows stay zero) in double ([dim]):
// per dimension, each block of 64 points summed in index order, then the blocks in order.
// Point i with slot_of[i] >= 0 is also written, unit-normalised and quantised, to that slot
// of `blocked` (BlockedAt; the caller sizes it, slots no point fills are zeroed here). A row's
// squared norm is four double partial sums, s[j] over d = j mod 4, added as (s0 + s1) + (s2 +
// s3); the products are exact in double, so every path below (fused or not) gives the same
// bits. A unit component is the float product of the row's component and the float 1 / norm.
void PackUnit(const float* points, int32_t n, int32_t dim, FpsScratch* scratch) {
  const int32_t pairs = Pairs(dim);
  const int32_t* slot = scratch->slot_of.data();
  int32_t* blocked = scratch->blocked.data();
  double* sum = scratch->sum.data();
  std::vector<float>& unit = scratch->unit;
  std::vector<double>& part = scratch->part;
  unit.assign(2 * pairs, 0.0f);
  part.resize(dim);
  std::fill(scratch->blocked.begin(), scratch->blocked.end(), 0);
  std::fill_n(sum, dim, 0.0);
  for (int32_t b = 0; b * kBlock < n; ++b) {
    std::fill(part.begin(), part.end(), 0.0);
    for (int32_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float* p = points + static_cast<size_t>(i) * dim;
      double s[4] = {0.0, 0.0, 0.0, 0.0};
      int32_t d = 0;
      for (; d + 4 <= dim; d += 4) {
        for (int32_t j = 0; j < 4; ++j) s[j] += static_cast<double>(p[d + j]) * p[d + j];
      }
      for (; d < dim; ++d) s[0] += static_cast<double>(p[d]) * p[d];
      const double sq = (s[0] + s[1]) + (s[2] + s[3]);
      const float inv = sq > 0.0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
      for (d = 0; d < dim; ++d) unit[d] = p[d] * inv;
      for (d = 0; d < dim; ++d) part[d] += unit[d];
      if (slot[i] < 0) continue;
      int32_t* out = blocked + BlockedAt(slot[i], 0, pairs);
      for (int32_t k = 0; k < pairs; ++k) {
        out[static_cast<size_t>(k) * kBlock] =
            PairWord(Quantise(unit[2 * k]), Quantise(unit[2 * k + 1]));
      }
    }
    for (int32_t d = 0; d < dim; ++d) sum[d] += part[d];
  }
}

#if defined(__x86_64__)
// PackUnit for dim a multiple of 32, the same operations in the same order: the norm's four
// chains as one 4-wide double vector, the per-block sums as double vectors, the quantised
// rows staged in slot order (16 dimensions = 8 words at a time, rounded by vcvtps2dq under
// the default round-to-nearest-even, as std::nearbyint) and written to the blocked layout as
// 16 x 16 transposed tiles of words.
__attribute__((target("avx512f"))) void PackUnitAvx512(const float* points, int32_t n, int32_t dim,
                                                       FpsScratch* scratch) {
  if (dim % 32 != 0) return PackUnit(points, n, dim, scratch);
  const int32_t pairs = dim / 2;
  const int32_t* slot = scratch->slot_of.data();
  const auto slots = static_cast<int32_t>(scratch->first.size());
  double* sum = scratch->sum.data();
  std::vector<double>& part = scratch->part;
  part.resize(dim);
  AlignedInts& staged = scratch->staged;
  staged.resize(static_cast<size_t>(Padded(slots)) * pairs);
  // The padding rows become the passes' padding slots and must be zero: the scratch is reused,
  // so they would otherwise hold an earlier draw's rows.
  std::fill(staged.begin() + static_cast<ptrdiff_t>(slots) * pairs, staged.end(), 0);
  auto* staged16 = reinterpret_cast<int16_t*>(staged.data());  // row `to` = [dim] int16
  std::fill_n(sum, dim, 0.0);
  const __m512 scale = _mm512_set1_ps(kQuantScale);
  alignas(64) double sq[kBlock];
  alignas(64) float inv[kBlock];
  for (int32_t b = 0; b * kBlock < n; ++b) {
    const int32_t i0 = b * kBlock, rows = std::min(n - i0, kBlock);
    // Squared norms first, four rows at a time (four independent chains in flight), then
    // 1 / sqrt eight rows at a time (both correctly rounded, as the scalar code's), then the
    // unit rows.
    for (int32_t r = 0; r < rows; r += 4) {
      const int32_t k = std::min(4, rows - r);
      const float* p[4];
      for (int32_t j = 0; j < 4; ++j) {
        p[j] = points + static_cast<size_t>(i0 + r + std::min(j, k - 1)) * dim;
      }
      __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
      for (int32_t d = 0; d < dim; d += 4) {
        const __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(p[0] + d));
        const __m256d x1 = _mm256_cvtps_pd(_mm_loadu_ps(p[1] + d));
        const __m256d x2 = _mm256_cvtps_pd(_mm_loadu_ps(p[2] + d));
        const __m256d x3 = _mm256_cvtps_pd(_mm_loadu_ps(p[3] + d));
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(x0, x0));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(x1, x1));
        a2 = _mm256_add_pd(a2, _mm256_mul_pd(x2, x2));
        a3 = _mm256_add_pd(a3, _mm256_mul_pd(x3, x3));
      }
      const __m256d acc[4] = {a0, a1, a2, a3};
      for (int32_t j = 0; j < k; ++j) {
        const __m128d lo = _mm256_castpd256_pd128(acc[j]), hi = _mm256_extractf128_pd(acc[j], 1);
        // (s0 + s1) + (s2 + s3)
        sq[r + j] = _mm_cvtsd_f64(_mm_add_sd(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)),
                                             _mm_add_sd(hi, _mm_unpackhi_pd(hi, hi))));
      }
    }
    for (int32_t r = 0; r < rows; r += 8) {
      const __mmask8 live = static_cast<__mmask8>(rows - r >= 8 ? 0xFF : (1u << (rows - r)) - 1);
      const __m512d x = _mm512_maskz_loadu_pd(live, sq + r);
      const __mmask8 pos = _mm512_cmp_pd_mask(x, _mm512_setzero_pd(), _CMP_GT_OQ);
      const __m512d y = _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_sqrt_pd(x));
      _mm256_storeu_ps(inv + r, _mm512_maskz_cvtpd_ps(pos, y));
    }
    // Per 16 dimensions, the block's sum in two 8-wide double registers, rows in order.
    for (int32_t d = 0; d < dim; d += 16) {
      __m512d acc_lo = _mm512_setzero_pd(), acc_hi = _mm512_setzero_pd();
      for (int32_t r = 0; r < rows; ++r) {
        const __m512 u =
            _mm512_mul_ps(_mm512_loadu_ps(points + static_cast<size_t>(i0 + r) * dim + d),
                          _mm512_set1_ps(inv[r]));
        acc_lo = _mm512_add_pd(acc_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(u)));
        acc_hi = _mm512_add_pd(
            acc_hi,
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1))));
        if (const int32_t to = slot[i0 + r]; to >= 0) {
          const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(u, scale));
          _mm256_storeu_si256(
              reinterpret_cast<__m256i*>(staged16 + static_cast<size_t>(to) * dim + d),
              _mm512_cvtepi32_epi16(q));
        }
      }
      _mm512_storeu_pd(part.data() + d, acc_lo);
      _mm512_storeu_pd(part.data() + d + 8, acc_hi);
    }
    for (int32_t d = 0; d < dim; ++d) sum[d] += part[d];
  }
  int32_t* blocked = scratch->blocked.data();
  for (int32_t s0 = 0; s0 < Padded(slots); s0 += 16) {
    int32_t* dst = blocked + BlockedAt(s0, 0, pairs);
    for (int32_t k = 0; k < pairs; k += 16) {
      internal::Transpose16x16(staged.data() + static_cast<size_t>(s0) * pairs + k, pairs,
                               dst + static_cast<size_t>(k) * kBlock, kBlock);
    }
  }
}
#endif

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
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vnni");
#endif
    default:
      return false;
  }
}

FpsKernels Kernel(internal::FpsKernel kernel) {
  switch (kernel) {
#if defined(__x86_64__)
    case internal::FpsKernel::kAvx512:
      return {UpdateAvx512, EqualAvx512, PackUnitAvx512};
    case internal::FpsKernel::kAvx2:
      return {UpdateAvx2, EqualAvx2, PackUnit};
#endif
    default:
      return {UpdatePortable, EqualPortable, PackUnit};
  }
}

// The fastest kernels this machine runs (all give the same result).
FpsKernels PickKernels() {
  for (internal::FpsKernel k : {internal::FpsKernel::kAvx512, internal::FpsKernel::kAvx2}) {
    if (Supported(k)) return Kernel(k);
  }
  return Kernel(internal::FpsKernel::kPortable);
}

// A hash of a row's bits, from about eight of its words spread over the row (queries that
// differ differ nearly everywhere; rows that agree on those words only cost the table a full
// compare). Equal rows hash equal, and the grouping does not depend on the hash's values.
uint64_t RowHash(const float* p, int32_t dim) {
  const int32_t step = std::max(1, dim / 8);
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(dim);
  for (int32_t d = 0; d < dim; d += step) {
    uint32_t w;
    std::memcpy(&w, p + d, sizeof(w));
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

// Groups bitwise-equal rows of `points` ([n, dim]): `first` lists the first index of each
// distinct row (ascending); next_copy[i] is the next index after i whose row equals row i
// (-1 after the last). RowHash and an open-addressed table (rows are compared in full on a
// hash match): a few microseconds for 512 rows of 32.
void GroupDuplicates(const float* points, int32_t n, int32_t dim, FpsScratch* s) {
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  auto row = [&](int32_t i) { return points + static_cast<size_t>(i) * dim; };
  size_t cap = 16;
  while (cap < 2 * static_cast<size_t>(n)) cap *= 2;
  s->table.assign(cap, -1);  // distinct group id, -1 = empty
  s->first.clear();
  s->group_hash.clear();
  s->next_copy.assign(n, -1);
  std::vector<int32_t>& last = s->picked;  // the latest index of each group (reused below)
  last.clear();
  const int shift = 64 - std::countr_zero(cap);
  for (int32_t i = 0; i < n; ++i) {
    const float* p = row(i);
    const uint64_t h = RowHash(p, dim);
    size_t at = static_cast<size_t>((h * 0xBF58476D1CE4E5B9ull) >> shift);
    for (;; at = (at + 1) & (cap - 1)) {
      const int32_t g = s->table[at];
      if (g < 0) {
        s->table[at] = static_cast<int32_t>(s->first.size());
        s->first.push_back(i);
        last.push_back(i);
        s->group_hash.push_back(h);
        break;
      }
      if (s->group_hash[g] == h && std::memcmp(row(s->first[g]), p, row_bytes) == 0) {
        s->next_copy[last[g]] = i;
        last[g] = i;
        break;
      }
    }
  }
}

// The set-up of a draw: groups the copies (each distinct row one slot, in index order; with
// dedupe off every row its own slot), then packs the quantised unit vectors and the sum of
// the unit vectors with `pack`.
// Returns the number of slots.
int32_t PackSlots(const float* points, int32_t n, int32_t dim, bool dedupe, PackFn pack,
                  FpsScratch* s) {
  if (dedupe) {
    GroupDuplicates(points, n, dim, s);
  } else {
    s->first.resize(n);
    std::iota(s->first.begin(), s->first.end(), 0);
    s->next_copy.assign(n, -1);
  }
  const auto m = static_cast<int32_t>(s->first.size());
  s->slot_of.assign(n, -1);
  for (int32_t k = 0; k < m; ++k) s->slot_of[s->first[k]] = k;
  s->blocked.resize(static_cast<size_t>(Padded(m)) * Pairs(dim));  // the pack fills every word
  s->sum.assign(dim, 0.0);
  pack(points, n, dim, s);
  return m;
}

BKV_MULTIVERSION int32_t MaxOf(const int32_t* x, int32_t n) {
  int32_t lanes[16];
  std::fill(lanes, lanes + 16, kNone);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int32_t l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  }
  int32_t m = kNone;
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (int32_t l : lanes) m = std::max(m, l);
  return m;
}

}  // namespace

namespace internal {

bool FpsKernelSupported(FpsKernel kernel) {
  return kernel == FpsKernel::kAuto || Supported(kernel);
}

std::vector<int32_t> FpsOrder(const float* points, int32_t n, int32_t dim, int32_t count,
                              FpsKernel kernel, bool dedupe, std::vector<uint8_t>* is_copy,
                              int32_t stop_below) {
  BKV_CHECK(count >= 0 && count <= n);
  BKV_CHECK(stop_below >= 0);
  BKV_CHECK(dim >= 1 && dim <= kMaxFpsDim);
  std::vector<int32_t> order;
  if (is_copy != nullptr) is_copy->clear();
  if (count == 0) return order;
  order.reserve(count);
  static const FpsKernels best = PickKernels();
  BKV_CHECK(FpsKernelSupported(kernel));
  const FpsKernels fn = kernel == FpsKernel::kAuto ? best : Kernel(kernel);
  // Exact duplicates (layer 0's queries are a function of the token alone) take one slot:
  // copies of a point have the same distance to everything at every step, so the earliest is
  // picked first, the pass after it gives the rest 2^28 - q . q, and each later copy is
  // picked when that is the largest distance left (ties again to the earliest point). Their
  // picks then need no pass: a copy's dot products were all applied with the first one.
  static thread_local FpsScratch scratch;
  FpsScratch& s = scratch;
  const int32_t m = PackSlots(points, n, dim, dedupe, fn.pack, &s);  // slots
  const int32_t stride = Padded(m);
  const int32_t pairs = Pairs(dim);
  int32_t* blocked = s.blocked.data();
  auto at = [&](int32_t i, int32_t k) -> int32_t& { return blocked[BlockedAt(i, k, pairs)]; };
  s.min_dist.assign(stride, kNone);
  int32_t* md = s.min_dist.data();
  s.v.assign(pairs, 0);
  int32_t* v = s.v.data();
  // The slots still holding an unchosen point are the first `active`; a slot whose points are
  // all chosen is swapped to the end of that range (slot order is then no longer index order:
  // `index` maps a slot to its next point, `group` to its row group), so each pass covers only
  // the points that can still be picked and the work per draw falls from count * n to about
  // count * (n - count / 2) dot products.
  s.index.assign(stride, 0);
  s.group.assign(stride, 0);
  s.picked.assign(m, 0);
  int32_t* index = s.index.data();
  int32_t* group = s.group.data();
  for (int32_t k = 0; k < m; ++k) index[k] = s.first[k], group[k] = k;
  int32_t active = m;
  // The slot holding the pick: among the active slots whose distance is `far`, the one of
  // the earliest point (the tie rule). One vector compare per 16 slots finds them.
  s.eq.assign(stride / kBlock, 0);
  uint64_t* eq = s.eq.data();
  auto pick_at = [&](int32_t far) {
    fn.equal(md, active, far, eq);
    int32_t best = -1;
    for (int32_t b = 0; b * kBlock < active; ++b) {
      for (uint64_t bits = eq[b]; bits != 0; bits &= bits - 1) {
        const int32_t i = b * kBlock + std::countr_zero(bits);
        if (i < active && (best < 0 || index[i] < index[best])) best = i;
      }
    }
    BKV_CHECK(best >= 0);
    return best;
  };

  // Seed: the point farthest from the direction of the mean of the unit vectors (that
  // direction normalised in double, rounded to float, then quantised like the points), found
  // with the same pass as a pick (min_dist starts at kFar, so it becomes the distance).
  double sq = 0.0;
  for (double x : s.sum) sq += x * x;
  if (sq > 0.0) {
    const double root = std::sqrt(sq);
    auto q = [&](int32_t d) { return d < dim ? Quantise(static_cast<float>(s.sum[d] / root)) : 0; };
    for (int32_t k = 0; k < pairs; ++k) v[k] = PairWord(q(2 * k), q(2 * k + 1));
  }
  std::fill_n(md, m, kFar);
  int32_t far = fn.update(blocked, m, pairs, v, md);
  int32_t slot = pick_at(far);
  std::fill_n(md, m, kFar);

  // Each pick: emit the slot's next point; a slot with no copies left leaves the active
  // range. After a group's first pick, one fused dot product + min + max pass over the rest.
  for (;;) {
    order.push_back(index[slot]);
    const int32_t k = group[slot];
    const bool first_pick = s.picked[k] == 0;
    s.picked[k] = 1;
    if (is_copy != nullptr) is_copy->push_back(first_pick ? 0 : 1);
    if (first_pick) {
      for (int32_t w = 0; w < pairs; ++w) v[w] = at(slot, w);
    }
    if (const int32_t next = s.next_copy[index[slot]]; next >= 0) {
      index[slot] = next;  // the next copy waits in the same slot
    } else {
      --active;
      if (slot != active) {
        for (int32_t w = 0; w < pairs; ++w) std::swap(at(slot, w), at(active, w));
        std::swap(md[slot], md[active]);
        std::swap(index[slot], index[active]);
        std::swap(group[slot], group[active]);
      }
      md[active] = kNone;  // stays inside the last block's pass: never wins the max
    }
    if (static_cast<int32_t>(order.size()) == count) break;
    far = first_pick ? fn.update(blocked, active, pairs, v, md) : MaxOf(md, active);
    if (stop_below > 0 && far < stop_below) break;  // every point left is that close
    slot = pick_at(far);
  }
  return order;
}

void FpsPack(const float* points, int32_t n, int32_t dim, FpsKernel kernel,
             std::vector<int16_t>* quantised, std::vector<double>* sum) {
  BKV_CHECK(n >= 1 && dim >= 1 && dim <= kMaxFpsDim && FpsKernelSupported(kernel));
  const FpsKernels fn = kernel == FpsKernel::kAuto ? PickKernels() : Kernel(kernel);
  FpsScratch s;
  const int32_t m = PackSlots(points, n, dim, /*dedupe=*/true, fn.pack, &s);
  const int32_t pairs = Pairs(dim);
  quantised->resize(static_cast<size_t>(m) * dim);
  for (int32_t k = 0; k < m; ++k) {
    for (int32_t d = 0; d < dim; ++d) {
      const int32_t w = s.blocked[BlockedAt(k, d / 2, pairs)];
      (*quantised)[static_cast<size_t>(k) * dim + d] =
          static_cast<int16_t>(d % 2 == 0 ? LowHalf(w) : HighHalf(w));
    }
  }
  *sum = s.sum;
}

}  // namespace internal

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  return internal::FpsOrder(points, n, dim, count, internal::FpsKernel::kAuto);
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max, bool draw_on_fill,
                       double radius, bool bf16)
    : head_dim_(head_dim),
      buffer_min_(buffer_min),
      buffer_max_(buffer_max),
      draw_on_fill_(draw_on_fill),
      radius_(static_cast<int32_t>(std::lround(radius * kFpsDistanceOne))),
      bf16_(bf16) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
  BKV_CHECK(radius >= 0.0 && radius <= 2.0);
}

int64_t BeaconBank::CapacityBytes() const {
  return static_cast<int64_t>(buffer_max_) * head_dim_ *
         static_cast<int64_t>(bf16_ ? sizeof(uint16_t) : sizeof(float));
}

void BeaconBank::Append(const float* query) {
  if (bf16_) {
    internal::GrowCapped(&buffer16_, static_cast<size_t>(head_dim_),
                         static_cast<size_t>(buffer_max_) * head_dim_);
    buffer16_.resize(buffer16_.size() + head_dim_);
    StreamBf16Bits(query, head_dim_, buffer16_.data() + buffer16_.size() - head_dim_);
  } else {
    internal::GrowCapped(&buffer_, static_cast<size_t>(head_dim_),
                         static_cast<size_t>(buffer_max_) * head_dim_);
    buffer_.resize(buffer_.size() + head_dim_);
    StreamRow(query, head_dim_, buffer_.data() + buffer_.size() - head_dim_);
  }
  ++size_;
  ++arrivals_;
  if (size_ == buffer_max_) Reduce();
}

void BeaconBank::Reduce() {
  // With a radius a buffer of at most buffer_min is reduced too: to the points farther than
  // the radius from the ones drawn before them.
  if (size_ == 0 || (size_ <= buffer_min_ && radius_ == 0)) return;
  const std::vector<int32_t> keep =
      internal::FpsOrder(Points(), size_, head_dim_, std::min(buffer_min_, size_),
                         internal::FpsKernel::kAuto, true, &copy_, radius_);
  const auto kept = static_cast<int32_t>(keep.size());
  // Survivors in FPS order, so the first n of them are the first n of the ordering.
  auto gather = [&](auto& buffer, auto& scratch) {  // scratch: per thread, see the header
    scratch.resize(static_cast<size_t>(kept) * head_dim_);
    for (int32_t i = 0; i < kept; ++i) {
      std::copy_n(buffer.data() + static_cast<size_t>(keep[i]) * head_dim_, head_dim_,
                  scratch.data() + static_cast<size_t>(i) * head_dim_);
    }
    buffer.assign(scratch.begin(), scratch.end());
  };
  if (bf16_) {
    static thread_local std::vector<uint16_t> survivors;
    gather(buffer16_, survivors);
  } else {
    static thread_local std::vector<float> survivors;
    gather(buffer_, survivors);
  }
  cut_ = kept < std::min(buffer_min_, size_);
  size_ = kept;
  ordered_ = kept;
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) {
  const int32_t n = Beacons(n_beacons, out);
  rope.RotateMany(out->data(), n, position, out->data());
  return n;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, std::vector<float>* out) {
  // Reuse the draw: the FPS that picks the beacons also reduces the buffer, so the next
  // compression starts from these survivors instead of drawing again from the same points.
  // With draw_on_fill a draw that still has n_beacons survivors is reused as it is, unless
  // as many arrivals as came since the last call would fill the buffer: then the buffer is
  // reduced here, in the compression, rather than in the middle of a later Append.
  // A draw cut at the radius holds every point the buffer had that far apart, so it is
  // reused like a full one, and drawn again after as many arrivals as would fill the buffer
  // after a full one (after a full draw that is the condition above, so it applies only
  // with a radius).
  const int64_t pending = int64_t{size_} - ordered_ + arrivals_;
  const bool due = !draw_on_fill_ || (ordered_ < std::min(n_beacons, size_) && !cut_) ||
                   int64_t{size_} + arrivals_ >= buffer_max_ ||
                   (radius_ > 0 && pending >= buffer_max_ - buffer_min_);
  arrivals_ = 0;
  if (due) Reduce();
  // With a radius the beacons are the (leading) survivors of the draw just made or reused.
  const int32_t want = std::min(n_beacons, radius_ > 0 ? ordered_ : size_);
  out->resize(static_cast<size_t>(want) * head_dim_);
  // The first `want` points of an FPS ordering, less the copies of points already among
  // them (a copy would score every key the same): the rows are written in order, then the
  // copies squeezed out in place.
  auto squeeze = [&](const std::vector<uint8_t>& copy) {
    int32_t kept = 0;
    for (int32_t b = 0; b < want; ++b) {
      if (copy[b] != 0) continue;
      if (kept != b) {
        std::copy_n(out->data() + static_cast<size_t>(b) * head_dim_, head_dim_,
                    out->data() + static_cast<size_t>(kept) * head_dim_);
      }
      ++kept;
    }
    return kept;
  };
  int32_t n = want;
  if (ordered_ >= want) {
    CopyRows(0, want, out->data());
    n = squeeze(copy_);
  } else if (want == size_) {
    CopyRows(0, want, out->data());  // every buffered query, in buffer order
  } else {
    std::vector<uint8_t> copy;
    const std::vector<int32_t> order = internal::FpsOrder(Points(), size_, head_dim_, want,
                                                          internal::FpsKernel::kAuto, true, &copy);
    for (int32_t b = 0; b < want; ++b) {
      CopyRows(order[b], 1, out->data() + static_cast<size_t>(b) * head_dim_);
    }
    n = squeeze(copy);
  }
  out->resize(static_cast<size_t>(n) * head_dim_);
  return n;
}

const float* BeaconBank::Points() const {
  if (!bf16_) return buffer_.data();
  static thread_local std::vector<float> points;
  points.resize(buffer16_.size());
  FromBf16Row(buffer16_.data(), static_cast<int64_t>(buffer16_.size()), points.data());
  return points.data();
}

void BeaconBank::CopyRows(int32_t first, int32_t count, float* out) const {
  const size_t at = static_cast<size_t>(first) * head_dim_;
  const int64_t values = int64_t{count} * head_dim_;
  if (bf16_) {
    FromBf16Row(buffer16_.data() + at, values, out);
  } else {
    std::copy_n(buffer_.data() + at, values, out);
  }
}

std::vector<float> BeaconBank::Rows() const {
  std::vector<float> rows(static_cast<size_t>(size_) * head_dim_);
  CopyRows(0, size_, rows.data());
  return rows;
}

}  // namespace beaconkv

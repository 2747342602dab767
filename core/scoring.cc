#include "core/scoring.h"

#include <cblas.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/multiversion.h"
#include "core/selection.h"
#include "core/transpose16.h"

namespace beaconkv {
namespace {

// Cephes-style expf (relative error ~2 ulp) written so the compiler can vectorise it. The
// clamp takes NaN to -87 (std::max returns its first argument when the comparison is false),
// so a NaN logit weighs as nothing in the portable paths instead of reaching the integer
// conversion below (undefined). (The AVX-512 scorer below has no such conversion; there a
// row with a NaN logit drops out of the max, FoldRows.)
inline float ExpApprox(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return e * std::bit_cast<float>(bits);
}

// Reductions keep 16 independent lanes so the compiler vectorises them without
// reassociating float math (no -ffast-math needed).
constexpr int32_t kLanes = 16;

BKV_MULTIVERSION float MaxOf(const float* x, int32_t n) {
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  }
  float m = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (float l : lanes) m = std::max(m, l);
  return m;
}

BKV_MULTIVERSION float ExpShiftSum(float* x, int32_t n, float shift) {
  for (int32_t i = 0; i < n; ++i) x[i] = ExpApprox(x[i] - shift);
  float lanes[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i];
  for (float l : lanes) sum += l;
  return sum;
}

// sum_i exp(x[i] - shift), x unchanged.
BKV_MULTIVERSION float ExpShiftSumOnly(const float* x, int32_t n, float shift) {
  float lanes[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] += ExpApprox(x[i + l] - shift);
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += ExpApprox(x[i] - shift);
  for (float l : lanes) sum += l;
  return sum;
}

// acc[i] = max(acc[i], x[i] - shift).
BKV_MULTIVERSION void MaxShiftedInto(float* acc, const float* x, int32_t n, float shift) {
  for (int32_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i] - shift);
}

BKV_MULTIVERSION void ExpInPlace(float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) x[i] = ExpApprox(x[i]);
}

BKV_MULTIVERSION void Scale(float* x, int32_t n, float s) {
  for (int32_t i = 0; i < n; ++i) x[i] *= s;
}

BKV_MULTIVERSION void MaxInto(float* acc, const float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
}

BKV_MULTIVERSION void AddInto(float* acc, const float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] += x[i];
}

#if defined(__x86_64__)
// The max-of-probabilities scores (see AttentionScores) without materialising every row's
// logits: the keys are transposed once into [d][n16] (n16 = n rounded up to 16, zero
// padded), then four rows at a time are multiplied against 64-key tiles held in sixteen
// accumulators (one load of each key vector serves four rows), so the logits of those rows
// land in a [4][n16] buffer that stays in L1, and each row's log-sum-exp and its max into
// `out` read it from there (in base 2, so each exponential is a short one: Exp2Approx16). (OpenBLAS
// on these shapes, 352 x 128 x 32, spent most of its time zeroing C and synchronising threads.)
constexpr float kLog2E = 1.44269504088896341f;

// The fused scorers' logits are in base 2: q . k / sqrt(d) times log2 e, one rounding.
inline float Base2Scale(int32_t d) {
  return static_cast<float>(1.44269504088896341 / std::sqrt(static_cast<double>(d)));
}

bool HasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

// A tile's accumulators times `scale` into tile[r * n16 + j0 + 16 v]; row_max[r] takes the
// max of those of keys j < n.
template <int NR, int NV>
__attribute__((target("avx512f"))) inline void StoreTile(const __m512 (&acc)[NR][NV], int32_t n,
                                                         float scale, int32_t j0, int32_t n16,
                                                         float* tile, __m512* row_max) {
  const __m512 s = _mm512_set1_ps(scale);
  __mmask16 valid[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int32_t left = n - (j0 + 16 * v);
    valid[v] =
        left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>(left > 0 ? (1u << left) - 1u : 0u);
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512 x = _mm512_mul_ps(acc[r][v], s);
      _mm512_storeu_ps(tile + static_cast<size_t>(r) * n16 + j0 + 16 * v, x);
      row_max[r] = _mm512_mask_max_ps(row_max[r], valid[v], row_max[r], x);
    }
  }
}

// row_max[r] = the largest lane of vmax[r].
template <int NR>
__attribute__((target("avx512f"))) inline void RowMaxes(const __m512* vmax, float* row_max) {
  // Halving steps, with the zero-masked extracts: _mm512_reduce_max_ps and the unmasked
  // extracts trip GCC 12's -Wuninitialized (their undefined source operand). A NaN lane may
  // or may not win; either way the row's sum is NaN and FoldRows leaves the best as it was.
  for (int r = 0; r < NR; ++r) {
    const __m512d x = _mm512_castps_pd(vmax[r]);
    const __m256 h = _mm256_max_ps(_mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, x, 0)),
                                   _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, x, 1)));
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    q = _mm_max_ss(q, _mm_movehdup_ps(q));
    row_max[r] = _mm_cvtss_f32(q);
  }
}

// Logits of NR (1..4) rows against the keys [j0, j0 + 16 * NV) (NV 1..4), times `scale`,
// into tile[r * n16 + j]; row_max[r] = max(row_max[r], those of keys j < n).
template <int NR, int NV>
__attribute__((target("avx512f"))) inline void LogitTile(const float* kt, int32_t n, int32_t n16,
                                                         int32_t d, const float* q, float scale,
                                                         int32_t j0, float* tile, __m512* row_max) {
  __m512 acc[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int32_t k = 0; k < d; ++k) {
    const float* col = kt + static_cast<size_t>(k) * n16 + j0;
    __m512 kv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) kv[v] = _mm512_loadu_ps(col + 16 * v);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 qb = _mm512_set1_ps(q[static_cast<size_t>(r) * d + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(kv[v], qb, acc[r][v]);
    }
  }
  StoreTile<NR, NV>(acc, n, scale, j0, n16, tile, row_max);
}

// The logits of NR rows against every key into tile; returns each row's largest in row_max.
template <int NR>
__attribute__((target("avx512f"))) void LogitRows(const float* kt, int32_t n, int32_t n16,
                                                  int32_t d, const float* q, float scale,
                                                  float* tile, float* row_max) {
  __m512 vmax[NR];
  for (int r = 0; r < NR; ++r) vmax[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int32_t j0 = 0;
  for (; j0 + 64 <= n16; j0 += 64) LogitTile<NR, 4>(kt, n, n16, d, q, scale, j0, tile, vmax);
  switch ((n16 - j0) / 16) {
    case 3:
      LogitTile<NR, 3>(kt, n, n16, d, q, scale, j0, tile, vmax);
      break;
    case 2:
      LogitTile<NR, 2>(kt, n, n16, d, q, scale, j0, tile, vmax);
      break;
    case 1:
      LogitTile<NR, 1>(kt, n, n16, d, q, scale, j0, tile, vmax);
      break;
    default:
      break;
  }
  RowMaxes<NR>(vmax, row_max);
}

// 2^x on 16 lanes (relative error below 2e-7): x = n + r with n = round(x) (roundscale) and
// r = x - n in [-1/2, 1/2] exactly, 2^r by a degree-5 polynomial fitted to the relative error
// on that interval, then 2^n applied by scalef (which also takes x below -126 to a denormal or
// 0). The fused scorer works in base 2 (its logits carry the factor log2 e) so an exponential
// costs eight instructions: no multiply by log2 e and no two-part reduction by ln 2.
__attribute__((target("avx512f"))) inline __m512 Exp2Approx16(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.326452475041151e-3f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.671450592577457e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550733581185341e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022242426872253e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931470036506653e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Natural log on 16 lanes of positive normal floats: x = m 2^e with m in [sqrt(1/2),
// sqrt(2)) (getmant, getexp), log(m) = y - y^2 / 2 + y^3 P(y) with y = m - 1 (Cephes' logf
// polynomial), plus e ln 2 in two parts.
__attribute__((target("avx512f"))) inline __m512 LogApprox16(__m512 x) {
  // (The masked forms with every lane set: the plain ones trip GCC 12's -Wuninitialized.)
  __m512 m = _mm512_mask_getmant_ps(x, 0xFFFF, x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  __m512 e = _mm512_mask_getexp_ps(x, 0xFFFF, x);
  const __mmask16 high = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, high, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, high, e, _mm512_set1_ps(1.0f));
  const __m512 y = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(y, y);
  __m512 p = _mm512_set1_ps(7.0376836292e-2f);
  for (const float c : {-1.1514610310e-1f, 1.1676998740e-1f, -1.2420140846e-1f, 1.4249322787e-1f,
                        -1.6668057665e-1f, 2.0000714765e-1f, -2.4999993993e-1f, 3.3333331174e-1f})
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(c));
  __m512 r = _mm512_mul_ps(_mm512_mul_ps(p, y), z);
  r = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), r);
  r = _mm512_fnmadd_ps(z, _mm512_set1_ps(0.5f), r);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(y, r));
}

// sum over j < n of 2^(row[j] - shift); row is padded to a multiple of 16.
__attribute__((target("avx512f"))) float Exp2ShiftSum16(const float* row, int32_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int32_t j = 0;
  for (; j + 32 <= n; j += 32) {
    a0 = _mm512_add_ps(a0, Exp2Approx16(_mm512_sub_ps(_mm512_loadu_ps(row + j), s)));
    a1 = _mm512_add_ps(a1, Exp2Approx16(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16), s)));
  }
  for (; j < n; j += 16) {
    const int32_t left = n - j;
    const __mmask16 valid =
        left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1u);
    a0 =
        _mm512_mask_add_ps(a0, valid, a0, Exp2Approx16(_mm512_sub_ps(_mm512_loadu_ps(row + j), s)));
  }
  float lanes[16];  // (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized)
  _mm512_storeu_ps(lanes, _mm512_add_ps(a0, a1));
  float sum = 0.0f;
  for (float l : lanes) sum += l;
  return sum;
}

// The NR rows of `tile` ([NR][n16], n keys, logits in base 2): each row's log2-sum-exp2 (its
// largest logit in row_max[r], then one vector log for all NR), then best[j] = max(best[j],
// row[j] - lse) over the NR rows in one pass over `best` (padded to n16 like the rows).
template <int NR>
__attribute__((target("avx512f"))) void FoldRows(const float* tile, int32_t n, int32_t n16,
                                                 const float* row_max, float* best) {
  alignas(64) float sums[16];
  alignas(64) float maxes[16];
  std::fill_n(sums, 16, 1.0f);
  std::fill_n(maxes, 16, 0.0f);
  for (int r = 0; r < NR; ++r) {
    sums[r] = Exp2ShiftSum16(tile + static_cast<size_t>(r) * n16, n, row_max[r]);
    maxes[r] = row_max[r];
  }
  alignas(64) float lse[16];
  _mm512_store_ps(lse, _mm512_fmadd_ps(LogApprox16(_mm512_load_ps(sums)), _mm512_set1_ps(kLog2E),
                                       _mm512_load_ps(maxes)));
  __m512 shift[NR];
  for (int r = 0; r < NR; ++r) shift[r] = _mm512_set1_ps(lse[r]);
  for (int32_t j = 0; j < n16; j += 16) {
    __m512 b = _mm512_loadu_ps(best + j);
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 x = _mm512_loadu_ps(tile + static_cast<size_t>(r) * n16 + j);
      // max_ps returns its second operand when either is NaN: a row whose logits or
      // normaliser are NaN leaves the running best as it was.
      b = _mm512_max_ps(_mm512_sub_ps(x, shift[r]), b);
    }
    _mm512_storeu_ps(best + j, b);
  }
}

// kt[k * n16 + j] = keys[j * d + k] for j < n, and 0 for n <= j < n16 (the padding keys):
// 16 x 16 tiles when d is a multiple of 16 (the tail's rows staged in a zeroed tile).
__attribute__((target("avx512f"))) void TransposeKeys(const float* keys, int32_t n, int32_t d,
                                                      int32_t n16, float* kt) {
  if (d % 16 != 0) {
    std::fill_n(kt, static_cast<size_t>(d) * n16, 0.0f);
    for (int32_t j = 0; j < n; ++j) {
      for (int32_t k = 0; k < d; ++k) {
        kt[static_cast<size_t>(k) * n16 + j] = keys[static_cast<size_t>(j) * d + k];
      }
    }
    return;
  }
  const int32_t whole = n / 16 * 16;
  for (int32_t j0 = 0; j0 < whole; j0 += 16) {
    for (int32_t k0 = 0; k0 < d; k0 += 16) {
      internal::Transpose16x16(keys + static_cast<size_t>(j0) * d + k0, d,
                               kt + static_cast<size_t>(k0) * n16 + j0, n16);
    }
  }
  if (whole == n16) return;
  alignas(64) float tile[16 * 16];
  for (int32_t k0 = 0; k0 < d; k0 += 16) {
    std::fill_n(tile, 16 * 16, 0.0f);
    for (int32_t j = whole; j < n; ++j) {
      std::copy_n(keys + static_cast<size_t>(j) * d + k0, 16, tile + (j - whole) * 16);
    }
    internal::Transpose16x16(tile, 16, kt + static_cast<size_t>(k0) * n16 + whole, n16);
  }
}

// The fused scorer's row loop: logits(NR, r0, tile, row_max) puts the logits of rows
// [r0, r0 + NR) (NR 1..4, as std::integral_constant) into tile ([NR][n16]) and their maxima
// into row_max; FoldRows folds them into the running best; out gets exp of the best.
template <typename Logits>
__attribute__((target("avx512f"))) void FoldRowsInFours(int32_t rows, int32_t n, int32_t n16,
                                                        Logits&& logits, float* out,
                                                        ScoreScratch* scratch) {
  scratch->logits.resize(static_cast<size_t>(4) * n16);
  float* tile = scratch->logits.data();
  // The running max in the log domain, padded to whole vectors (the padding is never read).
  scratch->row.assign(n16, -std::numeric_limits<float>::infinity());
  float* best = scratch->row.data();
  for (int32_t r0 = 0; r0 < rows; r0 += 4) {
    float row_max[4];
    switch (std::min(4, rows - r0)) {
      case 4:
        logits(std::integral_constant<int, 4>{}, r0, tile, row_max);
        FoldRows<4>(tile, n, n16, row_max, best);
        break;
      case 3:
        logits(std::integral_constant<int, 3>{}, r0, tile, row_max);
        FoldRows<3>(tile, n, n16, row_max, best);
        break;
      case 2:
        logits(std::integral_constant<int, 2>{}, r0, tile, row_max);
        FoldRows<2>(tile, n, n16, row_max, best);
        break;
      default:
        logits(std::integral_constant<int, 1>{}, r0, tile, row_max);
        FoldRows<1>(tile, n, n16, row_max, best);
        break;
    }
  }
  // out = 2^best: the softmax probability of the row that gives each key its largest, floored
  // at 2^(-87 log2 e) = e^-87 as ExpApprox floors the other paths' (so probabilities below it
  // tie, ties going to the newest token, and a key no row could score, best = -inf when every
  // row's normaliser is NaN, gets that floor rather than 2^-inf's NaN).
  const __m512 floor = _mm512_set1_ps(-87.0f * kLog2E);
  for (int32_t j = 0; j < n; j += 16) {
    const int32_t left = n - j;
    const __mmask16 valid =
        left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << left) - 1u);
    const __m512 x = _mm512_max_ps(_mm512_loadu_ps(best + j), floor);
    _mm512_mask_storeu_ps(out + j, valid, Exp2Approx16(x));
  }
}

void MaxProbScoresAvx512(const float* keys, int32_t n, int32_t d, const float* queries,
                         int32_t rows, float* out, ScoreScratch* scratch) {
  const int32_t n16 = (n + 15) / 16 * 16;
  scratch->keys_t.resize(static_cast<size_t>(d) * n16);
  float* kt = scratch->keys_t.data();
  TransposeKeys(keys, n, d, n16, kt);
  const float scale = Base2Scale(d);
  FoldRowsInFours(
      rows, n, n16,
      [&](auto nr, int32_t r0, float* tile, float* row_max) {
        LogitRows<decltype(nr)::value>(kt, n, n16, d, queries + static_cast<size_t>(r0) * d, scale,
                                       tile, row_max);
      },
      out, scratch);
}

// ---- bfloat16 products (ScoreSpec::bf16) with AVX-512 BF16 ----
// Each 32-bit word holds two bfloat16 (dims 2k and 2k + 1 of a vector, the lower one in the
// low half); vdpbf16ps multiplies 16 such pairs of a key tile by a broadcast pair of a row and
// adds both products to float32 lanes: 32 products per instruction against the float path's 16.
bool HasAvx512Bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

#define BKV_TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// words[k] = the bfloat16 of src[2k] | that of src[2k + 1] << 16, for k < d / 2 (d % 16 == 0):
// vcvtneps2bf16 rounds to nearest even, with RoundToBf16's NaN and denormal rules.
BKV_TARGET_BF16 inline void PackPairs(const float* src, int32_t d, int32_t* words) {
  for (int32_t k = 0; k < d; k += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(words + k / 2),
                        reinterpret_cast<const __m256i&>(b));
  }
}

// LogitTile on pairs: the logits of NR rows (q: [NR][pairs] words) against keys
// [j0, j0 + 16 NV) (kt: [pairs][n16] words), times scale, into tile; their max into row_max.
template <int NR, int NV>
BKV_TARGET_BF16 inline void LogitTileBf16(const int32_t* kt, int32_t n, int32_t n16, int32_t pairs,
                                          const int32_t* q, float scale, int32_t j0, float* tile,
                                          __m512* row_max) {
  __m512 acc[NR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int32_t k = 0; k < pairs; ++k) {
    const int32_t* col = kt + static_cast<size_t>(k) * n16 + j0;
    __m512bh kv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      const __m512i w = _mm512_loadu_si512(col + 16 * v);
      kv[v] = reinterpret_cast<const __m512bh&>(w);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512i qw = _mm512_set1_epi32(q[static_cast<size_t>(r) * pairs + k]);
      const __m512bh qb = reinterpret_cast<const __m512bh&>(qw);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], kv[v], qb);
    }
  }
  StoreTile<NR, NV>(acc, n, scale, j0, n16, tile, row_max);
}

// LogitRows' walk over the tiles, kept apart so that the BF16 target stays off the float32
// path (which must run on AVX-512 CPUs without BF16).
template <int NR>
BKV_TARGET_BF16 void LogitRowsBf16(const int32_t* kt, int32_t n, int32_t n16, int32_t pairs,
                                   const int32_t* q, float scale, float* tile, float* row_max) {
  __m512 vmax[NR];
  for (int r = 0; r < NR; ++r) vmax[r] = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int32_t j0 = 0;
  for (; j0 + 64 <= n16; j0 += 64)
    LogitTileBf16<NR, 4>(kt, n, n16, pairs, q, scale, j0, tile, vmax);
  switch ((n16 - j0) / 16) {
    case 3:
      LogitTileBf16<NR, 3>(kt, n, n16, pairs, q, scale, j0, tile, vmax);
      break;
    case 2:
      LogitTileBf16<NR, 2>(kt, n, n16, pairs, q, scale, j0, tile, vmax);
      break;
    case 1:
      LogitTileBf16<NR, 1>(kt, n, n16, pairs, q, scale, j0, tile, vmax);
      break;
    default:
      break;
  }
  RowMaxes<NR>(vmax, row_max);
}

// MaxProbScoresAvx512 with the products in bfloat16 (d % 32 == 0: a key's pairs transpose in
// 16 x 16 tiles of words).
BKV_TARGET_BF16 void MaxProbScoresBf16(const float* keys, int32_t n, int32_t d,
                                       const float* queries, int32_t rows, float* out,
                                       ScoreScratch* scratch) {
  const int32_t n16 = (n + 15) / 16 * 16;
  const int32_t pairs = d / 2;
  std::vector<int32_t>& kw = scratch->key_pairs;
  kw.resize(static_cast<size_t>(n16) * pairs);
  for (int32_t j = 0; j < n; ++j) {
    PackPairs(keys + static_cast<size_t>(j) * d, d, kw.data() + static_cast<size_t>(j) * pairs);
  }
  std::fill(kw.begin() + static_cast<ptrdiff_t>(n) * pairs, kw.end(), 0);  // padding keys
  std::vector<int32_t>& kt = scratch->key_pairs_t;
  kt.resize(static_cast<size_t>(pairs) * n16);
  for (int32_t j0 = 0; j0 < n16; j0 += 16) {
    for (int32_t k0 = 0; k0 < pairs; k0 += 16) {
      // (The transpose moves 32-bit values whatever they hold.)
      internal::Transpose16x16(
          reinterpret_cast<const float*>(kw.data() + static_cast<size_t>(j0) * pairs + k0), pairs,
          reinterpret_cast<float*>(kt.data() + static_cast<size_t>(k0) * n16 + j0), n16);
    }
  }
  std::vector<int32_t>& qw = scratch->query_pairs;
  qw.resize(static_cast<size_t>(rows) * pairs);
  for (int32_t r = 0; r < rows; ++r) {
    PackPairs(queries + static_cast<size_t>(r) * d, d, qw.data() + static_cast<size_t>(r) * pairs);
  }
  const float scale = Base2Scale(d);
  FoldRowsInFours(
      rows, n, n16,
      [&](auto nr, int32_t r0, float* tile, float* row_max) {
        LogitRowsBf16<decltype(nr)::value>(kt.data(), n, n16, pairs,
                                           qw.data() + static_cast<size_t>(r0) * pairs, scale, tile,
                                           row_max);
      },
      out, scratch);
}
#endif

}  // namespace

const char* GqaReductionName(GqaReduction r) {
  switch (r) {
    case GqaReduction::kMaxLogits:
      return "max of logits over the group, then softmax";
    case GqaReduction::kMaxProbs:
      return "softmax per query head, then max over the group";
    case GqaReduction::kMeanProbs:
      return "softmax per query head, then mean over the group";
  }
  return "?";
}

const char* QueryReductionName(QueryReduction r) {
  switch (r) {
    case QueryReduction::kMax:
      return "max";
    case QueryReduction::kMean:
      return "mean";
    case QueryReduction::kSum:
      return "sum";
  }
  return "?";
}

const char* PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kNone:
      return "none";
    case Pooling::kMax:
      return "maxpool";
    case Pooling::kAvg:
      return "avgpool";
  }
  return "?";
}

OrderedHead::OrderedHead(const HeadKeys& head, int32_t head_dim)
    : num_tokens_(head.num_tokens),
      head_dim_(head_dim),
      keys_(head.keys),
      positions_(head.positions) {
  BKV_CHECK(num_tokens_ >= 0);
  if (std::is_sorted(head.positions, head.positions + num_tokens_)) return;
  PositionOrder(absl::MakeConstSpan(head.positions, num_tokens_), &order_);
  sorted_pos_.resize(num_tokens_);
  for (int32_t i = 0; i < num_tokens_; ++i) sorted_pos_[i] = head.positions[order_[i]];
  positions_ = sorted_pos_.data();
  if (head.keys == nullptr) return;  // positions only (planning for an external scorer)
  gathered_.resize(static_cast<size_t>(num_tokens_) * head_dim);
  for (int32_t i = 0; i < num_tokens_; ++i) {
    std::copy_n(head.keys + static_cast<size_t>(order_[i]) * head_dim, head_dim,
                gathered_.data() + static_cast<size_t>(i) * head_dim);
  }
  keys_ = gathered_.data();
}

void SoftmaxInPlace(float* x, int32_t n) {
  if (n <= 0) return;
  const float m = MaxOf(x, n);
  const float sum = ExpShiftSum(x, n, m);
  Scale(x, n, 1.0f / sum);
}

namespace internal {

bool HasBf16Conversion() {
#if defined(__x86_64__)
  return HasAvx512Bf16();
#else
  return false;
#endif
}

void ConvertToBf16WithTheCpu(const float* x, int32_t n, float* out) {
  BKV_CHECK(HasBf16Conversion() && n % 16 == 0);
#if defined(__x86_64__)
  std::vector<int32_t> words(n / 2);
  for (int32_t i = 0; i < n; i += 16) PackPairs(x + i, 16, words.data() + i / 2);
  for (int32_t i = 0; i < n; ++i) {
    const auto w = static_cast<uint32_t>(words[i / 2]);
    out[i] = std::bit_cast<float>(i % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
  }
#endif
}

}  // namespace internal

void AttentionScores(const float* keys, int32_t begin, int32_t end, int32_t head_dim,
                     const float* queries, int32_t num_queries, int32_t group_size,
                     const ScoreSpec& spec, float* out, ScoreScratch* scratch) {
  const int32_t n = end - begin;
  if (n <= 0) return;
  std::fill(out, out + n, 0.0f);
  if (num_queries <= 0) return;
  BKV_CHECK(group_size >= 1 && head_dim >= 1);
  const int32_t rows = num_queries * group_size;
  const bool max_probs = spec.query == QueryReduction::kMax &&
                         (group_size == 1 || spec.gqa == GqaReduction::kMaxProbs);
#if defined(__x86_64__)
  static const bool avx512 = HasAvx512();
  static const bool avx512_bf16 = HasAvx512Bf16();
  // The transposed keys are re-read once per four rows: past L2's reach, the blocked GEMM wins.
  constexpr size_t kFusedMaxKeyBytes = 256 << 10;
  const bool fused =
      max_probs && avx512 && static_cast<size_t>(n) * head_dim * sizeof(float) <= kFusedMaxKeyBytes;
  if (fused && spec.bf16 && avx512_bf16 && head_dim % 32 == 0) {
    MaxProbScoresBf16(keys + static_cast<size_t>(begin) * head_dim, n, head_dim, queries, rows, out,
                      scratch);
    return;
  }
#endif
  if (spec.bf16) {
    // Everywhere else the products of the rounded values: exact in float32 like vdpbf16ps's,
    // summed in another order, so within float32 rounding of the BF16 path.
    scratch->rounded_keys.resize(static_cast<size_t>(n) * head_dim);
    scratch->rounded_queries.resize(static_cast<size_t>(rows) * head_dim);
    std::transform(keys + static_cast<size_t>(begin) * head_dim,
                   keys + static_cast<size_t>(end) * head_dim, scratch->rounded_keys.begin(),
                   RoundToBf16);
    std::transform(queries, queries + static_cast<size_t>(rows) * head_dim,
                   scratch->rounded_queries.begin(), RoundToBf16);
    keys = scratch->rounded_keys.data();
    begin = 0;
    queries = scratch->rounded_queries.data();
  }
#if defined(__x86_64__)
  if (fused) {
    MaxProbScoresAvx512(keys + static_cast<size_t>(begin) * head_dim, n, head_dim, queries, rows,
                        out, scratch);
    return;
  }
#endif
  scratch->logits.resize(static_cast<size_t>(rows) * n);
  scratch->row.resize(n);
  float* logits = scratch->logits.data();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, head_dim,
              1.0f / std::sqrt(static_cast<float>(head_dim)), queries, head_dim,
              keys + static_cast<size_t>(begin) * head_dim, head_dim, 0.0f, logits, n);

  if (max_probs) {
    // max over every row of its softmax = exp(max over rows of (logit - logsumexp of the
    // row)): one exp per element for the normaliser, none stored, and n exps at the end.
    std::fill(out, out + n, -std::numeric_limits<float>::infinity());
    for (int32_t r = 0; r < rows; ++r) {
      const float* row = logits + static_cast<size_t>(r) * n;
      const float m = MaxOf(row, n);
      const float lse = m + std::log(ExpShiftSumOnly(row, n, m));
      MaxShiftedInto(out, row, n, lse);
    }
    ExpInPlace(out, n);
    return;
  }
  float* red = scratch->row.data();
  for (int32_t q = 0; q < num_queries; ++q) {
    float* first = logits + static_cast<size_t>(q) * group_size * n;
    const float* reduced = red;
    if (group_size == 1) {
      SoftmaxInPlace(first, n);
      reduced = first;
    } else if (spec.gqa == GqaReduction::kMaxLogits) {
      std::copy_n(first, n, red);
      for (int32_t h = 1; h < group_size; ++h) MaxInto(red, first + static_cast<size_t>(h) * n, n);
      SoftmaxInPlace(red, n);
    } else {
      for (int32_t h = 0; h < group_size; ++h)
        SoftmaxInPlace(first + static_cast<size_t>(h) * n, n);
      std::copy_n(first, n, red);
      for (int32_t h = 1; h < group_size; ++h) {
        if (spec.gqa == GqaReduction::kMaxProbs) {
          MaxInto(red, first + static_cast<size_t>(h) * n, n);
        } else {
          AddInto(red, first + static_cast<size_t>(h) * n, n);
        }
      }
      if (spec.gqa == GqaReduction::kMeanProbs) Scale(red, n, 1.0f / group_size);
    }
    if (spec.query == QueryReduction::kMax) {
      MaxInto(out, reduced, n);  // probabilities are >= 0, so the zero start is neutral
    } else {
      AddInto(out, reduced, n);
    }
  }
  if (spec.query == QueryReduction::kMean) Scale(out, n, 1.0f / num_queries);
}

void Pool1d(Pooling pooling, int32_t kernel, absl::Span<float> scores) {
  if (pooling == Pooling::kNone || kernel <= 1 || scores.empty()) return;
  BKV_CHECK(kernel % 2 == 1);
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t half = kernel / 2;
  std::vector<float> src(scores.begin(), scores.end());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - half);
    const int64_t hi = std::min<int64_t>(n - 1, i + half);
    if (pooling == Pooling::kMax) {
      float m = src[lo];
      for (int64_t j = lo + 1; j <= hi; ++j) m = std::max(m, src[j]);
      scores[i] = m;
    } else {
      float s = 0.0f;
      for (int64_t j = lo; j <= hi; ++j) s += src[j];
      scores[i] = s / static_cast<float>(kernel);
    }
  }
}

absl::Status ValidatePoolKernel(int32_t kernel, const char* policy) {
  if (kernel < 1 || kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pool_kernel must be odd and >= 1 (1 = no pooling), got %d", policy, kernel));
  }
  return absl::OkStatus();
}

}  // namespace beaconkv

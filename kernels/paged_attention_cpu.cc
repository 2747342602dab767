#include "kernels/paged_attention_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/multiversion.h"
#include "core/scoring.h"

namespace beaconkv::kernels {
namespace {

// q.k of every query head of a GQA group against m keys of one block: p[h * n + o] =
// scale * dot(qg[h], kb[o]). The explicit ISA paths keep a key's partial sums in one register
// and reduce it with a fixed shuffle tree (an auto-vectorised dot reduced its 16 lanes with 16
// serial scalar adds, the bulk of the decode attention's time).
using QkFn = void (*)(const float* qg, int32_t group, const float* kb, int32_t m, int64_t d,
                      float scale, float* p, int32_t n);

void QkPortable(const float* qg, int32_t group, const float* kb, int32_t m, int64_t d, float scale,
                float* p, int32_t n) {
  for (int32_t o = 0; o < m; ++o) {
    const float* kj = kb + o * d;
    for (int32_t h = 0; h < group; ++h) {
      const float* qh = qg + h * d;
      float acc = 0.0f;
      for (int64_t e = 0; e < d; ++e) acc += qh[e] * kj[e];
      p[int64_t{h} * n + o] = acc * scale;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) float Sum16(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
  return _mm_cvtss_f32(s4);
}

// d a multiple of 16.
__attribute__((target("avx512f"))) void QkAvx512(const float* qg, int32_t group, const float* kb,
                                                 int32_t m, int64_t d, float scale, float* p,
                                                 int32_t n) {
  for (int32_t o = 0; o < m; ++o) {
    const float* kj = kb + o * d;
    for (int32_t h = 0; h < group; ++h) {
      const float* qh = qg + h * d;
      __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qh), _mm512_loadu_ps(kj));
      for (int64_t e = 16; e < d; e += 16) {
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + e), _mm512_loadu_ps(kj + e), acc);
      }
      p[int64_t{h} * n + o] = Sum16(acc) * scale;
    }
  }
}

__attribute__((target("avx2,fma"))) float Sum8(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_shuffle_ps(s4, s4, 1));
  return _mm_cvtss_f32(s4);
}

// d a multiple of 8.
__attribute__((target("avx2,fma"))) void QkAvx2(const float* qg, int32_t group, const float* kb,
                                                int32_t m, int64_t d, float scale, float* p,
                                                int32_t n) {
  for (int32_t o = 0; o < m; ++o) {
    const float* kj = kb + o * d;
    for (int32_t h = 0; h < group; ++h) {
      const float* qh = qg + h * d;
      __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(qh), _mm256_loadu_ps(kj));
      for (int64_t e = 8; e < d; e += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(qh + e), _mm256_loadu_ps(kj + e), acc);
      }
      p[int64_t{h} * n + o] = Sum8(acc) * scale;
    }
  }
}
#endif

// The fastest path this machine runs for head size d.
QkFn PickQk(int64_t d) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (d <= 0) return QkPortable;
  if (d % 16 == 0 && __builtin_cpu_supports("avx512f")) return QkAvx512;
  if (d % 8 == 0 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return QkAvx2;
  }
#endif
  return QkPortable;
}

// One (row, kv head): every query head of the GQA group against the head's n slots, each key
// and value loaded once for the group. D > 0 fixes head_dim at compile time so the output
// accumulators stay in registers; D == 0 reads it from `d`. Every output element is summed
// over the slots in logical order whatever D, so the result does not depend on the block size.
template <int D>
[[gnu::always_inline]] inline void HeadAttention(const float* qg, int32_t group,
                                                 const float* k_cache, const float* v_cache,
                                                 const int32_t* table, int32_t n, int32_t bs,
                                                 int64_t d_runtime, float scale,
                                                 const float* bias,  // [n] or nullptr
                                                 float* p,           // [group, n] scratch
                                                 float* og,          // [group, d]
                                                 QkFn qk) {
  const int64_t d = D > 0 ? D : d_runtime;
  for (int32_t j0 = 0, bi = 0; j0 < n; j0 += bs, ++bi) {
    const float* kb = k_cache + int64_t{table[bi]} * bs * d;
    qk(qg, group, kb, std::min<int32_t>(bs, n - j0), d, scale, p + j0, n);
  }
  if (bias != nullptr) {
    for (int32_t h = 0; h < group; ++h)
      for (int32_t j = 0; j < n; ++j) p[int64_t{h} * n + j] += bias[j];
  }
  // The scoring pipeline's vectorised softmax: std::exp per element dominated the step.
  for (int32_t h = 0; h < group; ++h) SoftmaxInPlace(p + int64_t{h} * n, n);
  for (int32_t h = 0; h < group; ++h) {
    const float* ph = p + int64_t{h} * n;
    float acc[D > 0 ? D : 1];
    float* out = D > 0 ? acc : og + h * d;
    std::fill_n(out, d, 0.0f);
    for (int32_t j0 = 0, bi = 0; j0 < n; j0 += bs, ++bi) {
      const float* vb = v_cache + int64_t{table[bi]} * bs * d;
      const int32_t m = std::min<int32_t>(bs, n - j0);
      for (int32_t o = 0; o < m; ++o) {
        const float pj = ph[j0 + o];
        const float* vj = vb + o * d;
        for (int64_t e = 0; e < d; ++e) out[e] += pj * vj[e];
      }
    }
    if (D > 0) std::copy_n(acc, d, og + h * d);
  }
}

// One clone per ISA of each head size (the template inlines into each).
#define BKV_HEAD_ATTENTION(NAME, D)                                                             \
  BKV_MULTIVERSION void NAME(const float* qg, int32_t group, const float* k_cache,              \
                             const float* v_cache, const int32_t* table, int32_t n, int32_t bs, \
                             int64_t d, float scale, const float* bias, float* p, float* og,    \
                             QkFn qk) {                                                         \
    HeadAttention<D>(qg, group, k_cache, v_cache, table, n, bs, d, scale, bias, p, og, qk);     \
  }
BKV_HEAD_ATTENTION(HeadAttention32, 32)
BKV_HEAD_ATTENTION(HeadAttention64, 64)
BKV_HEAD_ATTENTION(HeadAttention128, 128)
BKV_HEAD_ATTENTION(HeadAttentionAny, 0)
#undef BKV_HEAD_ATTENTION

}  // namespace

bool PagedDecodeAttentionSplits(const int32_t* lengths, const PagedAttentionShape& s,
                                int num_threads) {
  if (num_threads <= 1) return false;
  int64_t work = 0;
  for (int64_t i = 0; i < int64_t{s.rows} * s.num_kv_heads; ++i) work += lengths[i];
  work *= int64_t{s.num_heads / s.num_kv_heads} * s.head_dim;
  return work >= (1 << 18);
}

int PagedDecodeAttentionCpu(const float* q, const float* k_cache, const float* v_cache,
                            const int32_t* block_tables, const int32_t* lengths,
                            const PagedAttentionShape& s, float scale, float* out, int num_threads,
                            const float* bias,
                            const std::function<void(int32_t row, int32_t kv_head)>* head_done) {
  const int64_t d = s.head_dim;
  const int32_t group = s.num_heads / s.num_kv_heads;
  auto* head_attention = d == 32    ? &HeadAttention32
                         : d == 64  ? &HeadAttention64
                         : d == 128 ? &HeadAttention128
                                    : &HeadAttentionAny;
  const QkFn qk = PickQk(d);
  const bool parallel = PagedDecodeAttentionSplits(lengths, s, num_threads);
  int threads = 1;
#pragma omp parallel num_threads(num_threads) if (parallel)
  {
#pragma omp single nowait
    threads = omp_get_num_threads();
#pragma omp for schedule(dynamic, 1) collapse(2) nowait
    for (int32_t b = 0; b < s.rows; ++b) {
      for (int32_t g = 0; g < s.num_kv_heads; ++g) {
        const int64_t head = int64_t{b} * s.num_kv_heads + g;
        const int32_t n = lengths[head];
        const int64_t first = (int64_t{b} * s.num_heads + int64_t{g} * group) * d;
        std::vector<float> p(static_cast<size_t>(group) * n);  // [group, n]
        const float* head_bias =
            bias != nullptr ? bias + head * s.max_blocks * int64_t{s.block_size} : nullptr;
        head_attention(q + first, group, k_cache, v_cache, block_tables + head * s.max_blocks, n,
                       s.block_size, d, scale, head_bias, p.data(), out + first, qk);
        if (head_done != nullptr) (*head_done)(b, g);
      }
    }
    if (head_done != nullptr) StreamFence();
  }
  return threads;
}

}  // namespace beaconkv::kernels

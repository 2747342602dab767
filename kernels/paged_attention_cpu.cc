#include "kernels/paged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/scoring.h"

namespace beaconkv::kernels {
namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

}  // namespace

void PagedDecodeAttentionCpu(const float* q, const float* k_cache, const float* v_cache,
                             const int32_t* block_tables, const int32_t* lengths,
                             const PagedAttentionShape& s, float scale, float* out,
                             int num_threads) {
  const int64_t d = s.head_dim, bs = s.block_size;
  const int32_t group = s.num_heads / s.num_kv_heads;
  int64_t work = 0;
  for (int64_t i = 0; i < int64_t{s.rows} * s.num_kv_heads; ++i) work += lengths[i];
  work *= int64_t{group} * d;
  const bool parallel = num_threads > 1 && work >= (1 << 18);
  // One task per (row, kv head): each key and value is loaded once for the whole GQA group.
#pragma omp parallel for num_threads(num_threads) if (parallel) schedule(dynamic, 1) collapse(2)
  for (int32_t b = 0; b < s.rows; ++b) {
    for (int32_t g = 0; g < s.num_kv_heads; ++g) {
      const int64_t head = int64_t{b} * s.num_kv_heads + g;
      const int32_t n = lengths[head];
      const int32_t* table = block_tables + head * s.max_blocks;
      const float* qg = q + (int64_t{b} * s.num_heads + int64_t{g} * group) * d;
      float* og = out + (int64_t{b} * s.num_heads + int64_t{g} * group) * d;
      std::vector<float> p(static_cast<size_t>(group) * n);  // [group, n]
      for (int32_t j0 = 0, bi = 0; j0 < n; j0 += s.block_size, ++bi) {
        const float* kb = k_cache + int64_t{table[bi]} * bs * d;
        const int32_t m = std::min<int32_t>(s.block_size, n - j0);
        for (int32_t o = 0; o < m; ++o)
          for (int32_t h = 0; h < group; ++h)
            p[int64_t{h} * n + j0 + o] = Dot(qg + h * d, kb + o * d, d) * scale;
      }
      // The scoring pipeline's vectorised softmax: std::exp per element dominated the step.
      for (int32_t h = 0; h < group; ++h) SoftmaxInPlace(p.data() + int64_t{h} * n, n);
      std::fill_n(og, int64_t{group} * d, 0.0f);
      for (int32_t j0 = 0, bi = 0; j0 < n; j0 += s.block_size, ++bi) {
        const float* vb = v_cache + int64_t{table[bi]} * bs * d;
        const int32_t m = std::min<int32_t>(s.block_size, n - j0);
        for (int32_t o = 0; o < m; ++o) {
          const float* vj = vb + o * d;
          for (int32_t h = 0; h < group; ++h) {
            const float pj = p[int64_t{h} * n + j0 + o];
            float* oh = og + h * d;
            for (int64_t e = 0; e < d; ++e) oh[e] += pj * vj[e];
          }
        }
      }
    }
  }
}

}  // namespace beaconkv::kernels

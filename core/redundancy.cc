#include "core/redundancy.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/scoring.h"

namespace beaconkv {
namespace {

// Largest j with s[j] > threshold, or -1. Scans 16-wide chunks from the end so the common
// case (a duplicate among the newest keys, or none at all) runs vectorised.
int32_t LastAbove(const float* s, int32_t n, float threshold) {
  constexpr int32_t kChunk = 16;
  int32_t end = n;
  while (end > 0) {
    const int32_t begin = std::max(0, end - kChunk);
    bool any = false;
    for (int32_t j = begin; j < end; ++j) any |= s[j] > threshold;
    if (any) {
      for (int32_t j = end - 1; j >= begin; --j) {
        if (s[j] > threshold) return j;
      }
    }
    end = begin;
  }
  return -1;
}

}  // namespace

void RedundancyScores(const float* keys, int32_t n, int32_t head_dim, float threshold, float* out) {
  if (n <= 0) return;
  std::vector<float> unit(static_cast<size_t>(n) * head_dim);  // [n, head_dim]
  for (int32_t i = 0; i < n; ++i) {
    const float* k = keys + static_cast<size_t>(i) * head_dim;
    double sq = 0.0;
    for (int32_t d = 0; d < head_dim; ++d) sq += static_cast<double>(k[d]) * k[d];
    const float inv = 1.0f / (static_cast<float>(std::sqrt(sq)) + 1e-8f);
    for (int32_t d = 0; d < head_dim; ++d) unit[static_cast<size_t>(i) * head_dim + d] = k[d] * inv;
  }
  // S is symmetric, so only its upper triangle (j > i) is computed, one block of rows at a
  // time: half the GEMM work of the full matrix. Column sums take each upper entry twice
  // (S_ij for column j, S_ji for column i); the entry each row zeroes is then subtracted.
  // Row i's newest duplicate is the largest j > i above the threshold, else the largest
  // j < i, which earlier rows recorded in last_below while scanning their upper parts.
  constexpr int32_t kRowBlock = 256;
  std::vector<float> block(static_cast<size_t>(std::min(n, kRowBlock)) * n);  // [rows, cols]
  std::vector<float> col_sum(n, 0.0f);
  std::vector<int32_t> last_below(n, -1);      // [n] largest j < i with S_ji > threshold
  std::vector<float> last_below_val(n, 0.0f);  // [n] that S_ji
  const std::vector<float> ones(n, 1.0f);
  const bool diagonal_matches = 0.0f > threshold;  // the zeroed diagonal itself qualifies
  for (int32_t r0 = 0; r0 < n; r0 += kRowBlock) {
    const int32_t rows = std::min(kRowBlock, n - r0);
    const int32_t cols = n - r0;  // columns r0 .. n-1
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, head_dim, 1.0f,
                unit.data() + static_cast<size_t>(r0) * head_dim, head_dim,
                unit.data() + static_cast<size_t>(r0) * head_dim, head_dim, 0.0f, block.data(),
                cols);
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t i = r0 + r;
      float* s = block.data() + static_cast<size_t>(r) * cols;
      std::fill(s, s + r + 1, 0.0f);   // j <= i: the diagonal and the mirrored lower part
      const float* upper = s + r + 1;  // S_ij for j = i+1 .. n-1
      const int32_t len = cols - r - 1;
      for (int32_t c = 0; c < len; ++c) {
        const bool above = upper[c] > threshold;
        last_below[i + 1 + c] = above ? i : last_below[i + 1 + c];
        last_below_val[i + 1 + c] = above ? upper[c] : last_below_val[i + 1 + c];
      }
      const int32_t c = LastAbove(upper, len, threshold);
      if (c >= 0) {
        col_sum[i + 1 + c] -= upper[c];
      } else if (!diagonal_matches && last_below[i] >= 0) {
        col_sum[last_below[i]] -= last_below_val[i];
      }
    }
    // col_sum[r0 + c] += sum_r block[r][c];  col_sum[r0 + r] += sum_c block[r][c]
    cblas_sgemv(CblasRowMajor, CblasTrans, rows, cols, 1.0f, block.data(), cols, ones.data(), 1,
                1.0f, col_sum.data() + r0, 1);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, block.data(), cols, ones.data(), 1,
                1.0f, col_sum.data() + r0, 1);
  }
  for (int32_t j = 0; j < n; ++j) out[j] = col_sum[j] / static_cast<float>(n);
  SoftmaxInPlace(out, n);
}

}  // namespace beaconkv

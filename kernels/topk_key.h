// The sort key and pooling window of the segmented top-k, shared by the CUDA kernels
// (segmented_topk.cu) and host tests, so the tie rule the device relies on is checked on the
// CPU against core's comparator (tests/cpp/kernel_twins_test.cc).
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define BKV_HOST_DEVICE __host__ __device__
#else
#define BKV_HOST_DEVICE
#endif

namespace beaconkv::kernels {

// Sort key of one element: the score's bits mapped to an unsigned integer that orders like
// the float, above the position. Sorting descending puts the best score first and, among
// equal scores, the larger position first (core's tie rule). -0.0 becomes +0.0 because the
// CPU compares scores with ==. Every non-NaN score maps to a key > 0, so key 0 marks
// protected elements (and padding): they sort after every candidate. position must be >= 0.
BKV_HOST_DEVICE inline uint64_t TopKSortKey(float score, int32_t position, uint8_t protect) {
  if (protect) return 0;
  const float canonical = score == 0.0f ? 0.0f : score;
  uint32_t bits;
  std::memcpy(&bits, &canonical, sizeof(bits));
  const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<uint64_t>(ordered) << 32) | static_cast<uint32_t>(position);
}

// core Pool1d at index r of `raw` ([n], position order): the window is clipped to [0, n);
// max pooling (kMax) or the window sum divided by the full kernel (count_include_pad). Same
// operation order as the CPU loop. (The device kernels keep the sum from contracting into
// FMA by having no multiply in it.)
BKV_HOST_DEVICE inline float PoolWindow(const float* raw, int32_t r, int32_t n, bool max_pool,
                                        int32_t kernel) {
  const int32_t half = kernel / 2;
  const int32_t lo = r - half < 0 ? 0 : r - half;
  const int32_t hi = r + half > n - 1 ? n - 1 : r + half;
  if (max_pool) {
    float m = raw[lo];
    for (int32_t j = lo + 1; j <= hi; ++j) m = m < raw[j] ? raw[j] : m;
    return m;
  }
  float s = 0.0f;
  for (int32_t j = lo; j <= hi; ++j) s += raw[j];
  return s / static_cast<float>(kernel);
}

// R-KV's final score: lambda * pooled importance - (1 - lambda) * redundancy, rounded as the
// CPU policy computes it (two products, then the difference; no fused multiply-add).
BKV_HOST_DEVICE inline float PenalisedScore(float pooled, float penalty, float lambda) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(__fmul_rn(lambda, pooled), __fmul_rn(__fsub_rn(1.0f, lambda), penalty));
#else
  return lambda * pooled - (1.0f - lambda) * penalty;
#endif
}

}  // namespace beaconkv::kernels

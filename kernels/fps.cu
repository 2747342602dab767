#include <algorithm>
#include <climits>
#include <cub/block/block_reduce.cuh>

#include "kernels/fps.h"

namespace beaconkv::kernels {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxPoints = 4096;
constexpr int kMaxDim = 256;
constexpr int kCpuBlock = 64;            // core's FPS sums the mean direction 64 points at a time
constexpr float kQuantScale = 16384.0f;  // unit vectors quantised to round(u * 2^14)
constexpr int32_t kUnitDot = int32_t{1} << 28;  // q . q of a unit vector
constexpr int32_t kChosen = INT32_MIN;          // below every distance
constexpr int32_t kFar = INT32_MAX;             // before the first pick

// A candidate pick: larger distance wins, ties go to the earlier point (core's rule).
struct Candidate {
  int32_t dist;
  int32_t index;
};

struct Farther {
  __device__ Candidate operator()(const Candidate& a, const Candidate& b) const {
    return (a.dist > b.dist || (a.dist == b.dist && a.index < b.index)) ? a : b;
  }
};

// 2^28 - q_i . v: core's distance, an exact integer dot product of the quantised unit vectors.
__device__ int32_t Distance(const int16_t* quant, int32_t stride, int32_t i, const int32_t* v,
                            int32_t dim) {
  int32_t acc = 0;
  for (int32_t d = 0; d < dim; ++d) acc += int32_t{quant[int64_t{d} * stride + i]} * v[d];
  return kUnitDot - acc;
}

// core's Quantise: a non-finite component (a NaN or infinite row, or one whose norm is below
// 1 / FLT_MAX) is 0; __float2int_rn would saturate +inf to INT_MAX, whose low half is -1.
__device__ int32_t Quantise(float u) {
  return isfinite(u) ? __float2int_rn(__fmul_rn(u, kQuantScale)) : 0;
}

// One thread block per buffer. Unit vectors (float, for the mean) and their quantised form go
// to scratch transposed ([dim][max_points], so a pass reads them coalesced); the smallest
// distance to the chosen points lives in shared memory; each pick is one pass plus a
// block-wide arg-max. Double sums use __dadd_rn / __dmul_rn so nvcc cannot contract them into
// FMAs the CPU does not do.
__global__ void __launch_bounds__(kThreads)
    FpsKernel(const float* __restrict__ points, const int32_t* __restrict__ n_of,
              const int32_t* __restrict__ count_of, int32_t max_points, int32_t dim,
              int32_t max_count, float* __restrict__ unit_all, int16_t* __restrict__ quant_all,
              int32_t* __restrict__ order) {
  using Reduce = cub::BlockReduce<Candidate, kThreads>;
  __shared__ typename Reduce::TempStorage reduce_storage;
  __shared__ double sum[kMaxDim];
  __shared__ int32_t v[kMaxDim];
  __shared__ double root;
  __shared__ int32_t pick;
  extern __shared__ int32_t min_dist[];  // [max_points]

  const int32_t s = blockIdx.x, tid = threadIdx.x;
  const int32_t n = n_of[s], count = count_of[s];
  int32_t* out = order + int64_t{s} * max_count;
  if (n < 0 || n > max_points || count < 0 || count > n || count > max_count) {
    for (int32_t i = tid; i < max_count; i += kThreads) out[i] = -2;
    return;
  }
  for (int32_t i = tid; i < max_count; i += kThreads) out[i] = -1;
  if (count == 0) return;
  const float* p = points + int64_t{s} * max_points * dim;
  float* unit = unit_all + int64_t{s} * max_points * dim;
  int16_t* quant = quant_all + int64_t{s} * max_points * dim;

  // Unit vectors: squared norm in double from four interleaved partial sums, as core packs.
  for (int32_t i = tid; i < n; i += kThreads) {
    const float* row = p + int64_t{i} * dim;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int32_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      s0 = __dadd_rn(s0, __dmul_rn(row[d], row[d]));
      s1 = __dadd_rn(s1, __dmul_rn(row[d + 1], row[d + 1]));
      s2 = __dadd_rn(s2, __dmul_rn(row[d + 2], row[d + 2]));
      s3 = __dadd_rn(s3, __dmul_rn(row[d + 3], row[d + 3]));
    }
    for (; d < dim; ++d) s0 = __dadd_rn(s0, __dmul_rn(row[d], row[d]));
    const double sq = __dadd_rn(__dadd_rn(s0, s1), __dadd_rn(s2, s3));
    const float inv = sq > 0.0 ? __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(sq))) : 0.0f;
    for (d = 0; d < dim; ++d) {
      const float u = __fmul_rn(row[d], inv);
      unit[int64_t{d} * max_points + i] = u;
      quant[int64_t{d} * max_points + i] = static_cast<int16_t>(Quantise(u));
    }
  }
  __syncthreads();

  // Seed direction: the mean of the unit vectors, summed per 64 points and then across, in
  // point order (core's order of double additions).
  for (int32_t d = tid; d < dim; d += kThreads) {
    const float* col = unit + int64_t{d} * max_points;
    double total = 0.0;
    for (int32_t b = 0; b < n; b += kCpuBlock) {
      double part = 0.0;
      for (int32_t i = b; i < min(n, b + kCpuBlock); ++i) part = __dadd_rn(part, col[i]);
      total = __dadd_rn(total, part);
    }
    sum[d] = total;
  }
  __syncthreads();
  if (tid == 0) {
    double sq = 0.0;
    for (int32_t d = 0; d < dim; ++d) sq = __dadd_rn(sq, __dmul_rn(sum[d], sum[d]));
    root = sq > 0.0 ? __dsqrt_rn(sq) : 0.0;
  }
  __syncthreads();
  for (int32_t d = tid; d < dim; d += kThreads) {
    v[d] = root > 0.0 ? Quantise(__double2float_rn(__ddiv_rn(sum[d], root))) : 0;
  }
  __syncthreads();

  // Seed pick: the point farthest from the mean direction (distances start at kFar).
  Candidate best{kChosen, 0x7fffffff};
  for (int32_t i = tid; i < n; i += kThreads) {
    const Candidate c{min(kFar, Distance(quant, max_points, i, v, dim)), i};
    best = Farther()(best, c);
    min_dist[i] = kFar;
  }
  best = Reduce(reduce_storage).Reduce(best, Farther());
  if (tid == 0) pick = best.index;
  __syncthreads();

  for (int32_t k = 0;; ++k) {
    const int32_t chosen = pick;
    for (int32_t d = tid; d < dim; d += kThreads) v[d] = quant[int64_t{d} * max_points + chosen];
    if (tid == 0) {
      out[k] = chosen;
      min_dist[chosen] = kChosen;
    }
    __syncthreads();
    if (k + 1 == count) break;
    best = Candidate{kChosen, 0x7fffffff};
    for (int32_t i = tid; i < n; i += kThreads) {
      if (min_dist[i] == kChosen) continue;
      const int32_t m = min(min_dist[i], Distance(quant, max_points, i, v, dim));
      min_dist[i] = m;
      best = Farther()(best, Candidate{m, i});
    }
    __syncthreads();  // reduce_storage is reused
    best = Reduce(reduce_storage).Reduce(best, Farther());
    if (tid == 0) pick = best.index;
    __syncthreads();
  }
}

bool ValidShape(const FpsShape& s) {
  return s.num_segments >= 0 && s.max_points >= 0 && s.max_points <= kMaxPoints && s.dim >= 1 &&
         s.dim <= kMaxDim && s.max_count >= 0;
}

}  // namespace

size_t FarthestPointScratchBytes(const FpsShape& shape) {
  if (!ValidShape(shape)) return 0;
  // The float unit vectors, then their quantised copies.
  return static_cast<size_t>(shape.num_segments) * shape.max_points * shape.dim *
         (sizeof(float) + sizeof(int16_t));
}

cudaError_t FarthestPointOrder(const float* points, const int32_t* n, const int32_t* count,
                               const FpsShape& shape, void* scratch, int32_t* order,
                               cudaStream_t stream) {
  if (!ValidShape(shape)) return cudaErrorInvalidValue;
  if (shape.num_segments == 0 || shape.max_count == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(std::max(shape.max_points, 1)) * sizeof(int32_t);
  auto* unit = static_cast<float*>(scratch);
  auto* quant = reinterpret_cast<int16_t*>(unit + static_cast<size_t>(shape.num_segments) *
                                                      shape.max_points * shape.dim);
  FpsKernel<<<shape.num_segments, kThreads, smem, stream>>>(
      points, n, count, shape.max_points, shape.dim, shape.max_count, unit, quant, order);
  return cudaGetLastError();
}

}  // namespace beaconkv::kernels

#include <cfloat>
#include <cmath>

#include "kernels/kv_dtype_device.cuh"
#include "kernels/redundancy.h"

namespace beaconkv::kernels {
namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;
size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

__device__ float Dot(const float* __restrict__ a, const float* __restrict__ b, int32_t d) {
  float s = 0.0f;
  for (int32_t e = 0; e < d; ++e) s = fmaf(a[e], b[e], s);
  return s;
}

// Block-wide max (is_max) or sum of v; every thread gets the result.
__device__ float BlockReduce(float v, bool is_max, float* shared /* [kThreads / 32] */) {
  for (int off = 16; off > 0; off /= 2) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // shared is free (an earlier call may still be reading it)
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = shared[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
  return r;
}

// One thread block per head; unit keys, duplicates and column sums live in the workspace.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    RedundancyKernel(const T* __restrict__ k_cache,              // [num_blocks, bs, head_dim]
                     const int32_t* __restrict__ block_tables,   // [num_tables, max_blocks]
                     const int32_t* __restrict__ lengths,        // [num_tables]
                     const int32_t* __restrict__ table_of_head,  // [num_heads]
                     const int32_t* __restrict__ positions,      // [num_items] slot order
                     const int32_t* __restrict__ score_offsets,  // [num_heads + 1]
                     RedundancyShape shape,
                     float* __restrict__ unit,   // [num_items, head_dim] scratch
                     int32_t* __restrict__ dup,  // [num_items] scratch
                     float* __restrict__ out) {  // [num_items]
  __shared__ float reduce[kThreads / 32];
  const int h = blockIdx.x;
  const int32_t t = table_of_head[h];
  const int32_t n = lengths[t];
  const int32_t begin = score_offsets[h];
  const int32_t d = shape.head_dim;
  const int32_t* table = block_tables + int64_t{t} * shape.max_blocks;
  const int32_t* pos = positions + begin;
  float* u = unit + int64_t{begin} * d;
  // Unit keys: k / (|k| + 1e-8), the norm summed in double as on the CPU.
  for (int32_t j = threadIdx.x; j < n; j += kThreads) {
    const int64_t slot =
        int64_t{table[j / shape.block_size]} * shape.block_size + j % shape.block_size;
    const T* k = k_cache + slot * d;
    double sq = 0.0;
    for (int32_t e = 0; e < d; ++e) {
      const double x = ToFloat(k[e]);
      sq += x * x;
    }
    const float inv = 1.0f / (static_cast<float>(sqrt(sq)) + 1e-8f);
    for (int32_t e = 0; e < d; ++e) u[int64_t{j} * d + e] = ToFloat(k[e]) * inv;
  }
  __syncthreads();
  // Each row's newest near-duplicate (the zeroed diagonal counts, as on the CPU).
  for (int32_t i = threadIdx.x; i < n; i += kThreads) {
    int32_t best = -1, best_pos = -1;
    for (int32_t j = 0; j < n; ++j) {
      const float s = j == i ? 0.0f : Dot(u + int64_t{i} * d, u + int64_t{j} * d, d);
      if (s > shape.threshold && pos[j] > best_pos) {
        best = j;
        best_pos = pos[j];
      }
    }
    dup[begin + i] = best;
  }
  __syncthreads();
  // Column means of the cosines, leaving out the diagonal and each row's duplicate.
  float col_max = -FLT_MAX;
  for (int32_t j = threadIdx.x; j < n; j += kThreads) {
    float sum = 0.0f;
    for (int32_t i = 0; i < n; ++i) {
      if (i == j || dup[begin + i] == j) continue;
      sum += Dot(u + int64_t{i} * d, u + int64_t{j} * d, d);
    }
    const float mean = sum / static_cast<float>(n);
    out[begin + j] = mean;
    col_max = fmaxf(col_max, mean);
  }
  // Softmax over the head's columns (each thread rereads only its own columns).
  const float m = BlockReduce(col_max, true, reduce);
  float part = 0.0f;
  for (int32_t j = threadIdx.x; j < n; j += kThreads) part += expf(out[begin + j] - m);
  const float inv_sum = 1.0f / BlockReduce(part, false, reduce);
  for (int32_t j = threadIdx.x; j < n; j += kThreads) {
    out[begin + j] = expf(out[begin + j] - m) * inv_sum;
  }
}

}  // namespace

cudaError_t PagedRedundancyScores(void* workspace, size_t* workspace_bytes, const void* k_cache,
                                  KvDtype dtype, const int32_t* block_tables,
                                  const int32_t* lengths, const int32_t* table_of_head,
                                  const int32_t* positions, const int32_t* score_offsets,
                                  int32_t num_items, const RedundancyShape& s, float* out,
                                  cudaStream_t stream) {
  if (workspace_bytes == nullptr || s.num_heads < 0 || s.head_dim < 1 || s.block_size < 1 ||
      s.max_blocks < 0 || num_items < 0 || !ValidKvDtype(dtype)) {
    return cudaErrorInvalidValue;
  }
  const size_t unit_bytes = AlignUp(static_cast<size_t>(num_items) * s.head_dim * sizeof(float));
  const size_t need = unit_bytes + AlignUp(static_cast<size_t>(num_items) * sizeof(int32_t));
  if (workspace == nullptr) {
    *workspace_bytes = need < 16 ? 16 : need;
    return cudaSuccess;
  }
  if (*workspace_bytes < need) return cudaErrorInvalidValue;
  if (s.num_heads == 0) return cudaSuccess;
  auto* unit = static_cast<float*>(workspace);
  auto* dup = reinterpret_cast<int32_t*>(static_cast<char*>(workspace) + unit_bytes);
  // DISPATCH: storage type -> template argument.
  return DispatchKvDtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    RedundancyKernel<T><<<s.num_heads, kThreads, 0, stream>>>(
        static_cast<const T*>(k_cache), block_tables, lengths, table_of_head, positions,
        score_offsets, s, unit, dup, out);
    return cudaGetLastError();
  });
}

}  // namespace beaconkv::kernels

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/compaction_moves.h"
#include "kernels/kv_dtype_device.cuh"

namespace beaconkv::kernels {
namespace {

constexpr int kThreads = 256;

// One thread block per segment. Pass 1 counts the kept tokens (k). Pass 2 walks the segment
// in tiles with one exclusive scan of v_i = (i < k ? !keep_i : keep_i): a hole at i < k has
// rank P(i) among the holes, a survivor at i >= k has rank P(i) - H among the survivors,
// H = P(k) being the number of holes; the r-th survivor fills the r-th hole. So hole rank r
// is written by the thread holding the hole and survivor rank r by the thread holding the
// survivor: from_slot[r] and to_slot[r] come from different threads, which is fine.
__global__ void __launch_bounds__(kThreads)
    CompactionMovesKernel(const int32_t* __restrict__ offsets,           // [num_segments + 1]
                          const uint8_t* __restrict__ keep,              // [num_items]
                          const int32_t* __restrict__ table_of_segment,  // [num_segments]
                          const int32_t* __restrict__ block_tables,      // [num_tables, max_blocks]
                          CompactionShape s,
                          int32_t* __restrict__ from_slot,      // [num_items]
                          int32_t* __restrict__ to_slot,        // [num_items]
                          int32_t* __restrict__ num_moves,      // [num_segments]
                          int32_t* __restrict__ new_lengths) {  // [num_segments]
  using Reduce = cub::BlockReduce<int32_t, kThreads>;
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } temp;
  __shared__ int32_t shared_k, holes, carry;
  const int seg = blockIdx.x;
  const int32_t begin = offsets[seg], n = offsets[seg + 1] - begin;
  const int32_t* table = block_tables + int64_t{table_of_segment[seg]} * s.max_blocks;

  int32_t count = 0;
  for (int32_t i = threadIdx.x; i < n; i += kThreads) count += keep[begin + i] ? 1 : 0;
  const int32_t k_total = Reduce(temp.reduce).Sum(count);
  if (threadIdx.x == 0) {
    shared_k = k_total;
    holes = 0;  // stays 0 when k == n (nothing evicted)
    carry = 0;
  }
  __syncthreads();
  const int32_t k = shared_k;

  for (int32_t base = 0; base < n; base += kThreads) {
    const int32_t i = base + threadIdx.x;
    const bool in = i < n;
    const bool kept = in && keep[begin + i];
    const int32_t v = in && (i < k ? !kept : kept) ? 1 : 0;
    int32_t prefix, tile_total;
    Scan(temp.scan).ExclusiveSum(v, prefix, tile_total);
    prefix += carry;
    if (i == k) holes = prefix;  // P(k)
    __syncthreads();             // holes and carry read below; temp reused next tile
    if (v) {
      const int32_t slot = table[i / s.block_size] * s.block_size + i % s.block_size;
      if (i < k) {
        to_slot[begin + prefix] = slot;
      } else {
        from_slot[begin + prefix - holes] = slot;
      }
    }
    __syncthreads();  // everyone has read carry
    if (threadIdx.x == 0) carry += tile_total;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    num_moves[seg] = holes;
    new_lengths[seg] = k;
  }
}

// One thread block per segment; warps take its moves, lanes stride over head_dim (T: an
// unsigned type of the element's size).
template <typename T>
__global__ void ApplyMovesKernel(const int32_t* __restrict__ offsets,    // [num_segments + 1]
                                 const int32_t* __restrict__ from_slot,  // [num_items]
                                 const int32_t* __restrict__ to_slot,    // [num_items]
                                 const int32_t* __restrict__ num_moves,  // [num_segments]
                                 T* __restrict__ keys,             // [num_blocks, bs, head_dim]
                                 T* __restrict__ values,           // [num_blocks, bs, head_dim]
                                 int32_t* __restrict__ positions,  // [num_blocks, bs]
                                 int32_t head_dim) {
  const int32_t begin = offsets[blockIdx.x], moves = num_moves[blockIdx.x];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int32_t m = warp; m < moves; m += warps) {
    const int64_t f = from_slot[begin + m], t = to_slot[begin + m];
    for (int32_t i = lane; i < head_dim; i += 32) {
      keys[t * head_dim + i] = keys[f * head_dim + i];
      values[t * head_dim + i] = values[f * head_dim + i];
    }
    if (lane == 0) positions[t] = positions[f];
  }
}

}  // namespace

cudaError_t CompactionMoves(const int32_t* offsets, const uint8_t* keep,
                            const int32_t* table_of_segment, const int32_t* block_tables,
                            const CompactionShape& s, int32_t* from_slot, int32_t* to_slot,
                            int32_t* num_moves, int32_t* new_lengths, cudaStream_t stream) {
  if (s.num_segments < 0 || s.num_items < 0 || s.block_size < 1 || s.max_blocks < 0) {
    return cudaErrorInvalidValue;
  }
  if (s.num_segments == 0) return cudaSuccess;
  CompactionMovesKernel<<<s.num_segments, kThreads, 0, stream>>>(
      offsets, keep, table_of_segment, block_tables, s, from_slot, to_slot, num_moves, new_lengths);
  return cudaGetLastError();
}

cudaError_t ApplyCompactionMoves(const int32_t* offsets, const int32_t* from_slot,
                                 const int32_t* to_slot, const int32_t* num_moves,
                                 int32_t num_segments, void* keys, void* values, KvDtype dtype,
                                 int32_t* positions, int32_t head_dim, cudaStream_t stream) {
  if (num_segments < 0 || head_dim < 1 || !ValidKvDtype(dtype)) return cudaErrorInvalidValue;
  if (num_segments == 0) return cudaSuccess;
  // DISPATCH: element size -> template argument.
  return DispatchKvBits(dtype, [&](auto zero) {
    using T = decltype(zero);
    ApplyMovesKernel<T><<<num_segments, 128, 0, stream>>>(
        offsets, from_slot, to_slot, num_moves, static_cast<T*>(keys), static_cast<T*>(values),
        positions, head_dim);
    return cudaGetLastError();
  });
}

}  // namespace beaconkv::kernels

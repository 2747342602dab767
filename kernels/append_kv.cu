#include "kernels/append_kv.h"
#include "kernels/kv_dtype_device.cuh"

namespace beaconkv::kernels {
namespace {

constexpr int kWarpsPerBlock = 4;

// One warp per row; lanes stride over head_dim.
template <typename T>
__global__ void AppendKvKernel(const float* __restrict__ new_k,            // [rows, head_dim]
                               const float* __restrict__ new_v,            // [rows, head_dim]
                               const int32_t* __restrict__ new_positions,  // [rows]
                               const int32_t* __restrict__ table_of_row,   // [rows]
                               const int32_t* __restrict__ block_tables,   // [tables, max_blocks]
                               const int32_t* __restrict__ lengths,        // [tables]
                               AppendShape s,
                               T* __restrict__ k_cache,            // [num_blocks, bs, head_dim]
                               T* __restrict__ v_cache,            // [num_blocks, bs, head_dim]
                               int32_t* __restrict__ positions) {  // [num_blocks, bs]
  const int32_t r = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= s.rows) return;
  const int32_t t = table_of_row[r];
  const int32_t j = lengths[t];
  const int64_t slot =
      int64_t{block_tables[int64_t{t} * s.max_blocks + j / s.block_size]} * s.block_size +
      j % s.block_size;
  const int64_t d = s.head_dim;
  for (int64_t i = lane; i < d; i += 32) {
    k_cache[slot * d + i] = FromFloat<T>(new_k[r * d + i]);
    v_cache[slot * d + i] = FromFloat<T>(new_v[r * d + i]);
  }
  if (lane == 0) positions[slot] = new_positions[r];
}

}  // namespace

cudaError_t AppendKv(const float* new_k, const float* new_v, const int32_t* new_positions,
                     const int32_t* table_of_row, const int32_t* block_tables,
                     const int32_t* lengths, const AppendShape& s, void* k_cache, void* v_cache,
                     KvDtype dtype, int32_t* positions, cudaStream_t stream) {
  if (s.rows < 0 || s.head_dim < 1 || s.block_size < 1 || s.max_blocks < 1 ||
      !ValidKvDtype(dtype)) {
    return cudaErrorInvalidValue;
  }
  if (s.rows == 0) return cudaSuccess;
  const int blocks = (s.rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // DISPATCH: storage type -> template argument.
  return DispatchKvDtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    AppendKvKernel<T><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
        new_k, new_v, new_positions, table_of_row, block_tables, lengths, s,
        static_cast<T*>(k_cache), static_cast<T*>(v_cache), positions);
    return cudaGetLastError();
  });
}

}  // namespace beaconkv::kernels

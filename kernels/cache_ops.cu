#include "kernels/cache_ops.h"
#include "kernels/kv_dtype_device.cuh"

namespace beaconkv::kernels {
namespace {

// One thread block per copied block; threads stride over its block_size * head_dim elements
// (T: an unsigned type of the element's size).
template <typename T>
__global__ void CopyBlocksKernel(const int32_t* __restrict__ src, const int32_t* __restrict__ dst,
                                 T* __restrict__ keys, T* __restrict__ values,
                                 int32_t* __restrict__ positions, int32_t block_size,
                                 int32_t head_dim) {
  const int64_t elems = static_cast<int64_t>(block_size) * head_dim;
  const int64_t s = src[blockIdx.x] * elems, d = dst[blockIdx.x] * elems;
  for (int64_t i = threadIdx.x; i < elems; i += blockDim.x) {
    keys[d + i] = keys[s + i];
    values[d + i] = values[s + i];
  }
  for (int32_t i = threadIdx.x; i < block_size; i += blockDim.x) {
    positions[static_cast<int64_t>(dst[blockIdx.x]) * block_size + i] =
        positions[static_cast<int64_t>(src[blockIdx.x]) * block_size + i];
  }
}

// One warp per move; lanes stride over head_dim.
template <typename T>
__global__ void MoveSlotsKernel(const int32_t* __restrict__ from_slot,
                                const int32_t* __restrict__ to_slot, int32_t num_moves,
                                T* __restrict__ keys, T* __restrict__ values,
                                int32_t* __restrict__ positions, int32_t head_dim) {
  const int32_t move = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int32_t lane = threadIdx.x % 32;
  if (move >= num_moves) return;
  const int64_t f = from_slot[move], t = to_slot[move];
  for (int32_t i = lane; i < head_dim; i += 32) {
    keys[t * head_dim + i] = keys[f * head_dim + i];
    values[t * head_dim + i] = values[f * head_dim + i];
  }
  if (lane == 0) positions[t] = positions[f];
}

}  // namespace

cudaError_t CopyBlocks(const int32_t* src, const int32_t* dst, int32_t num_copies, void* keys,
                       void* values, KvDtype dtype, int32_t* positions, int32_t block_size,
                       int32_t head_dim, cudaStream_t stream) {
  if (num_copies < 0 || block_size < 1 || head_dim < 1 || !ValidKvDtype(dtype)) {
    return cudaErrorInvalidValue;
  }
  if (num_copies == 0) return cudaSuccess;
  // DISPATCH: element size -> template argument.
  return DispatchKvBits(dtype, [&](auto zero) {
    using T = decltype(zero);
    CopyBlocksKernel<T><<<num_copies, 256, 0, stream>>>(
        src, dst, static_cast<T*>(keys), static_cast<T*>(values), positions, block_size, head_dim);
    return cudaGetLastError();
  });
}

cudaError_t MoveSlots(const int32_t* from_slot, const int32_t* to_slot, int32_t num_moves,
                      void* keys, void* values, KvDtype dtype, int32_t* positions, int32_t head_dim,
                      cudaStream_t stream) {
  if (num_moves < 0 || head_dim < 1 || !ValidKvDtype(dtype)) return cudaErrorInvalidValue;
  if (num_moves == 0) return cudaSuccess;
  constexpr int kWarpsPerBlock = 8;
  const int grid = (num_moves + kWarpsPerBlock - 1) / kWarpsPerBlock;
  // DISPATCH: element size -> template argument.
  return DispatchKvBits(dtype, [&](auto zero) {
    using T = decltype(zero);
    MoveSlotsKernel<T><<<grid, kWarpsPerBlock * 32, 0, stream>>>(
        from_slot, to_slot, num_moves, static_cast<T*>(keys), static_cast<T*>(values), positions,
        head_dim);
    return cudaGetLastError();
  });
}

}  // namespace beaconkv::kernels

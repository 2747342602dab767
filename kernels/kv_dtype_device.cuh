// Device-side conversions between a cache's storage type and float (kv_dtype.h), and the
// dispatch from the runtime KvDtype to a storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_dtype.h"

namespace beaconkv::kernels {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// Calls f(T{}) with T the storage type of `dtype`; cudaErrorInvalidValue for an unknown one.
template <typename F>
cudaError_t DispatchKvDtype(KvDtype dtype, F&& f) {
  switch (dtype) {
    case KvDtype::kFloat32:
      return f(float{});
    case KvDtype::kBFloat16:
      return f(__nv_bfloat16{});
    case KvDtype::kFloat16:
      return f(__half{});
  }
  return cudaErrorInvalidValue;
}

// Calls f(T{}) with an unsigned integer type of the element's size (data movement copies
// bits); cudaErrorInvalidValue for an unknown dtype.
template <typename F>
cudaError_t DispatchKvBits(KvDtype dtype, F&& f) {
  if (!ValidKvDtype(dtype)) return cudaErrorInvalidValue;
  return KvDtypeBytes(dtype) == 4 ? f(uint32_t{}) : f(uint16_t{});
}

}  // namespace beaconkv::kernels

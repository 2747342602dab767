// Helpers shared by the GPU tests.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_dtype.h"

namespace beaconkv::gpu_test {

using kernels::KvDtype;

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// A device copy of `v` (one spare byte so that empty vectors still get a pointer).
template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, v.size() * sizeof(T) + 1), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

template <typename T>
std::vector<T> ToHost(const T* p, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Rounds x to the storage type in place (nearest even); returns the stored bytes.
inline std::vector<uint8_t> Store(std::vector<float>& x, KvDtype dtype) {
  std::vector<uint8_t> bytes;
  auto put = [&](const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  };
  for (float& v : x) {
    if (dtype == KvDtype::kFloat32) {
      put(&v, 4);
    } else if (dtype == KvDtype::kBFloat16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      v = __bfloat162float(h);
      put(&h, 2);
    } else {
      const __half h = __float2half_rn(v);
      v = __half2float(h);
      put(&h, 2);
    }
  }
  return bytes;
}

// Stored bytes back to floats.
inline std::vector<float> Load(const std::vector<uint8_t>& bytes, KvDtype dtype) {
  const size_t n = bytes.size() / kernels::KvDtypeBytes(dtype);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == KvDtype::kFloat32) {
      std::memcpy(&x[i], &bytes[i * 4], 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, &bytes[i * 2], 2);
      if (dtype == KvDtype::kBFloat16) {
        __nv_bfloat16_raw raw;
        raw.x = bits;
        x[i] = __bfloat162float(__nv_bfloat16(raw));
      } else {
        __half_raw raw;
        raw.x = bits;
        x[i] = __half2float(__half(raw));
      }
    }
  }
  return x;
}

// Block tables for heads of the given lengths: distinct blocks 1.. (block 0 unused), shuffled.
struct PagedTables {
  int32_t max_blocks = 0;       // row stride of tables
  int32_t num_blocks = 1;       // blocks a cache needs, block 0 included
  std::vector<int32_t> tables;  // [lengths.size(), max(max_blocks, 1)], unused entries 0
};

inline PagedTables MakePagedTables(const std::vector<int32_t>& lengths, int32_t block_size,
                                   std::mt19937& rng) {
  PagedTables p;
  for (int32_t n : lengths) {
    p.max_blocks = std::max(p.max_blocks, (n + block_size - 1) / block_size);
    p.num_blocks += (n + block_size - 1) / block_size;
  }
  std::vector<int32_t> ids(p.num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.tables.assign(lengths.size() * std::max(p.max_blocks, 1), 0);
  for (size_t t = 0, next = 0; t < lengths.size(); ++t) {
    for (int32_t b = 0; b < (lengths[t] + block_size - 1) / block_size; ++b) {
      p.tables[t * p.max_blocks + b] = ids[next++];
    }
  }
  return p;
}

// Device memory freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p_, bytes + 1), cudaSuccess); }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& v) : p_(ToDevice(v)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(p_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

}  // namespace beaconkv::gpu_test

// Helpers shared by the GPU tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <vector>

namespace beaconkv::gpu_test {

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

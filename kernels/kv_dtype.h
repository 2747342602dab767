// How a device KV cache stores its keys and values. fp32 math everywhere: 16-bit caches are
// read into floats and written with round-to-nearest-even. Host code only (no CUDA headers).
#pragma once

#include <cstdint>

namespace beaconkv::kernels {

enum class KvDtype : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

constexpr bool ValidKvDtype(KvDtype d) {
  return d == KvDtype::kFloat32 || d == KvDtype::kBFloat16 || d == KvDtype::kFloat16;
}

// Bytes of one stored element.
constexpr int32_t KvDtypeBytes(KvDtype d) { return d == KvDtype::kFloat32 ? 4 : 2; }

constexpr const char* KvDtypeName(KvDtype d) {
  return d == KvDtype::kFloat32    ? "float32"
         : d == KvDtype::kBFloat16 ? "bfloat16"
         : d == KvDtype::kFloat16  ? "float16"
                                   : "unknown";
}

}  // namespace beaconkv::kernels

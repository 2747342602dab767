// bfloat16 rounding: one value (RoundToBf16) and rows of them (RoundToBf16Bits, the policy's
// query buffers with score_bf16), the same bits either way; and rows widened back
// (FromBf16Row).
#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/multiversion.h"
#include "core/scoring.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace beaconkv {
namespace {

// RoundToBf16's upper half without branches, so that a loop of it vectorises: NaN made quiet,
// zeros and denormals to zeros of their sign, everything else rounded to nearest even: add
// half an ulp of bfloat16 (less one when the kept lsb is 0: ties to even) and truncate; a
// carry into the exponent is the correct rounding up, to infinity past the largest (an
// infinity itself stays).
inline uint16_t RoundBits(uint32_t u) {
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u | 0x00400000u) >> 16;
  const uint32_t zero = (u & 0x80000000u) >> 16;
  const uint32_t bits = (u & 0x7FFFFFFFu) > 0x7F800000u ? nan
                        : (u & 0x7F800000u) == 0        ? zero
                                                        : rounded;
  return static_cast<uint16_t>(bits);
}

BKV_MULTIVERSION void RoundBitsLoop(const float* x, int32_t n, uint16_t* out) {
  for (int32_t i = 0; i < n; ++i) out[i] = RoundBits(std::bit_cast<uint32_t>(x[i]));
}

#if defined(__x86_64__)
bool HasAvx512Bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

// 16 values per vcvtneps2bf16 (the same rounding, RoundToBf16Test.IsTheCpusConversion);
// kStream: non-temporal stores (out 32-byte aligned).
template <bool kStream>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) int32_t RoundBitsAvx512(const float* x,
                                                                               int32_t n,
                                                                               uint16_t* out) {
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    auto* to = reinterpret_cast<__m256i*>(out + i);
    if constexpr (kStream) {
      _mm256_stream_si256(to, reinterpret_cast<const __m256i&>(b));
    } else {
      _mm256_storeu_si256(to, reinterpret_cast<const __m256i&>(b));
    }
  }
  return i;
}
__attribute__((target("avx512f"))) int32_t StreamAvx512(const float* x, int32_t n, float* out) {
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(out + i, _mm512_loadu_ps(x + i));
  return i;
}
#endif

}  // namespace

float RoundToBf16(float x) { return FromBf16Bits(RoundBits(std::bit_cast<uint32_t>(x))); }

BKV_MULTIVERSION void FromBf16Row(const uint16_t* bits, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromBf16Bits(bits[i]);
}

void RoundToBf16Bits(const float* x, int32_t n, uint16_t* out) {
  int32_t done = 0;
#if defined(__x86_64__)
  static const bool avx512_bf16 = HasAvx512Bf16();
  if (avx512_bf16) done = RoundBitsAvx512<false>(x, n, out);
#endif
  RoundBitsLoop(x + done, n - done, out + done);
}

void StreamBf16Bits(const float* x, int32_t n, uint16_t* out) {
  int32_t done = 0;
#if defined(__x86_64__)
  static const bool avx512_bf16 = HasAvx512Bf16();
  if (avx512_bf16 && reinterpret_cast<uintptr_t>(out) % 32 == 0)
    done = RoundBitsAvx512<true>(x, n, out);
#endif
  RoundBitsLoop(x + done, n - done, out + done);
}

void StreamRow(const float* x, int32_t n, float* out) {
  int32_t done = 0;
#if defined(__x86_64__)
  static const bool avx512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f"));
  if (avx512 && reinterpret_cast<uintptr_t>(out) % 64 == 0) done = StreamAvx512(x, n, out);
#endif
  std::copy_n(x + done, n - done, out + done);
}

void StreamFence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace beaconkv

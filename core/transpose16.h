// A 16 x 16 transpose of 32-bit values on AVX-512, shared by the FPS's packing
// (core/beacon_bank.cc, quantised words) and the scorer's key layout (core/scoring.cc, floats).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace beaconkv::internal {

// dst[c * dst_stride + r] = src[r * src_stride + c] for r, c < 16 (the shuffles copy bits).
// (The masked forms with every lane set: the plain ones trip GCC 12's -Wuninitialized where
// inlined into a sanitizer build.)
__attribute__((target("avx512f"))) inline void Transpose16x16(const float* src, size_t src_stride,
                                                              float* dst, size_t dst_stride) {
  __m512 r[16], t[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + k * src_stride);
  // Interleave pairs of rows (32-bit), then pairs of pairs (64-bit): t[4q + j] holds, in each
  // 128-bit lane L, elements 4L..4L+3 of rows 4q..4q+3, column j of that group of four.
  for (int q = 0; q < 4; ++q) {
    const __m512 a = _mm512_mask_unpacklo_ps(r[4 * q], 0xFFFF, r[4 * q], r[4 * q + 1]);
    const __m512 b = _mm512_mask_unpackhi_ps(r[4 * q], 0xFFFF, r[4 * q], r[4 * q + 1]);
    const __m512 c = _mm512_mask_unpacklo_ps(r[4 * q + 2], 0xFFFF, r[4 * q + 2], r[4 * q + 3]);
    const __m512 d = _mm512_mask_unpackhi_ps(r[4 * q + 2], 0xFFFF, r[4 * q + 2], r[4 * q + 3]);
    t[4 * q] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(_mm512_castps_pd(a), 0xFF,
                                                        _mm512_castps_pd(a), _mm512_castps_pd(c)));
    t[4 * q + 1] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(
        _mm512_castps_pd(a), 0xFF, _mm512_castps_pd(a), _mm512_castps_pd(c)));
    t[4 * q + 2] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(
        _mm512_castps_pd(b), 0xFF, _mm512_castps_pd(b), _mm512_castps_pd(d)));
    t[4 * q + 3] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(
        _mm512_castps_pd(b), 0xFF, _mm512_castps_pd(b), _mm512_castps_pd(d)));
  }
  // Gather 128-bit lanes: column 4L + j comes from lane L of t[j], t[4 + j], t[8 + j], t[12 + j].
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 =
        _mm512_mask_shuffle_f32x4(t[j], 0xFFFF, t[j], t[4 + j], 0x44);  // lanes 0,1 | 0,1
    const __m512 hi01 =
        _mm512_mask_shuffle_f32x4(t[j], 0xFFFF, t[j], t[4 + j], 0xEE);  // lanes 2,3 | 2,3
    const __m512 lo23 = _mm512_mask_shuffle_f32x4(t[8 + j], 0xFFFF, t[8 + j], t[12 + j], 0x44);
    const __m512 hi23 = _mm512_mask_shuffle_f32x4(t[8 + j], 0xFFFF, t[8 + j], t[12 + j], 0xEE);
    _mm512_storeu_ps(dst + (0 + j) * dst_stride,
                     _mm512_mask_shuffle_f32x4(lo01, 0xFFFF, lo01, lo23, 0x88));
    _mm512_storeu_ps(dst + (4 + j) * dst_stride,
                     _mm512_mask_shuffle_f32x4(lo01, 0xFFFF, lo01, lo23, 0xDD));
    _mm512_storeu_ps(dst + (8 + j) * dst_stride,
                     _mm512_mask_shuffle_f32x4(hi01, 0xFFFF, hi01, hi23, 0x88));
    _mm512_storeu_ps(dst + (12 + j) * dst_stride,
                     _mm512_mask_shuffle_f32x4(hi01, 0xFFFF, hi01, hi23, 0xDD));
  }
}

// The same for 32-bit integer words.
__attribute__((target("avx512f"))) inline void Transpose16x16(const int32_t* src, size_t src_stride,
                                                              int32_t* dst, size_t dst_stride) {
  Transpose16x16(reinterpret_cast<const float*>(src), src_stride, reinterpret_cast<float*>(dst),
                 dst_stride);
}

}  // namespace beaconkv::internal
#endif

#include <immintrin.h>
#include <chrono>
#include <cstdio>
__attribute__((target("avx512f,avx512bf16"))) float bf(long iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_setzero_ps();
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x3f803f81);
  for (long t = 0; t < iters; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    asm volatile("" : "+v"(x));
  }
  float s = 0; for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]); return s;
}
__attribute__((target("avx512f"))) float fm(long iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_setzero_ps();
  __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(1.0001f);
  for (long t = 0; t < iters; ++t) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(x, y, a[i]);
    asm volatile("" : "+v"(x));
  }
  float s = 0; for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]); return s;
}
int main() {
  long n = 50000000;
  for (int r = 0; r < 3; ++r) {
    auto t0 = std::chrono::steady_clock::now(); float a = bf(n);
    auto t1 = std::chrono::steady_clock::now(); float b = fm(n);
    auto t2 = std::chrono::steady_clock::now();
    double tb = std::chrono::duration<double>(t1 - t0).count(), tf = std::chrono::duration<double>(t2 - t1).count();
    printf("dpbf16: %.3f ns/instr (32 MAC)  fma: %.3f ns/instr (16 MAC)  MAC ratio %.2f  (%g %g)\n", tb / (n * 12) * 1e9, tf / (n * 12) * 1e9, (32 / tb) / (16 / tf), a, b);
  }
}

// The dense math of the CPU model runner. `Linear` computes every output element by the same
// code whatever the batch size, so a sequence's logits do not depend on what it is batched
// with; `LinearGemm` is the fast path for many rows, whose rounding may depend on the batch.
#pragma once

#include <cstdint>

namespace beaconkv {

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]): HF Linear with weight [out, in].
void Linear(const float* x,     // [rows, in]
            const float* w,     // [out, in]
            const float* bias,  // [out] or null
            int64_t rows, int64_t in, int64_t out,
            float* y,  // [rows, out]
            int num_threads);

// Same result as Linear up to rounding, as OpenBLAS sgemm calls: one per thread over a slice
// of the output features (OpenBLAS itself runs single-threaded, see SetBlasSingleThreaded).
void LinearGemm(const float* x,     // [rows, in]
                const float* w,     // [out, in]
                const float* bias,  // [out] or null
                int64_t rows, int64_t in, int64_t out,
                float* y,  // [rows, out]
                int num_threads);

// Makes OpenBLAS run every call on the calling thread (process-wide, idempotent): the engine
// splits work with OpenMP, and a second pool of spinning threads would fight it for cores.
void SetBlasSingleThreaded();

// y = x / sqrt(mean(x^2) + eps) * weight, per row.
void RmsNorm(const float* x,       // [rows, dim]
             const float* weight,  // [dim]
             int64_t rows, int64_t dim, float eps,
             float* y);  // [rows, dim], may alias x

// gate = silu(gate) * up, elementwise.
void SiluMul(float* gate, const float* up, int64_t n);

// In-place softmax of one row; returns nothing, uses max subtraction.
void SoftmaxInPlace(float* x, int64_t n);

float Dot(const float* a, const float* b, int64_t n);

}  // namespace beaconkv

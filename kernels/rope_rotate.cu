#include "kernels/rope_rotate.h"

namespace beaconkv::kernels {
namespace {

// One thread per rotation pair (i, i + head_dim/2) of one row. __fmul_rn/__fsub_rn keep
// nvcc from contracting to FMA, so the result matches the CPU's separately rounded math.
__global__ void RotateRowsKernel(const float* src,                       // [num_rows, head_dim]
                                 const int32_t* __restrict__ table_row,  // [num_rows]
                                 const float* __restrict__ table,  // [num_positions, head_dim]
                                 int32_t num_rows, int32_t head_dim,
                                 float* dst) {  // [num_rows, head_dim]
  const int32_t half = head_dim / 2;
  const int64_t pair = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (pair >= int64_t{num_rows} * half) return;
  const int64_t r = pair / half;
  const int32_t i = static_cast<int32_t>(pair % half);
  const float* cs = table + int64_t{table_row[r]} * head_dim;
  const float c = cs[i], s = cs[half + i];
  const float x1 = src[r * head_dim + i], x2 = src[r * head_dim + half + i];
  dst[r * head_dim + i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  dst[r * head_dim + half + i] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

}  // namespace

cudaError_t RotateRows(const float* src, const int32_t* table_row, const float* table,
                       int32_t num_rows, int32_t head_dim, float* dst, cudaStream_t stream) {
  if (num_rows < 0 || head_dim < 2 || head_dim % 2 != 0) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t pairs = int64_t{num_rows} * (head_dim / 2);
  const int64_t blocks = (pairs + kThreads - 1) / kThreads;
  RotateRowsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, table_row, table,
                                                                           num_rows, head_dim, dst);
  return cudaGetLastError();
}

}  // namespace beaconkv::kernels

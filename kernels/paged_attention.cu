#include <cfloat>

#include "kernels/paged_attention.h"

namespace beaconkv::kernels {
namespace {

constexpr int kWarps = 4;

// One thread block per (row, query head). Warp w takes slots w, w + kWarps, ...; each lane
// holds HEAD_DIM / 32 dimensions of q and of its running output. Each warp keeps an online
// softmax (running max m, running sum l); the warps are merged at the end.
template <int HEAD_DIM>
__global__ void PagedDecodeAttentionKernel(
    const float* __restrict__ q, const float* __restrict__ k_cache,
    const float* __restrict__ v_cache, const int32_t* __restrict__ block_tables,
    const int32_t* __restrict__ lengths, PagedAttentionShape s, float scale,
    const float* __restrict__ bias, float* __restrict__ out) {
  constexpr int kPer = HEAD_DIM / 32;
  const int row = blockIdx.x, head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = s.num_heads / s.num_kv_heads;
  const int64_t kv = int64_t{row} * s.num_kv_heads + head / group;
  const int32_t n = lengths[kv];
  const int32_t* table = block_tables + kv * s.max_blocks;
  const float* qh = q + (int64_t{row} * s.num_heads + head) * HEAD_DIM;
  const float* bh = bias != nullptr ? bias + kv * s.max_blocks * s.block_size : nullptr;

  float qr[kPer], acc[kPer];
  for (int i = 0; i < kPer; ++i) {
    qr[i] = qh[lane + 32 * i];
    acc[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  for (int32_t j = warp; j < n; j += kWarps) {
    const int64_t slot = int64_t{table[j / s.block_size]} * s.block_size + j % s.block_size;
    const float* kj = k_cache + slot * HEAD_DIM;
    float dot = 0.0f;
    for (int i = 0; i < kPer; ++i) dot += qr[i] * kj[lane + 32 * i];
    for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    const float logit = dot * scale + (bh != nullptr ? bh[j] : 0.0f);
    const float m_new = fmaxf(m, logit);
    const float corr = __expf(m - m_new), w = __expf(logit - m_new);
    const float* vj = v_cache + slot * HEAD_DIM;
    for (int i = 0; i < kPer; ++i) acc[i] = acc[i] * corr + w * vj[lane + 32 * i];
    l = l * corr + w;
    m = m_new;
  }

  __shared__ float sm[kWarps], sl[kWarps], sacc[kWarps][HEAD_DIM];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int i = 0; i < kPer; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float big = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w) big = fmaxf(big, sm[w]);
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) total += sl[w] * __expf(sm[w] - big);
  float* oh = out + (int64_t{row} * s.num_heads + head) * HEAD_DIM;
  for (int e = threadIdx.x; e < HEAD_DIM; e += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kWarps; ++w) v += sacc[w][e] * __expf(sm[w] - big);
    oh[e] = n > 0 ? v / total : 0.0f;
  }
}

template <int HEAD_DIM>
cudaError_t Launch(const float* q, const float* k, const float* v, const int32_t* tables,
                   const int32_t* lengths, const PagedAttentionShape& s, float scale,
                   const float* bias, float* out, cudaStream_t stream) {
  const dim3 grid(s.rows, s.num_heads);
  PagedDecodeAttentionKernel<HEAD_DIM>
      <<<grid, kWarps * 32, 0, stream>>>(q, k, v, tables, lengths, s, scale, bias, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PagedDecodeAttention(const float* q, const float* k_cache, const float* v_cache,
                                 const int32_t* block_tables, const int32_t* lengths,
                                 const PagedAttentionShape& s, float scale, float* out,
                                 cudaStream_t stream, const float* bias) {
  if (s.rows < 0 || s.num_heads < 1 || s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0 ||
      s.block_size < 1 || s.max_blocks < 0) {
    return cudaErrorInvalidValue;
  }
  if (s.rows == 0) return cudaSuccess;
  // DISPATCH: runtime head_dim -> template argument.
  switch (s.head_dim) {
    case 32:
      return Launch<32>(q, k_cache, v_cache, block_tables, lengths, s, scale, bias, out, stream);
    case 64:
      return Launch<64>(q, k_cache, v_cache, block_tables, lengths, s, scale, bias, out, stream);
    case 128:
      return Launch<128>(q, k_cache, v_cache, block_tables, lengths, s, scale, bias, out, stream);
    case 256:
      return Launch<256>(q, k_cache, v_cache, block_tables, lengths, s, scale, bias, out, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace beaconkv::kernels

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <type_traits>

#include "kernels/kv_dtype_device.cuh"
#include "kernels/paged_attention_gqa.h"

namespace beaconkv::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kUnroll = 2;  // tokens each lane group loads before using any of them

// 16 bytes of the cache as floats.
__device__ __forceinline__ void Load16(const float* p, float* x) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(p));
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}
__device__ __forceinline__ void Load16(const __nv_bfloat16* p, float* x) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void Load16(const __half* p, float* x) {
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  const __half2* h = reinterpret_cast<const __half2*>(&v);
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

// Layout of one warp over tokens: kLanes lanes share a token, each loading kVecs 16-byte
// vectors (interleaved so neighbouring lanes read neighbouring bytes); 32 / kLanes tokens
// per warp per step.
template <typename T, int HEAD_DIM>
struct Layout {
  static constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  static constexpr int kLanes = HEAD_DIM / kVec < 32 ? HEAD_DIM / kVec : 32;
  static constexpr int kVecs = HEAD_DIM / (kVec * kLanes);  // loads per lane per token
  static constexpr int kElems = kVec * kVecs;               // elements per lane
  static constexpr int kTokens = 32 / kLanes;               // tokens per warp per step
  static constexpr int kGroups = kWarps * kTokens;          // lane groups per block
  static_assert(kVecs * kVec * kLanes == HEAD_DIM, "head_dim must split into 16-byte loads");
  __device__ static int Elem(int v, int lane_in_group) {  // first element of load v
    return (v * kLanes + lane_in_group) * kVec;
  }
};

// Shared memory of one block: each lane group's softmax state for the whole GQA group.
template <int HEAD_DIM, int GROUP, int LANE_GROUPS>
struct GqaSmem {
  float m[LANE_GROUPS][GROUP];
  float l[LANE_GROUPS][GROUP];
  float acc[LANE_GROUPS][GROUP][HEAD_DIM];
};

// Block (row, kv_head, split) covers tokens [split * chunk, (split + 1) * chunk) of the head.
// With one split it writes the normalised output; with several, the unnormalised partial
// output and its (max, sum) into the workspace for MergeSplitsKernel.
template <typename T, int HEAD_DIM, int GROUP>
__global__ void __launch_bounds__(kWarps * 32)
    GqaDecodeKernel(const float* __restrict__ q,               // [rows, num_heads, head_dim]
                    const T* __restrict__ k_cache,             // [num_blocks, bs, head_dim]
                    const T* __restrict__ v_cache,             // [num_blocks, bs, head_dim]
                    const int32_t* __restrict__ block_tables,  // [rows, kv_heads, max_blocks]
                    const int32_t* __restrict__ lengths,       // [rows, kv_heads]
                    PagedAttentionShape s, float scale, int32_t chunk,
                    const float* __restrict__ bias,    // [rows, kv_heads, max_len] or null
                    float* __restrict__ out,           // [rows, num_heads, head_dim]
                    float* __restrict__ partial_out,   // [rows, num_heads, splits, head_dim]
                    float* __restrict__ partial_ml) {  // [rows, num_heads, splits, 2]
  using L = Layout<T, HEAD_DIM>;
  __shared__ GqaSmem<HEAD_DIM, GROUP, L::kGroups> sm;
  const int kv_head = blockIdx.x, row = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / L::kLanes, gl = lane % L::kLanes;  // token slot, lane within group
  const int lane_group = warp * L::kTokens + sub;
  const int64_t kv = int64_t{row} * s.num_kv_heads + kv_head;
  const int32_t n = lengths[kv];
  const int32_t* table = block_tables + kv * s.max_blocks;
  const int32_t begin = split * chunk, end = min(n, begin + chunk);
  const float* bh = bias != nullptr ? bias + kv * s.max_blocks * s.block_size : nullptr;

  float qr[GROUP][L::kElems];  // this lane's elements of every query head of the group
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    const float* qh = q + (int64_t{row} * s.num_heads + kv_head * GROUP + g) * HEAD_DIM;
#pragma unroll
    for (int v = 0; v < L::kVecs; ++v)
#pragma unroll
      for (int e = 0; e < L::kVec; ++e) qr[g][v * L::kVec + e] = qh[L::Elem(v, gl) + e];
  }
  float m[GROUP], l[GROUP], acc[GROUP][L::kElems];
#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < L::kElems; ++e) acc[g][e] = 0.0f;
  }
  // Every lane runs the same trip count (shuffles need the whole warp); `valid` masks the
  // tokens past the end.
  constexpr int kStride = kWarps * L::kTokens;
  for (int32_t j0 = begin + warp * L::kTokens; j0 < end; j0 += kStride * kUnroll) {
    float kx[kUnroll][L::kElems], vx[kUnroll][L::kElems], bx[kUnroll];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t j = j0 + u * kStride + sub;
      valid[u] = j < end;
      bx[u] = valid[u] && bh != nullptr ? bh[j] : 0.0f;
      if (valid[u]) {
        const int64_t slot = int64_t{table[j / s.block_size]} * s.block_size + j % s.block_size;
        const T* kp = k_cache + slot * HEAD_DIM;
        const T* vp = v_cache + slot * HEAD_DIM;
#pragma unroll
        for (int v = 0; v < L::kVecs; ++v) {
          Load16(kp + L::Elem(v, gl), &kx[u][v * L::kVec]);
          Load16(vp + L::Elem(v, gl), &vx[u][v * L::kVec]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < L::kElems; ++e) kx[u][e] = vx[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int g = 0; g < GROUP; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < L::kElems; ++e) dot = fmaf(qr[g][e], kx[u][e], dot);
        for (int off = L::kLanes / 2; off > 0; off /= 2)
          dot += __shfl_xor_sync(0xffffffffu, dot, off);
        if (!valid[u]) continue;
        const float logit = dot * scale + bx[u];
        const float m_new = fmaxf(m[g], logit);
        const float corr = __expf(m[g] - m_new), w = __expf(logit - m_new);
#pragma unroll
        for (int e = 0; e < L::kElems; ++e) acc[g][e] = fmaf(w, vx[u][e], acc[g][e] * corr);
        l[g] = l[g] * corr + w;
        m[g] = m_new;
      }
    }
  }

#pragma unroll
  for (int g = 0; g < GROUP; ++g) {
    if (gl == 0) {
      sm.m[lane_group][g] = m[g];
      sm.l[lane_group][g] = l[g];
    }
#pragma unroll
    for (int v = 0; v < L::kVecs; ++v)
#pragma unroll
      for (int e = 0; e < L::kVec; ++e)
        sm.acc[lane_group][g][L::Elem(v, gl) + e] = acc[g][v * L::kVec + e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += kWarps * 32) {
    const int g = i / HEAD_DIM, e = i % HEAD_DIM;
    float big = -FLT_MAX;
    for (int w = 0; w < L::kGroups; ++w) big = fmaxf(big, sm.m[w][g]);
    float total = 0.0f, o = 0.0f;
    for (int w = 0; w < L::kGroups; ++w) {
      const float c = __expf(sm.m[w][g] - big);
      total += sm.l[w][g] * c;
      o += sm.acc[w][g][e] * c;
    }
    const int64_t head = int64_t{row} * s.num_heads + kv_head * GROUP + g;
    if (splits == 1) {
      out[head * HEAD_DIM + e] = total > 0.0f ? o / total : 0.0f;
    } else {
      partial_out[(head * splits + split) * HEAD_DIM + e] = o;
      if (e == 0) {
        partial_ml[(head * splits + split) * 2] = big;
        partial_ml[(head * splits + split) * 2 + 1] = total;
      }
    }
  }
}

// One block per (row, query head): merges the splits' partial outputs.
template <int HEAD_DIM>
__global__ void MergeSplitsKernel(const float* __restrict__ partial_out,  // [.., splits, d]
                                  const float* __restrict__ partial_ml,   // [.., splits, 2]
                                  int32_t splits,
                                  float* __restrict__ out) {  // [rows * num_heads, head_dim]
  const int64_t head = blockIdx.x;
  const float* ml = partial_ml + head * splits * 2;
  float big = -FLT_MAX;
  for (int t = 0; t < splits; ++t) big = fmaxf(big, ml[2 * t]);
  float total = 0.0f;
  for (int t = 0; t < splits; ++t) total += ml[2 * t + 1] * __expf(ml[2 * t] - big);
  for (int e = threadIdx.x; e < HEAD_DIM; e += blockDim.x) {
    float o = 0.0f;
    for (int t = 0; t < splits; ++t)
      o += partial_out[(head * splits + t) * HEAD_DIM + e] * __expf(ml[2 * t] - big);
    out[head * HEAD_DIM + e] = total > 0.0f ? o / total : 0.0f;
  }
}

size_t WorkspaceBytes(const PagedAttentionShape& s, int32_t splits, int32_t head_dim) {
  if (splits <= 1) return 16;
  const size_t heads = static_cast<size_t>(s.rows) * s.num_heads * splits;
  return heads * (head_dim + 2) * sizeof(float) + 256;
}

template <typename T, int HEAD_DIM, int GROUP>
cudaError_t Launch(void* workspace, const float* q, const void* k, const void* v,
                   const int32_t* tables, const int32_t* lengths, const PagedAttentionShape& s,
                   float scale, int32_t splits, const float* bias, float* out,
                   cudaStream_t stream) {
  const int32_t max_len = s.max_blocks * s.block_size;
  const int32_t chunk = std::max<int32_t>(1, (max_len + splits - 1) / splits);
  float* partial_out = static_cast<float*>(workspace);
  float* partial_ml = partial_out + static_cast<size_t>(s.rows) * s.num_heads * splits * HEAD_DIM;
  const dim3 grid(s.num_kv_heads, s.rows, splits);
  GqaDecodeKernel<T, HEAD_DIM, GROUP><<<grid, kWarps * 32, 0, stream>>>(
      q, static_cast<const T*>(k), static_cast<const T*>(v), tables, lengths, s, scale, chunk, bias,
      out, partial_out, partial_ml);
  if (splits > 1) {
    MergeSplitsKernel<HEAD_DIM>
        <<<s.rows * s.num_heads, 128, 0, stream>>>(partial_out, partial_ml, splits, out);
  }
  return cudaGetLastError();
}

template <int N>
using Int = std::integral_constant<int, N>;

// Calls f(T{}, Int<HEAD_DIM>{}, Int<GROUP>{}) for the kernel instantiation that serves
// (dtype, head_dim, group); cudaErrorInvalidValue for one that does not exist.
template <typename F>
cudaError_t DispatchGqa(KvDtype dtype, int32_t head_dim, int32_t group, F&& f) {
  // DISPATCH: storage type, runtime head_dim, then GQA group size -> template arguments.
  return DispatchKvDtype(dtype, [&](auto zero) -> cudaError_t {
    auto by_group = [&](auto hd) -> cudaError_t {
      switch (group) {
        case 1:
          return f(zero, hd, Int<1>{});
        case 2:
          return f(zero, hd, Int<2>{});
        case 4:
          return f(zero, hd, Int<4>{});
        case 8:
          return f(zero, hd, Int<8>{});
        default:
          return cudaErrorInvalidValue;
      }
    };
    switch (head_dim) {
      case 32:
        return by_group(Int<32>{});
      case 64:
        return by_group(Int<64>{});
      case 128:
        return by_group(Int<128>{});
      default:
        return cudaErrorInvalidValue;
    }
  });
}

}  // namespace

int32_t ChooseNumSplits(const PagedAttentionShape& s, int32_t num_sms, int32_t blocks_per_sm) {
  const int64_t blocks = int64_t{s.rows} * s.num_kv_heads;
  if (blocks <= 0 || num_sms < 1 || blocks_per_sm < 1) return 1;
  const int64_t slots = int64_t{num_sms} * blocks_per_sm;
  const int64_t most = std::max<int64_t>(1, (int64_t{s.max_blocks} * s.block_size + 255) / 256);
  // The share of the slots that the launch's waves keep busy; the fewest splits within 5 % of
  // the best share.
  auto fill = [&](int64_t splits) {
    const int64_t total = blocks * splits;
    const int64_t waves = (total + slots - 1) / slots;
    return static_cast<double>(total) / static_cast<double>(waves * slots);
  };
  double best = 0.0;
  for (int64_t t = 1; t <= most; ++t) best = std::max(best, fill(t));
  for (int64_t t = 1; t <= most; ++t) {
    if (fill(t) >= 0.95 * best) return static_cast<int32_t>(t);
  }
  return static_cast<int32_t>(most);
}

cudaError_t GqaBlocksPerSm(const PagedAttentionShape& s, KvDtype dtype, int32_t* blocks_per_sm) {
  if (blocks_per_sm == nullptr || s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  return DispatchGqa(
      dtype, s.head_dim, s.num_heads / s.num_kv_heads, [&](auto zero, auto hd, auto g) {
        using T = decltype(zero);
        int n = 0;
        const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
            &n, GqaDecodeKernel<T, decltype(hd)::value, decltype(g)::value>, kWarps * 32, 0);
        *blocks_per_sm = n;
        return err;
      });
}

cudaError_t PagedDecodeAttentionGqa(void* workspace, size_t* workspace_bytes, const float* q,
                                    const void* k_cache, const void* v_cache, KvDtype dtype,
                                    const int32_t* block_tables, const int32_t* lengths,
                                    const PagedAttentionShape& s, float scale, int32_t num_splits,
                                    float* out, cudaStream_t stream, const float* bias) {
  if (workspace_bytes == nullptr || s.rows < 0 || s.num_heads < 1 || s.num_kv_heads < 1 ||
      s.num_heads % s.num_kv_heads != 0 || s.block_size < 1 || s.max_blocks < 0 || num_splits < 1 ||
      (s.head_dim != 32 && s.head_dim != 64 && s.head_dim != 128)) {
    return cudaErrorInvalidValue;
  }
  const int group = s.num_heads / s.num_kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8) return cudaErrorInvalidValue;
  if (!ValidKvDtype(dtype)) {
    return cudaErrorInvalidValue;
  }
  const size_t need = WorkspaceBytes(s, num_splits, s.head_dim);
  if (workspace == nullptr) {
    *workspace_bytes = need;
    return cudaSuccess;
  }
  if (*workspace_bytes < need) return cudaErrorInvalidValue;
  if (s.rows == 0) return cudaSuccess;
  return DispatchGqa(dtype, s.head_dim, group, [&](auto zero, auto hd, auto g) {
    return Launch<decltype(zero), decltype(hd)::value, decltype(g)::value>(
        workspace, q, k_cache, v_cache, block_tables, lengths, s, scale, num_splits, bias, out,
        stream);
  });
}

}  // namespace beaconkv::kernels

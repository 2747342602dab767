#include <cfloat>
#include <cmath>

#include "kernels/kv_dtype_device.cuh"
#include "kernels/paged_scores.h"

namespace beaconkv::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 64;    // query rows per chunk (a row = one query head of one query)
constexpr int kKeys = 64;    // keys per tile
constexpr int kMicro = 4;    // each thread computes a kMicro x kMicro block of logits
constexpr int kGroups = 16;  // kRows / kMicro row groups x kKeys / kMicro key groups = 256
static_assert(kGroups * kMicro == kRows && kGroups * kMicro == kKeys, "tile shape");
static_assert(kGroups * kGroups == kThreads, "one thread per micro-tile");

template <int HEAD_DIM>
struct Smem {
  static constexpr int kPad = HEAD_DIM + 1;  // odd row stride: no bank conflicts
  float q[kRows][kPad];                      // [rows of the chunk, head_dim]
  union {  // a tile's keys are dead once its logits are in registers: p reuses their memory,
           // so three blocks fit an SM at head_dim 128 (two without the union)
    float k[kKeys][kPad];       // [keys of the tile, head_dim]
    float p[kRows][kKeys + 1];  // [rows, keys] logits, then probabilities
  };
  float row_max[kRows];  // [rows] running max of the logits
  float row_sum[kRows];  // [rows] running sum of exp(logit - max)
  int scored[kKeys];     // [keys of the tile] 1 = in the softmax
};

// Four consecutive elements of the cache as floats (one 16- or 8-byte load).
__device__ __forceinline__ float4 Load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
template <typename T>
__device__ __forceinline__ float4 Load4(const T* p) {
  const uint2 bits = *reinterpret_cast<const uint2*>(p);
  const T* h = reinterpret_cast<const T*>(&bits);
  return make_float4(ToFloat(h[0]), ToFloat(h[1]), ToFloat(h[2]), ToFloat(h[3]));
}

// x rounded to bfloat16 and back when `round` (PagedScoresShape::bf16), as core RoundToBf16:
// nearest even, NaN and infinities kept, a denormal input to a zero of its sign.
__device__ __forceinline__ float MaybeBf16(float x, bool round) {
  if (!round) return x;
  if (fabsf(x) < FLT_MIN) return copysignf(0.0f, x);
  return __bfloat162float(__float2bfloat16_rn(x));
}

// Loads keys [j0, j0 + kKeys) of the head into s.k through the block table (zeros past n),
// and which of them are scored (not past n, not excluded); rounded to bfloat16 when `bf16`.
template <typename T, int HEAD_DIM>
__device__ void LoadKeyTile(const T* __restrict__ k_cache, const int32_t* __restrict__ table,
                            const uint8_t* __restrict__ excluded, int32_t block_size, int32_t j0,
                            int32_t n, bool bf16, Smem<HEAD_DIM>& s) {
  if (threadIdx.x < kKeys) {
    const int32_t j = j0 + threadIdx.x;
    s.scored[threadIdx.x] = j < n && (excluded == nullptr || excluded[j] == 0);
  }
  constexpr int kVec = HEAD_DIM / 4;  // loads of four elements per key
  for (int i = threadIdx.x; i < kKeys * kVec; i += kThreads) {
    const int key = i / kVec, part = i % kVec;
    const int32_t j = j0 + key;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < n) {
      const int64_t slot = int64_t{table[j / block_size]} * block_size + j % block_size;
      v = Load4(k_cache + slot * HEAD_DIM + part * 4);
    }
    float* dst = &s.k[key][part * 4];
    dst[0] = MaybeBf16(v.x, bf16);
    dst[1] = MaybeBf16(v.y, bf16);
    dst[2] = MaybeBf16(v.z, bf16);
    dst[3] = MaybeBf16(v.w, bf16);
  }
}

// Logits of the chunk's rows against the tile's keys: acc[a][b] for row ty + 16a, key tx + 16b.
template <int HEAD_DIM>
__device__ void TileLogits(const Smem<HEAD_DIM>& s, float scale, float (&acc)[kMicro][kMicro]) {
  const int tx = threadIdx.x % kGroups, ty = threadIdx.x / kGroups;
  for (int a = 0; a < kMicro; ++a)
    for (int b = 0; b < kMicro; ++b) acc[a][b] = 0.0f;
#pragma unroll 8
  for (int d = 0; d < HEAD_DIM; ++d) {
    float qa[kMicro], kb[kMicro];
    for (int a = 0; a < kMicro; ++a) qa[a] = s.q[ty + kGroups * a][d];
    for (int b = 0; b < kMicro; ++b) kb[b] = s.k[tx + kGroups * b][d];
    for (int a = 0; a < kMicro; ++a)
      for (int b = 0; b < kMicro; ++b) acc[a][b] = fmaf(qa[a], kb[b], acc[a][b]);
  }
  for (int a = 0; a < kMicro; ++a)
    for (int b = 0; b < kMicro; ++b) acc[a][b] *= scale;
}

// kMaxLogits: the first row of each query's group takes the max of the group's logits; that
// row alone is the query's softmax. Needs s.p to hold the tile's logits.
template <int HEAD_DIM>
__device__ void GroupMaxLogits(int queries_here, int g, Smem<HEAD_DIM>& s) {
  for (int i = threadIdx.x; i < queries_here * kKeys; i += kThreads) {
    const int q = i / kKeys, c = i % kKeys;
    float m = s.p[q * g][c];
    for (int r = 1; r < g; ++r) m = fmaxf(m, s.p[q * g + r][c]);
    s.p[q * g][c] = m;
  }
}

// One head's part of the launch's arrays (blockIdx.x = the head).
struct HeadView {
  int32_t n;             // keys
  int32_t q0, nq;        // first query, queries
  const int32_t* table;  // block table
  float* out;            // [n] scores
  const uint8_t* skip;   // [n] excluded keys, or null
};

__device__ __forceinline__ HeadView ViewOfHead(const int32_t* block_tables, const int32_t* lengths,
                                               const int32_t* table_of_head,
                                               const int32_t* query_offsets,
                                               const int32_t* score_offsets,
                                               const uint8_t* excluded, int32_t max_blocks,
                                               float* scores) {
  const int h = blockIdx.x;
  const int32_t t = table_of_head[h];
  HeadView v;
  v.n = lengths[t];
  v.table = block_tables + int64_t{t} * max_blocks;
  v.q0 = query_offsets[h];
  v.nq = query_offsets[h + 1] - v.q0;
  v.out = scores + score_offsets[h];
  v.skip = excluded == nullptr ? nullptr : excluded + score_offsets[h];
  return v;
}

// A head with no queries: its scores are 0, or excluded_score for excluded keys (block y = 0).
__device__ __forceinline__ void ScoreHeadWithoutQueries(const HeadView& v, float excluded_score) {
  for (int32_t j = threadIdx.x; j < v.n && blockIdx.y == 0; j += kThreads) {
    v.out[j] = v.skip != nullptr && v.skip[j] ? excluded_score : 0.0f;
  }
}

// Stores a key's score after a chunk: the mean's division once the last chunk is in, then a
// plain store, or (several blocks per head) an integer atomicMax, exact for scores >= +0.
__device__ __forceinline__ void StoreChunkScore(float* out_j, float total, ScoreQuery query,
                                                bool last_chunk, int32_t nq, bool split) {
  if (query == ScoreQuery::kMean && last_chunk) total = __fmul_rn(total, 1.0f / nq);
  if (split) {
    atomicMax(reinterpret_cast<int*>(out_j), __float_as_int(total));
  } else {
    *out_j = total;
  }
}

// One thread block per head. Query rows go in chunks of whole queries (<= kRows rows); per
// chunk, pass 1 walks the key tiles for each row's softmax max and sum, pass 2 walks them again
// and folds the probabilities into the head's scores (kept in `scores`, each key owned by one
// thread throughout, so no atomics). Excluded keys take no part and score shape.excluded_score.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kThreads)
    PagedScoresKernel(const T* __restrict__ k_cache,              // [num_blocks, bs, head_dim]
                      const int32_t* __restrict__ block_tables,   // [num_tables, max_blocks]
                      const int32_t* __restrict__ lengths,        // [num_tables]
                      const int32_t* __restrict__ table_of_head,  // [num_heads]
                      const float* __restrict__ queries,  // [total_queries, group, head_dim]
                      const int32_t* __restrict__ query_offsets,  // [num_heads + 1]
                      const int32_t* __restrict__ score_offsets,  // [num_heads + 1]
                      const uint8_t* __restrict__ excluded,  // [score_offsets[num_heads]] / null
                      PagedScoresShape shape, float scale,
                      float* __restrict__ scores) {  // [score_offsets[num_heads]]
  extern __shared__ float4 smem_raw[];
  Smem<HEAD_DIM>& s = *reinterpret_cast<Smem<HEAD_DIM>*>(smem_raw);
  const HeadView view = ViewOfHead(block_tables, lengths, table_of_head, query_offsets,
                                   score_offsets, excluded, shape.max_blocks, scores);
  const auto& [n, q0, nq, table, out, skip] = view;
  const int g = shape.group_size;
  const bool max_logits = shape.gqa == ScoreGqa::kMaxLogits;
  const int row_step = max_logits ? g : 1;  // rows that hold a softmax
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tx = threadIdx.x % kGroups, ty = threadIdx.x / kGroups;
  // Several blocks per head (gridDim.y > 1, query == kMax only): block y takes chunks y,
  // y + gridDim.y, ... and folds its chunk maxima into out (zeroed by ZeroScoresKernel) with
  // an integer atomicMax, exact for the non-negative probabilities.
  const bool split = gridDim.y > 1;
  if (nq == 0) return ScoreHeadWithoutQueries(view, shape.excluded_score);
  const int chunk_queries = kRows / g;
  for (int32_t cq = blockIdx.y * chunk_queries; cq < nq; cq += gridDim.y * chunk_queries) {
    const int queries_here = min(chunk_queries, nq - cq);
    const int rows = queries_here * g;
    const float* qsrc = queries + (int64_t{q0} + cq) * g * HEAD_DIM;  // [rows, head_dim]
    __syncthreads();  // the previous chunk is done with s
    for (int i = threadIdx.x; i < kRows * HEAD_DIM; i += kThreads) {
      const int r = i / HEAD_DIM, d = i % HEAD_DIM;
      s.q[r][d] = r < rows ? MaybeBf16(qsrc[int64_t{r} * HEAD_DIM + d], shape.bf16) : 0.0f;
    }
    if (threadIdx.x < kRows) {
      s.row_max[threadIdx.x] = -FLT_MAX;
      s.row_sum[threadIdx.x] = 0.0f;
    }
    // Pass 1: per-row online max and sum of exponentials.
    for (int32_t j0 = 0; j0 < n; j0 += kKeys) {
      __syncthreads();  // s.k and s.p free
      LoadKeyTile<T, HEAD_DIM>(k_cache, table, skip, shape.block_size, j0, n, shape.bf16, s);
      __syncthreads();
      float acc[kMicro][kMicro];
      TileLogits<HEAD_DIM>(s, scale, acc);
      __syncthreads();  // s.k read by every thread: s.p (same memory) may be written
      for (int a = 0; a < kMicro; ++a)
        for (int b = 0; b < kMicro; ++b) s.p[ty + kGroups * a][tx + kGroups * b] = acc[a][b];
      __syncthreads();
      if (max_logits) {
        GroupMaxLogits<HEAD_DIM>(queries_here, g, s);
        __syncthreads();
      }
      const int keys_here = min(kKeys, n - j0);
      // Each softmax row owned by one warp.
      for (int r = warp * row_step; r < rows; r += (kThreads / 32) * row_step) {
        const float m_old = s.row_max[r], sum_old = s.row_sum[r];
        float m = -FLT_MAX;
        for (int c = lane; c < keys_here; c += 32) {
          if (s.scored[c]) m = fmaxf(m, s.p[r][c]);
        }
        for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        const float m_new = fmaxf(m_old, m);
        float sum = 0.0f;
        for (int c = lane; c < keys_here; c += 32) {
          if (s.scored[c]) sum += expf(s.p[r][c] - m_new);
        }
        for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
        __syncwarp();  // every lane has read row_max[r] / row_sum[r] before lane 0 writes them
        if (lane == 0) {
          s.row_sum[r] = sum_old * expf(m_old - m_new) + sum;
          s.row_max[r] = m_new;
        }
      }
    }
    __syncthreads();
    if (threadIdx.x < rows) s.row_sum[threadIdx.x] = 1.0f / s.row_sum[threadIdx.x];
    // Pass 2: probabilities, reduced over the group, then over the queries into out.
    for (int32_t j0 = 0; j0 < n; j0 += kKeys) {
      __syncthreads();  // s.k and s.p free; row_sum inverted
      LoadKeyTile<T, HEAD_DIM>(k_cache, table, skip, shape.block_size, j0, n, shape.bf16, s);
      __syncthreads();
      float acc[kMicro][kMicro];
      TileLogits<HEAD_DIM>(s, scale, acc);
      __syncthreads();   // s.k read by every thread: s.p (same memory) may be written
      if (max_logits) {  // logits, the group's max, then the probabilities of that row
        for (int a = 0; a < kMicro; ++a)
          for (int b = 0; b < kMicro; ++b) s.p[ty + kGroups * a][tx + kGroups * b] = acc[a][b];
        __syncthreads();
        GroupMaxLogits<HEAD_DIM>(queries_here, g, s);
        __syncthreads();
        for (int i = threadIdx.x; i < queries_here * kKeys; i += kThreads) {
          const int r = (i / kKeys) * g, c = i % kKeys;
          s.p[r][c] = __fmul_rn(expf(s.p[r][c] - s.row_max[r]), s.row_sum[r]);
        }
      } else {
        for (int a = 0; a < kMicro; ++a) {
          const int r = ty + kGroups * a;
          if (r >= rows) continue;
          for (int b = 0; b < kMicro; ++b) {
            s.p[r][tx + kGroups * b] = __fmul_rn(expf(acc[a][b] - s.row_max[r]), s.row_sum[r]);
          }
        }
      }
      __syncthreads();
      const int32_t j = j0 + threadIdx.x;
      if (threadIdx.x < kKeys && j < n && !s.scored[threadIdx.x]) {
        if (blockIdx.y == 0) out[j] = shape.excluded_score;
      } else if (threadIdx.x < kKeys && j < n) {
        const int c = threadIdx.x;
        float total = cq == 0 || split ? 0.0f : out[j];
        for (int q = 0; q < queries_here; ++q) {
          float red = s.p[q * g][c];
          for (int m = 1; m < g && !max_logits; ++m) {
            red = shape.gqa == ScoreGqa::kMaxProbs ? fmaxf(red, s.p[q * g + m][c])
                                                   : __fadd_rn(red, s.p[q * g + m][c]);
          }
          if (g > 1 && shape.gqa == ScoreGqa::kMeanProbs) red = __fmul_rn(red, 1.0f / g);
          total = shape.query == ScoreQuery::kMax ? fmaxf(total, red) : __fadd_rn(total, red);
        }
        StoreChunkScore(out + j, total, shape.query, cq + queries_here == nq, nq, split);
      }
    }
  }
}

// The same scores for group_size 1 with the softmax statistics kept in registers
// (PagedScoresShape::register_softmax; written 2026-12-04 after the H200 profile, not yet run
// on a GPU, so off by default). A row's 64 logits of a tile sit in the 16 lanes of one
// half-warp (tx = 0..15 of one ty), so its running max and sum are half-warp shuffles, kept in
// registers across both passes: no logits written to shared memory in pass 1 and no warp per
// row. In pass 2 each thread folds its 4 rows per key, the two ty of a warp by one shuffle,
// the 8 warps through shared memory, and 64 threads fold that into the scores in warp order.
// With group_size 1 every GQA reduction is the identity, so only the query reduction matters.
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kThreads)
    PagedScoresRegisterKernel(const T* __restrict__ k_cache,
                              const int32_t* __restrict__ block_tables,
                              const int32_t* __restrict__ lengths,
                              const int32_t* __restrict__ table_of_head,
                              const float* __restrict__ queries,  // [total_queries, head_dim]
                              const int32_t* __restrict__ query_offsets,
                              const int32_t* __restrict__ score_offsets,
                              const uint8_t* __restrict__ excluded, PagedScoresShape shape,
                              float scale, float* __restrict__ scores) {
  constexpr int kWarps = kThreads / 32;
  static_assert(kWarps * kKeys <= kRows * (kKeys + 1), "warp partials fit in s.p");
  extern __shared__ float4 smem_raw[];
  Smem<HEAD_DIM>& s = *reinterpret_cast<Smem<HEAD_DIM>*>(smem_raw);
  const HeadView view = ViewOfHead(block_tables, lengths, table_of_head, query_offsets,
                                   score_offsets, excluded, shape.max_blocks, scores);
  const auto& [n, q0, nq, table, out, skip] = view;
  const bool split = gridDim.y > 1;
  const bool max_query = shape.query == ScoreQuery::kMax;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int tx = threadIdx.x % kGroups, ty = threadIdx.x / kGroups;
  float* partial = &s.p[0][0];  // [kWarps][kKeys] in pass 2 (the key tile is dead by then)
  if (nq == 0) return ScoreHeadWithoutQueries(view, shape.excluded_score);
  for (int32_t cq = blockIdx.y * kRows; cq < nq; cq += gridDim.y * kRows) {
    const int rows = min(kRows, nq - cq);
    const float* qsrc = queries + (int64_t{q0} + cq) * HEAD_DIM;  // [rows, head_dim]
    __syncthreads();  // the previous chunk is done with s
    for (int i = threadIdx.x; i < kRows * HEAD_DIM; i += kThreads) {
      const int r = i / HEAD_DIM, d = i % HEAD_DIM;
      s.q[r][d] = r < rows ? MaybeBf16(qsrc[int64_t{r} * HEAD_DIM + d], shape.bf16) : 0.0f;
    }
    float row_max[kMicro], row_sum[kMicro];  // rows ty + 16a; the same in all 16 lanes
    for (int a = 0; a < kMicro; ++a) {
      row_max[a] = -FLT_MAX;
      row_sum[a] = 0.0f;
    }
    // Pass 1: per-row online max and sum of exponentials, in registers.
    for (int32_t j0 = 0; j0 < n; j0 += kKeys) {
      __syncthreads();  // s.k free
      LoadKeyTile<T, HEAD_DIM>(k_cache, table, skip, shape.block_size, j0, n, shape.bf16, s);
      __syncthreads();
      float acc[kMicro][kMicro];
      TileLogits<HEAD_DIM>(s, scale, acc);
      bool scored[kMicro];
      for (int b = 0; b < kMicro; ++b) scored[b] = s.scored[tx + kGroups * b] != 0;
      for (int a = 0; a < kMicro; ++a) {
        float m = -FLT_MAX;
        for (int b = 0; b < kMicro; ++b) {
          if (scored[b]) m = fmaxf(m, acc[a][b]);
        }
        for (int off = kGroups / 2; off > 0; off /= 2) {
          m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        }
        const float m_new = fmaxf(row_max[a], m);
        float sum = 0.0f;
        for (int b = 0; b < kMicro; ++b) {
          if (scored[b]) sum += expf(acc[a][b] - m_new);
        }
        for (int off = kGroups / 2; off > 0; off /= 2) {
          sum += __shfl_xor_sync(0xffffffffu, sum, off);
        }
        row_sum[a] = row_sum[a] * expf(row_max[a] - m_new) + sum;
        row_max[a] = m_new;
      }
    }
    float inv_sum[kMicro];
    for (int a = 0; a < kMicro; ++a) inv_sum[a] = 1.0f / row_sum[a];
    // Pass 2: probabilities, reduced over the chunk's rows per key, then into out.
    for (int32_t j0 = 0; j0 < n; j0 += kKeys) {
      __syncthreads();  // s.k and the partials free
      LoadKeyTile<T, HEAD_DIM>(k_cache, table, skip, shape.block_size, j0, n, shape.bf16, s);
      __syncthreads();
      float acc[kMicro][kMicro];
      TileLogits<HEAD_DIM>(s, scale, acc);
      float red[kMicro];  // per key tx + 16b: this thread's rows
      for (int b = 0; b < kMicro; ++b) {
        red[b] = 0.0f;
        for (int a = 0; a < kMicro; ++a) {
          if (ty + kGroups * a >= rows) continue;
          const float p = __fmul_rn(expf(acc[a][b] - row_max[a]), inv_sum[a]);
          red[b] = max_query ? fmaxf(red[b], p) : __fadd_rn(red[b], p);
        }
        const float other = __shfl_xor_sync(0xffffffffu, red[b], 16);  // the warp's other ty
        red[b] = max_query ? fmaxf(red[b], other) : __fadd_rn(red[b], other);
      }
      __syncthreads();  // every thread is done reading s.k: the partials may overwrite it
      if (lane < kGroups) {
        for (int b = 0; b < kMicro; ++b) partial[warp * kKeys + tx + kGroups * b] = red[b];
      }
      __syncthreads();
      const int32_t j = j0 + threadIdx.x;
      if (threadIdx.x < kKeys && j < n && !s.scored[threadIdx.x]) {
        if (blockIdx.y == 0) out[j] = shape.excluded_score;
      } else if (threadIdx.x < kKeys && j < n) {
        float v = partial[threadIdx.x];
        for (int w = 1; w < kWarps; ++w) {
          const float x = partial[w * kKeys + threadIdx.x];
          v = max_query ? fmaxf(v, x) : __fadd_rn(v, x);
        }
        float total = cq == 0 || split ? 0.0f : out[j];
        total = max_query ? fmaxf(total, v) : __fadd_rn(total, v);
        StoreChunkScore(out + j, total, shape.query, cq + rows == nq, nq, split);
      }
    }
  }
}

// out[score_offsets[h] ..] = 0 for every head: the start of the split kernel's atomicMax.
__global__ void ZeroScoresKernel(const int32_t* __restrict__ score_offsets,  // [num_heads + 1]
                                 float* __restrict__ scores) {
  const int32_t begin = score_offsets[blockIdx.x], end = score_offsets[blockIdx.x + 1];
  for (int32_t j = begin + threadIdx.x; j < end; j += blockDim.x) scores[j] = 0.0f;
}

// Thread blocks per head: a head's query chunks spread over up to kMaxBlocksPerHead blocks
// when the reduction over queries is a max (order-free) and the caller gave max_queries.
constexpr int kMaxBlocksPerHead = 16;
int BlocksPerHead(const PagedScoresShape& shape) {
  if (shape.query != ScoreQuery::kMax || shape.max_queries <= 0) return 1;
  const int chunk_queries = kRows / shape.group_size;
  const int chunks = (shape.max_queries + chunk_queries - 1) / chunk_queries;
  return chunks < kMaxBlocksPerHead ? chunks : kMaxBlocksPerHead;
}

template <typename T, int HEAD_DIM>
cudaError_t Launch(const T* k_cache, const int32_t* block_tables, const int32_t* lengths,
                   const int32_t* table_of_head, const float* queries, const int32_t* query_offsets,
                   const int32_t* score_offsets, const uint8_t* excluded,
                   const PagedScoresShape& shape, float* scores, cudaStream_t stream) {
  const bool in_registers = shape.register_softmax && shape.group_size == 1;
  const auto kernel =
      in_registers ? PagedScoresRegisterKernel<T, HEAD_DIM> : PagedScoresKernel<T, HEAD_DIM>;
  const size_t smem = sizeof(Smem<HEAD_DIM>);
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  // All of L1 as shared memory when it lets more blocks stay resident (the kernel reads the
  // keys once per tile into shared memory; it does not rely on L1 hits).
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
  if (err != cudaSuccess) return err;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HEAD_DIM));
  const int per_head = BlocksPerHead(shape);
  if (per_head > 1) ZeroScoresKernel<<<shape.num_heads, 256, 0, stream>>>(score_offsets, scores);
  const dim3 grid(shape.num_heads, per_head);
  kernel<<<grid, kThreads, smem, stream>>>(k_cache, block_tables, lengths, table_of_head, queries,
                                           query_offsets, score_offsets, excluded, shape, scale,
                                           scores);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PagedAttentionScores(const void* k_cache, KvDtype dtype, const int32_t* block_tables,
                                 const int32_t* lengths, const int32_t* table_of_head,
                                 const float* queries, const int32_t* query_offsets,
                                 const int32_t* score_offsets, const uint8_t* excluded,
                                 const PagedScoresShape& shape, float* scores,
                                 cudaStream_t stream) {
  if (shape.num_heads < 0 || shape.block_size < 1 || shape.max_blocks < 0 || shape.group_size < 1 ||
      shape.group_size > kRows || !ValidKvDtype(dtype)) {
    return cudaErrorInvalidValue;
  }
  if (shape.gqa != ScoreGqa::kMaxProbs && shape.gqa != ScoreGqa::kMeanProbs &&
      shape.gqa != ScoreGqa::kMaxLogits) {
    return cudaErrorInvalidValue;
  }
  if (shape.query != ScoreQuery::kMax && shape.query != ScoreQuery::kMean &&
      shape.query != ScoreQuery::kSum) {
    return cudaErrorInvalidValue;
  }
  if (shape.head_dim != 32 && shape.head_dim != 64 && shape.head_dim != 128 &&
      shape.head_dim != 256) {
    return cudaErrorInvalidValue;
  }
  if (shape.num_heads == 0) return cudaSuccess;
  // DISPATCH: storage type, then runtime head_dim -> template arguments.
  return DispatchKvDtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    const T* k = static_cast<const T*>(k_cache);
    switch (shape.head_dim) {
      case 32:
        return Launch<T, 32>(k, block_tables, lengths, table_of_head, queries, query_offsets,
                             score_offsets, excluded, shape, scores, stream);
      case 64:
        return Launch<T, 64>(k, block_tables, lengths, table_of_head, queries, query_offsets,
                             score_offsets, excluded, shape, scores, stream);
      case 128:
        return Launch<T, 128>(k, block_tables, lengths, table_of_head, queries, query_offsets,
                              score_offsets, excluded, shape, scores, stream);
      default:
        return Launch<T, 256>(k, block_tables, lengths, table_of_head, queries, query_offsets,
                              score_offsets, excluded, shape, scores, stream);
    }
  });
}

}  // namespace beaconkv::kernels

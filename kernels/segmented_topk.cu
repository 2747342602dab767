#include <algorithm>
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_segmented_sort.cuh>
#include <type_traits>

#include "kernels/segmented_topk.h"
#include "kernels/topk_key.h"

namespace beaconkv::kernels {
namespace {

// x, or its penalised score when a penalty is given (item i's value).
__device__ __forceinline__ float Penalised(float x, const TopKPenalty& penalty, int32_t i) {
  return penalty.values == nullptr ? x : PenalisedScore(x, penalty.values[i], penalty.lambda);
}

// Radix select's shared state: a 256-bin histogram of the next 8 bits of the keys that share
// the prefix chosen so far, and what warp 0 found in it.
struct SelectStorage {
  int32_t hist[256];
  int32_t candidates;  // nonzero keys of the segment
  uint32_t digit;      // the next 8 bits of the k-th largest key
  int32_t remaining;   // how many of the keys under the new prefix are among the k best
  int32_t done;        // 1: every key under the new prefix is among the k best
};

// Sets keep for the block's elements from their keys (blocked or striped, any arrangement):
// protected (key 0) kept, the kk largest nonzero keys kept, the rest not; index < 0 = padding.
// Keys are unique within a segment (the position is in the low bits), so the kk-th largest
// is a threshold: an 8-bit radix select from the top finds it, usually in 3-4 passes over
// registers (a pass ends the search once every key under the chosen prefix is needed).
template <int THREADS, int ITEMS>
__device__ void RadixSelectKeep(const uint64_t (&key)[ITEMS], const int32_t (&index)[ITEMS],
                                int32_t kk, int32_t begin, SelectStorage& st,
                                uint8_t* __restrict__ keep) {
  const int lane = threadIdx.x % 32;
  int32_t mine = 0;
  for (int i = 0; i < ITEMS; ++i) mine += key[i] != 0;
  for (int off = 16; off > 0; off /= 2) mine += __shfl_xor_sync(0xffffffffu, mine, off);
  if (threadIdx.x == 0) st.candidates = 0;
  __syncthreads();
  if (lane == 0 && mine > 0) atomicAdd(&st.candidates, mine);
  __syncthreads();
  const int32_t candidates = st.candidates;
  int shift = 64;
  uint64_t prefix = 0;
  if (kk > 0 && kk < candidates) {
    int32_t remaining = kk;
    for (;;) {
      shift -= 8;
      for (int b = threadIdx.x; b < 256; b += THREADS) st.hist[b] = 0;
      __syncthreads();
      const uint64_t high = shift + 8 >= 64 ? 0 : ~uint64_t{0} << (shift + 8);
      for (int i = 0; i < ITEMS; ++i) {
        const bool in = key[i] != 0 && (key[i] & high) == prefix;
        const int bin = in ? static_cast<int>((key[i] >> shift) & 255) : -1;
        // Lanes with the same bin add once (scores of a head share their top bits).
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (in && lane == __ffs(peers) - 1) atomicAdd(&st.hist[bin], __popc(peers));
      }
      __syncthreads();
      if (threadIdx.x < 32) {  // lane l owns bins 8l .. 8l + 7; count what lies above each
        int32_t c[8], sum = 0;
        for (int j = 0; j < 8; ++j) sum += (c[j] = st.hist[8 * lane + j]);
        int32_t upto = sum;  // bins of this lane and every lane above it
        for (int off = 1; off < 32; off *= 2) {
          const int32_t v = __shfl_down_sync(0xffffffffu, upto, off);
          if (lane + off < 32) upto += v;
        }
        int32_t above = upto - sum;
        if (above < remaining && remaining <= upto) {
          for (int j = 7; j >= 0; --j) {
            if (above + c[j] >= remaining) {
              st.digit = static_cast<uint32_t>(8 * lane + j);
              st.remaining = remaining - above;
              st.done = c[j] == remaining - above;
              break;
            }
            above += c[j];
          }
        }
      }
      __syncthreads();
      prefix |= uint64_t{st.digit} << shift;
      remaining = st.remaining;
      const bool done = st.done != 0;
      __syncthreads();  // st read by every thread before the next pass rewrites it
      if (done) break;  // the same for every thread; shift 0 always ends (keys are unique)
    }
  }
  for (int i = 0; i < ITEMS; ++i) {
    if (index[i] < 0) continue;
    bool kept;
    if (key[i] == 0) {
      kept = true;
    } else if (kk <= 0 || kk >= candidates) {
      kept = kk > 0;
    } else {
      kept = (key[i] >> shift) >= (prefix >> shift);
    }
    keep[begin + index[i]] = kept ? 1 : 0;
  }
}

// One thread block per segment; the whole segment (<= THREADS * ITEMS elements) sits in
// registers. SELECT: radix select of the k-th best key (RadixSelectKeep); otherwise a full
// BlockRadixSort of the keys, kept while the rank is below k. With pooling, a first sort by
// position puts the scores in position order in shared memory, where the window is read.
template <int THREADS, int ITEMS, bool SELECT>
__global__ void __launch_bounds__(THREADS)
    BlockTopKKernel(const int32_t* __restrict__ offsets,    // [num_segments + 1]
                    const float* __restrict__ scores,       // [num_items]
                    const int32_t* __restrict__ positions,  // [num_items]
                    const uint8_t* __restrict__ protect,    // [num_items]
                    const int32_t* __restrict__ k,          // [num_segments]
                    TopKPooling pooling, int32_t pool_kernel, TopKPenalty penalty,
                    uint8_t* __restrict__ keep) {  // [num_items]
  constexpr int kTile = THREADS * ITEMS;
  using PositionSort = cub::BlockRadixSort<uint32_t, THREADS, ITEMS, int32_t>;
  using ScoreSort = cub::BlockRadixSort<uint64_t, THREADS, ITEMS, int32_t>;
  struct NoSort {};
  using ScoreStorage = std::conditional_t<SELECT, NoSort, typename ScoreSort::TempStorage>;
  // raw ([n] scores in position order, pooling only) lives between the two sorts, so it
  // shares their storage; barriers separate the three uses.
  __shared__ union {
    typename PositionSort::TempStorage position;
    ScoreStorage score;
    float raw[kTile];
  } temp;
  __shared__ SelectStorage select;
  float* raw = temp.raw;

  const int32_t begin = offsets[blockIdx.x];
  const int32_t n = offsets[blockIdx.x + 1] - begin;
  if (n > kTile) __trap();  // the host was given a wrong max_segment_len

  uint64_t key[ITEMS];   // [ITEMS] sort keys
  int32_t index[ITEMS];  // [ITEMS] element index within the segment; -1 = padding
  if (pooling != TopKPooling::kNone && pool_kernel > 1) {
    const int32_t first = threadIdx.x * ITEMS;  // blocked arrangement: rank first + i
    uint32_t pos[ITEMS];                        // [ITEMS]
    for (int i = 0; i < ITEMS; ++i) {
      const int32_t e = first + i;
      index[i] = e < n ? e : -1;
      pos[i] = e < n ? static_cast<uint32_t>(positions[begin + e]) : 0xffffffffu;
    }
    PositionSort(temp.position).Sort(pos, index);
    __syncthreads();  // the sort's last reads of temp are done before raw overwrites it
    for (int i = 0; i < ITEMS; ++i) {
      if (index[i] >= 0) raw[first + i] = scores[begin + index[i]];
    }
    __syncthreads();  // raw complete
    for (int i = 0; i < ITEMS; ++i) {
      key[i] = index[i] < 0
                   ? 0
                   : TopKSortKey(Penalised(PoolWindow(raw, first + i, n,
                                                      pooling == TopKPooling::kMax, pool_kernel),
                                           penalty, begin + index[i]),
                                 static_cast<int32_t>(pos[i]), protect[begin + index[i]]);
    }
    __syncthreads();  // raw read; temp free for the score sort
  } else {
    for (int i = 0; i < ITEMS; ++i) {
      const int32_t e = i * THREADS + threadIdx.x;  // striped: coalesced loads
      index[i] = e < n ? e : -1;
      key[i] = e < n ? TopKSortKey(Penalised(scores[begin + e], penalty, begin + e),
                                   positions[begin + e], protect[begin + e])
                     : 0;
    }
  }
  const int32_t kk = k[blockIdx.x];
  if constexpr (SELECT) {
    RadixSelectKeep<THREADS, ITEMS>(key, index, kk, begin, select, keep);
  } else {
    ScoreSort(temp.score).SortDescending(key, index);
    // Rank first + i: candidates (key != 0) are kept while the rank is below k; protected
    // elements are kept; padding is skipped. Each element is written exactly once.
    const int32_t first = threadIdx.x * ITEMS;
    for (int i = 0; i < ITEMS; ++i) {
      if (index[i] < 0) continue;
      keep[begin + index[i]] = (key[i] == 0 || first + i < kk) ? 1 : 0;
    }
  }
}

// ---- DeviceSegmentedSort path: one pass per step over global memory. ----

// One thread block per segment for the helpers below; threads stride over its elements.
__global__ void IotaKernel(const int32_t* __restrict__ offsets,  // [num_segments + 1]
                           int32_t* __restrict__ out) {          // [num_items]
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) out[begin + i] = i;
}

// Per segment: gathers the scores into position order (`ordered`), then
// pooled[order[r]] = PoolWindow(ordered, r), penalised when a penalty is given.
__global__ void PoolKernel(const int32_t* __restrict__ offsets,  // [num_segments + 1]
                           const float* __restrict__ scores,     // [num_items]
                           const int32_t* __restrict__ order,    // [num_items] by position
                           TopKPooling pooling, int32_t kernel, TopKPenalty penalty,
                           float* __restrict__ ordered,   // [num_items] scratch
                           float* __restrict__ pooled) {  // [num_items]
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  for (int32_t r = threadIdx.x; r < n; r += blockDim.x) {
    ordered[begin + r] = scores[begin + order[begin + r]];
  }
  __syncthreads();  // the block's global writes are visible to the block after the barrier
  for (int32_t r = threadIdx.x; r < n; r += blockDim.x) {
    const int32_t i = begin + order[begin + r];
    pooled[i] = Penalised(PoolWindow(ordered + begin, r, n, pooling == TopKPooling::kMax, kernel),
                          penalty, i);
  }
}

__global__ void KeyKernel(const int32_t* __restrict__ offsets,    // [num_segments + 1]
                          const float* __restrict__ scores,       // [num_items]
                          const int32_t* __restrict__ positions,  // [num_items]
                          const uint8_t* __restrict__ protect,    // [num_items]
                          TopKPenalty penalty,            // applied here when no pooling pass did
                          uint64_t* __restrict__ keys) {  // [num_items]
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  for (int32_t i = begin + threadIdx.x; i < begin + n; i += blockDim.x) {
    keys[i] = TopKSortKey(Penalised(scores[i], penalty, i), positions[i], protect[i]);
  }
}

__global__ void MarkKernel(const int32_t* __restrict__ offsets,  // [num_segments + 1]
                           const uint64_t* __restrict__ keys,    // [num_items] sorted
                           const int32_t* __restrict__ index,    // [num_items] sorted
                           const int32_t* __restrict__ k,        // [num_segments]
                           uint8_t* __restrict__ keep) {         // [num_items]
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  const int32_t kk = k[blockIdx.x];
  for (int32_t r = threadIdx.x; r < n; r += blockDim.x) {
    keep[begin + index[begin + r]] = (keys[begin + r] == 0 || r < kk) ? 1 : 0;
  }
}

constexpr size_t kAlign = 256;
size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Carves typed arrays out of one scratch allocation (or only counts bytes when base is null).
class ScratchCarver {
 public:
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* Take(size_t count) {
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += AlignUp(count * sizeof(T));
    return p;
  }
  void* TakeBytes(size_t bytes) { return Take<char>(bytes); }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t used_ = 0;
};

cudaError_t SegmentedSortTopK(void* temp, size_t* temp_bytes, const int32_t* offsets,
                              const float* scores, const int32_t* positions, const uint8_t* protect,
                              const int32_t* k, const SegmentedTopKShape& s, uint8_t* keep,
                              cudaStream_t stream) {
  const bool pool = s.pooling != TopKPooling::kNone && s.pool_kernel > 1;
  const int64_t items = s.num_items;
  // CUB's own scratch: the larger of the two sorts' needs.
  size_t cub_bytes = 0, bytes = 0;
  cudaError_t err = cub::DeviceSegmentedSort::SortPairsDescending(
      nullptr, bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items, s.num_segments,
      offsets, offsets + 1, stream);
  if (err != cudaSuccess) return err;
  cub_bytes = bytes;
  if (pool) {
    err = cub::DeviceSegmentedSort::SortPairs(
        nullptr, bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), items, s.num_segments,
        offsets, offsets + 1, stream);
    if (err != cudaSuccess) return err;
    cub_bytes = std::max(cub_bytes, bytes);
  }
  ScratchCarver carve(temp);
  uint64_t* keys_in = carve.Take<uint64_t>(items);   // [num_items]
  uint64_t* keys_out = carve.Take<uint64_t>(items);  // [num_items]
  int32_t* iota = carve.Take<int32_t>(items);        // [num_items] index within segment
  int32_t* index = carve.Take<int32_t>(items);       // [num_items] sorted indexes
  int32_t* sorted_pos = pool ? carve.Take<int32_t>(items) : nullptr;  // [num_items]
  float* pooled = pool ? carve.Take<float>(items) : nullptr;          // [num_items]
  float* ordered = pool ? carve.Take<float>(items) : nullptr;         // [num_items]
  void* cub_temp = carve.TakeBytes(cub_bytes);
  if (temp == nullptr) {
    *temp_bytes = std::max<size_t>(carve.used(), 16);
    return cudaSuccess;
  }
  if (*temp_bytes < carve.used()) return cudaErrorInvalidValue;
  if (s.num_segments == 0) return cudaSuccess;

  constexpr int kThreads = 256;
  IotaKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, iota);
  if (pool) {
    // index = element indexes in position order (positions are >= 0, so int32 order works).
    bytes = cub_bytes;
    err = cub::DeviceSegmentedSort::SortPairs(cub_temp, bytes, positions, sorted_pos, iota, index,
                                              items, s.num_segments, offsets, offsets + 1, stream);
    if (err != cudaSuccess) return err;
    PoolKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, scores, index, s.pooling,
                                                        s.pool_kernel, s.penalty, ordered, pooled);
    scores = pooled;
  }
  KeyKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, scores, positions, protect,
                                                     pool ? TopKPenalty{} : s.penalty, keys_in);
  bytes = cub_bytes;
  err = cub::DeviceSegmentedSort::SortPairsDescending(cub_temp, bytes, keys_in, keys_out, iota,
                                                      index, items, s.num_segments, offsets,
                                                      offsets + 1, stream);
  if (err != cudaSuccess) return err;
  MarkKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, keys_out, index, k, keep);
  return cudaGetLastError();
}

template <int THREADS, int ITEMS>
cudaError_t LaunchBlockTopK(const int32_t* offsets, const float* scores, const int32_t* positions,
                            const uint8_t* protect, const int32_t* k, const SegmentedTopKShape& s,
                            bool select, uint8_t* keep, cudaStream_t stream) {
  if (select) {
    BlockTopKKernel<THREADS, ITEMS, true><<<s.num_segments, THREADS, 0, stream>>>(
        offsets, scores, positions, protect, k, s.pooling, s.pool_kernel, s.penalty, keep);
  } else {
    BlockTopKKernel<THREADS, ITEMS, false><<<s.num_segments, THREADS, 0, stream>>>(
        offsets, scores, positions, protect, k, s.pooling, s.pool_kernel, s.penalty, keep);
  }
  return cudaGetLastError();
}

// The reserved region's round, per segment: everything protected or outside the region is
// taken (taken = protect | !mask), and the region gets min(reserve_k, k) picks.
__global__ void ReserveRoundKernel(const int32_t* __restrict__ offsets,    // [num_segments + 1]
                                   const uint8_t* __restrict__ protect,    // [num_items]
                                   const uint8_t* __restrict__ mask,       // [num_items]
                                   const int32_t* __restrict__ k,          // [num_segments]
                                   const int32_t* __restrict__ reserve_k,  // [num_segments]
                                   uint8_t* __restrict__ taken,            // [num_items]
                                   int32_t* __restrict__ picks) {          // [num_segments]
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  for (int32_t i = begin + threadIdx.x; i < begin + n; i += blockDim.x) {
    taken[i] = protect[i] || !mask[i] ? 1 : 0;
  }
  if (threadIdx.x == 0) picks[blockIdx.x] = min(reserve_k[blockIdx.x], k[blockIdx.x]);
}

// The open round, per segment: the region's winners join the protected elements, and the
// picks left are k minus their number.
__global__ void OpenRoundKernel(const int32_t* __restrict__ offsets,  // [num_segments + 1]
                                const uint8_t* __restrict__ protect,  // [num_items]
                                const uint8_t* __restrict__ mask,     // [num_items]
                                const uint8_t* __restrict__ won,      // [num_items] region round
                                const int32_t* __restrict__ k,        // [num_segments]
                                uint8_t* __restrict__ taken,          // [num_items]
                                int32_t* __restrict__ picks) {        // [num_segments]
  __shared__ int32_t count;
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  const int32_t begin = offsets[blockIdx.x], n = offsets[blockIdx.x + 1] - begin;
  int32_t mine = 0;
  for (int32_t i = begin + threadIdx.x; i < begin + n; i += blockDim.x) {
    const bool reserved = !protect[i] && mask[i] && won[i];
    taken[i] = protect[i] || reserved ? 1 : 0;
    mine += reserved;
  }
  if (mine > 0) atomicAdd(&count, mine);
  __syncthreads();
  if (threadIdx.x == 0) picks[blockIdx.x] = k[blockIdx.x] - count;
}

// One selection without a reserved region (s.reserve is ignored).
cudaError_t SelectOnce(void* temp, size_t* temp_bytes, const int32_t* offsets, const float* scores,
                       const int32_t* positions, const uint8_t* protect, const int32_t* k,
                       const SegmentedTopKShape& s, TopKAlgorithm algorithm, uint8_t* keep,
                       cudaStream_t stream) {
  if (algorithm == TopKAlgorithm::kAuto) {
    algorithm = s.max_segment_len <= kMaxBlockTopKSegment ? TopKAlgorithm::kBlockRadixSelect
                                                          : TopKAlgorithm::kSegmentedSort;
  }
  if (algorithm == TopKAlgorithm::kSegmentedSort) {
    return SegmentedSortTopK(temp, temp_bytes, offsets, scores, positions, protect, k, s, keep,
                             stream);
  }
  const bool select = algorithm == TopKAlgorithm::kBlockRadixSelect;
  if ((!select && algorithm != TopKAlgorithm::kBlockRadixSort) ||
      s.max_segment_len > kMaxBlockTopKSegment) {
    return cudaErrorInvalidValue;
  }
  if (temp == nullptr) {
    *temp_bytes = 16;  // the block path needs no scratch
    return cudaSuccess;
  }
  if (s.num_segments == 0) return cudaSuccess;
  // DISPATCH: the segment bound -> tile shape (threads x items per thread).
  const int32_t m = s.max_segment_len;
  if (m <= 256)
    return LaunchBlockTopK<128, 2>(offsets, scores, positions, protect, k, s, select, keep, stream);
  if (m <= 1024)
    return LaunchBlockTopK<256, 4>(offsets, scores, positions, protect, k, s, select, keep, stream);
  if (m <= 2304)
    return LaunchBlockTopK<256, 9>(offsets, scores, positions, protect, k, s, select, keep, stream);
  return LaunchBlockTopK<512, 8>(offsets, scores, positions, protect, k, s, select, keep, stream);
}

}  // namespace

cudaError_t SegmentedTopK(void* temp, size_t* temp_bytes, const int32_t* offsets,
                          const float* scores, const int32_t* positions, const uint8_t* protect,
                          const int32_t* k, const SegmentedTopKShape& s, TopKAlgorithm algorithm,
                          uint8_t* keep, cudaStream_t stream) {
  if (temp_bytes == nullptr || s.num_segments < 0 || s.num_items < 0 || s.max_segment_len < 0 ||
      s.pool_kernel < 1 || s.pool_kernel % 2 == 0) {
    return cudaErrorInvalidValue;
  }
  if (s.pooling != TopKPooling::kNone && s.pooling != TopKPooling::kMax &&
      s.pooling != TopKPooling::kAvg) {
    return cudaErrorInvalidValue;
  }
  if (s.reserve.mask == nullptr) {
    return SelectOnce(temp, temp_bytes, offsets, scores, positions, protect, k, s, algorithm, keep,
                      stream);
  }
  if (s.reserve.k == nullptr) return cudaErrorInvalidValue;
  // Two selections over the same scores: the region's round (the rest counts as taken), then
  // the open round with the region's winners taken. Each is the one-round selection, so every
  // algorithm gives the twin's mask here too.
  size_t inner_bytes = 0;
  cudaError_t err = SelectOnce(nullptr, &inner_bytes, offsets, scores, positions, protect, k, s,
                               algorithm, keep, stream);
  if (err != cudaSuccess) return err;
  ScratchCarver carve(temp);
  uint8_t* taken = carve.Take<uint8_t>(s.num_items);     // [num_items]
  uint8_t* won = carve.Take<uint8_t>(s.num_items);       // [num_items] the region's round
  int32_t* picks = carve.Take<int32_t>(s.num_segments);  // [num_segments]
  void* inner = carve.TakeBytes(inner_bytes);
  if (temp == nullptr) {
    *temp_bytes = std::max<size_t>(carve.used(), 16);
    return cudaSuccess;
  }
  if (*temp_bytes < carve.used()) return cudaErrorInvalidValue;
  if (s.num_segments == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  ReserveRoundKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, protect, s.reserve.mask, k,
                                                              s.reserve.k, taken, picks);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  size_t bytes = inner_bytes;
  if ((err = SelectOnce(inner, &bytes, offsets, scores, positions, taken, picks, s, algorithm, won,
                        stream)) != cudaSuccess)
    return err;
  OpenRoundKernel<<<s.num_segments, kThreads, 0, stream>>>(offsets, protect, s.reserve.mask, won, k,
                                                           taken, picks);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  bytes = inner_bytes;
  return SelectOnce(inner, &bytes, offsets, scores, positions, taken, picks, s, algorithm, keep,
                    stream);
}

}  // namespace beaconkv::kernels

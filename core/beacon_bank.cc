#include "core/beacon_bank.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/check.h"
#include "core/multiversion.h"

namespace beaconkv {
namespace {

// Points per block. The FPS passes read the unit vectors block by block, each block stored as
// [dim][kBlock] floats (64 points x 32 dims = 8 KB, contiguous): a pass streams memory in
// order and a block's cosines are `dim` FMAs per lane, no horizontal sums.
constexpr int32_t kBlock = 64;

int32_t Padded(int32_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// One pass over the first Padded(n) slots: min_dist = min(min_dist, 1 - cos(point, v)), cos =
// the FMA chain over d of unit[d] * v[d] (d = 0, 1, ...); returns the largest min_dist.
// min_dist is padded to whole blocks; padding and chosen points hold -1, below every
// distance, so they never win the max. Every ISA path computes the same chain per point, so
// the result does not depend on the machine.
using UpdateFn = float (*)(const float* blocked, int32_t n, int32_t dim, const float* v,
                           float* min_dist);
// For every block below Padded(n): bit l of eq[block] set when slot block * 64 + l holds
// `value` (the slots a pick chooses among, found without a scalar scan).
using EqualFn = void (*)(const float* min_dist, int32_t n, float value, uint64_t* eq);

struct FpsKernels {
  UpdateFn update;
  EqualFn equal;
};

#if defined(__x86_64__)
// min_dist[0, 16) = min(min_dist, 1 - acc); returns max(vmax, the new values).
__attribute__((target("avx512f"))) inline __m512 FinishLanesAvx512(__m512 acc, float* min_dist,
                                                                   __m512 vmax) {
  const __m512 m =
      _mm512_min_ps(_mm512_loadu_ps(min_dist), _mm512_sub_ps(_mm512_set1_ps(1.0f), acc));
  _mm512_storeu_ps(min_dist, m);
  return _mm512_max_ps(vmax, m);
}

__attribute__((target("avx512f"))) float UpdateAvx512(const float* blocked, int32_t n, int32_t dim,
                                                      const float* v, float* min_dist) {
  __m512 vmax = _mm512_set1_ps(-1.0f);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* x = blocked + static_cast<size_t>(i0) * dim;
    // Named accumulators, not an array: GCC kept an array on the stack, so every FMA went
    // through a store and a reload (3x slower). (Two blocks at a time, eight chains, measured
    // no faster: the loads, not the FMA latency, bound this loop.)
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(),
           a3 = _mm512_setzero_ps();
    for (int32_t d = 0; d < dim; ++d) {
      const __m512 vd = _mm512_set1_ps(v[d]);
      const float* cx = x + static_cast<size_t>(d) * kBlock;
      a0 = _mm512_fmadd_ps(_mm512_loadu_ps(cx), vd, a0);
      a1 = _mm512_fmadd_ps(_mm512_loadu_ps(cx + 16), vd, a1);
      a2 = _mm512_fmadd_ps(_mm512_loadu_ps(cx + 32), vd, a2);
      a3 = _mm512_fmadd_ps(_mm512_loadu_ps(cx + 48), vd, a3);
    }
    vmax = FinishLanesAvx512(a0, min_dist + i0, vmax);
    vmax = FinishLanesAvx512(a1, min_dist + i0 + 16, vmax);
    vmax = FinishLanesAvx512(a2, min_dist + i0 + 32, vmax);
    vmax = FinishLanesAvx512(a3, min_dist + i0 + 48, vmax);
  }
  float lanes[16];  // (_mm512_reduce_max_ps trips GCC 12's -Wuninitialized)
  _mm512_storeu_ps(lanes, vmax);
  return *std::max_element(lanes, lanes + 16);
}

__attribute__((target("avx512f"))) void EqualAvx512(const float* min_dist, int32_t n, float value,
                                                    uint64_t* eq) {
  const __m512 x = _mm512_set1_ps(value);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    uint64_t bits = 0;
    for (int32_t q = 0; q < 4; ++q) {
      const __m512 m = _mm512_loadu_ps(min_dist + i0 + 16 * q);
      bits |= uint64_t{_mm512_cmp_ps_mask(m, x, _CMP_EQ_OQ)} << (16 * q);
    }
    eq[i0 / kBlock] = bits;
  }
}

__attribute__((target("avx2,fma"))) float UpdateAvx2(const float* blocked, int32_t n, int32_t dim,
                                                     const float* v, float* min_dist) {
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 vmax = _mm256_set1_ps(-1.0f);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    const float* block = blocked + static_cast<size_t>(i0) * dim;
    for (int32_t half = 0; half < 2; ++half) {  // 32 points at a time: 4 accumulators of 8
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps();
      for (int32_t d = 0; d < dim; ++d) {
        const __m256 vd = _mm256_set1_ps(v[d]);
        const float* col = block + static_cast<size_t>(d) * kBlock + 32 * half;
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(col), vd, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 8), vd, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 16), vd, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(col + 24), vd, a3);
      }
      const __m256 acc[4] = {a0, a1, a2, a3};
      for (int32_t q = 0; q < 4; ++q) {
        float* md = min_dist + i0 + 32 * half + 8 * q;
        const __m256 m = _mm256_min_ps(_mm256_loadu_ps(md), _mm256_sub_ps(one, acc[q]));
        _mm256_storeu_ps(md, m);
        vmax = _mm256_max_ps(vmax, m);
      }
    }
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, vmax);
  return *std::max_element(lanes, lanes + 8);
}

__attribute__((target("avx2"))) void EqualAvx2(const float* min_dist, int32_t n, float value,
                                               uint64_t* eq) {
  const __m256 x = _mm256_set1_ps(value);
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    uint64_t bits = 0;
    for (int32_t q = 0; q < 8; ++q) {
      const __m256 m = _mm256_loadu_ps(min_dist + i0 + 8 * q);
      const auto mask = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(m, x, _CMP_EQ_OQ)));
      bits |= uint64_t{mask} << (8 * q);
    }
    eq[i0 / kBlock] = bits;
  }
}
#endif

float UpdatePortable(const float* blocked, int32_t n, int32_t dim, const float* v,
                     float* min_dist) {
  float far = -1.0f;
  for (int32_t i = 0; i < Padded(n); ++i) {
    const float* col = blocked + static_cast<size_t>(i / kBlock) * dim * kBlock + i % kBlock;
    float acc = 0.0f;
    for (int32_t d = 0; d < dim; ++d)
      acc = std::fma(col[static_cast<size_t>(d) * kBlock], v[d], acc);
    min_dist[i] = std::min(min_dist[i], 1.0f - acc);
    far = std::max(far, min_dist[i]);
  }
  return far;
}

void EqualPortable(const float* min_dist, int32_t n, float value, uint64_t* eq) {
  for (int32_t b = 0; b < Padded(n) / kBlock; ++b) {
    uint64_t bits = 0;
    for (int32_t l = 0; l < kBlock; ++l) bits |= uint64_t{min_dist[b * kBlock + l] == value} << l;
    eq[b] = bits;
  }
}

bool Supported(internal::FpsKernel kernel) {
  switch (kernel) {
    case internal::FpsKernel::kPortable:
      return true;
#if defined(__x86_64__)
    case internal::FpsKernel::kAvx2:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case internal::FpsKernel::kAvx512:
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

FpsKernels Kernel(internal::FpsKernel kernel) {
  switch (kernel) {
#if defined(__x86_64__)
    case internal::FpsKernel::kAvx512:
      return {UpdateAvx512, EqualAvx512};
    case internal::FpsKernel::kAvx2:
      return {UpdateAvx2, EqualAvx2};
#endif
    default:
      return {UpdatePortable, EqualPortable};
  }
}

// The fastest kernels this machine runs (all give the same result).
FpsKernels PickKernels() {
  for (internal::FpsKernel k : {internal::FpsKernel::kAvx512, internal::FpsKernel::kAvx2}) {
    if (Supported(k)) return Kernel(k);
  }
  return Kernel(internal::FpsKernel::kPortable);
}

// The sum of the unit-normalised `points` ([n, dim]; zero rows stay zero) in double ([dim]):
// per dimension, each block of 64 points summed in index order, then the blocks in order.
// Point i with slot[i] >= 0 is also written, unit-normalised, to that slot of `blocked` (the
// blocked layout: element (s, d) at (s / kBlock) * dim * kBlock + d * kBlock + s % kBlock;
// the caller zero-fills it).
void PackUnit(const float* points, int32_t n, int32_t dim, const std::vector<int32_t>& slot,
              std::vector<float>* blocked, std::vector<double>* sum) {
  sum->assign(dim, 0.0);
  std::vector<float> unit(dim);
  std::vector<double> part(dim);
  for (int32_t b = 0; b * kBlock < n; ++b) {
    std::fill(part.begin(), part.end(), 0.0);
    for (int32_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) {
      const float* p = points + static_cast<size_t>(i) * dim;
      // Four independent partial sums of the squared norm (one serial chain is 4x slower).
      double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
      int32_t d = 0;
      for (; d + 4 <= dim; d += 4) {
        s0 += static_cast<double>(p[d]) * p[d];
        s1 += static_cast<double>(p[d + 1]) * p[d + 1];
        s2 += static_cast<double>(p[d + 2]) * p[d + 2];
        s3 += static_cast<double>(p[d + 3]) * p[d + 3];
      }
      for (; d < dim; ++d) s0 += static_cast<double>(p[d]) * p[d];
      const double sq = (s0 + s1) + (s2 + s3);
      const float inv = sq > 0.0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
      // Separate loops over d so the contiguous ones vectorise; only the scatter is strided.
      for (d = 0; d < dim; ++d) unit[d] = p[d] * inv;
      for (d = 0; d < dim; ++d) part[d] += unit[d];
      if (slot[i] < 0) continue;
      float* out =
          blocked->data() + static_cast<size_t>(slot[i] / kBlock) * dim * kBlock + slot[i] % kBlock;
      for (d = 0; d < dim; ++d) out[static_cast<size_t>(d) * kBlock] = unit[d];
    }
    for (int32_t d = 0; d < dim; ++d) (*sum)[d] += part[d];
  }
}

// Groups bitwise-equal rows of `points` ([n, dim]): `first` lists the first index of each
// distinct row (ascending); copies[k] the later indexes equal to row first[k] (ascending).
// A multiply-add hash of each row's words and an open-addressed table (rows are compared in
// full on a hash match): a few microseconds for 512 rows of 32, no allocation per row.
void GroupDuplicates(const float* points, int32_t n, int32_t dim, std::vector<int32_t>* first,
                     std::vector<std::vector<int32_t>>* copies) {
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  auto row = [&](int32_t i) { return points + static_cast<size_t>(i) * dim; };
  size_t cap = 16;
  while (cap < 2 * static_cast<size_t>(n)) cap *= 2;
  std::vector<int32_t> table(cap, -1);  // distinct group id, -1 = empty
  std::vector<uint64_t> group_hash;
  for (int32_t i = 0; i < n; ++i) {
    uint64_t h = 0;
    const float* p = row(i);
    for (int32_t d = 0; d < dim; ++d) {
      uint32_t w;
      std::memcpy(&w, p + d, sizeof(w));
      h += (uint64_t{w} + 1) * (0x9E3779B97F4A7C15ull + 2 * static_cast<uint64_t>(d));
    }
    h ^= h >> 29;
    size_t at = static_cast<size_t>(h * 0xBF58476D1CE4E5B9ull) & (cap - 1);
    for (;; at = (at + 1) & (cap - 1)) {
      const int32_t g = table[at];
      if (g < 0) {
        table[at] = static_cast<int32_t>(first->size());
        first->push_back(i);
        copies->emplace_back();
        group_hash.push_back(h);
        break;
      }
      if (group_hash[g] == h && std::memcmp(row((*first)[g]), p, row_bytes) == 0) {
        (*copies)[g].push_back(i);
        break;
      }
    }
  }
}

BKV_MULTIVERSION float MaxOf(const float* x, int32_t n) {
  float lanes[16];
  std::fill(lanes, lanes + 16, -1.0f);
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int32_t l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  }
  float m = -1.0f;
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (float l : lanes) m = std::max(m, l);
  return m;
}

}  // namespace

namespace internal {

bool FpsKernelSupported(FpsKernel kernel) {
  return kernel == FpsKernel::kAuto || Supported(kernel);
}

std::vector<int32_t> FpsOrder(const float* points, int32_t n, int32_t dim, int32_t count,
                              FpsKernel kernel, bool dedupe, std::vector<uint8_t>* is_copy) {
  BKV_CHECK(count >= 0 && count <= n);
  std::vector<int32_t> order;
  if (is_copy != nullptr) is_copy->clear();
  if (count == 0) return order;
  order.reserve(count);
  static const FpsKernels best = PickKernels();
  BKV_CHECK(FpsKernelSupported(kernel));
  const FpsKernels fn = kernel == FpsKernel::kAuto ? best : Kernel(kernel);
  // Exact duplicates (layer 0's queries are a function of the token alone) take one slot:
  // copies of a point have the same distance to everything at every step, so the earliest is
  // picked first, the pass after it gives the rest 1 - cos(u, u), and each later copy is
  // picked when that is the largest distance left (ties again to the earliest point). Their
  // picks then need no pass: a copy's cosines were all applied with the first one.
  std::vector<int32_t> first;
  std::vector<std::vector<int32_t>> copies;
  if (dedupe) {
    GroupDuplicates(points, n, dim, &first, &copies);
  } else {
    first.resize(n);
    std::iota(first.begin(), first.end(), 0);
    copies.resize(n);
  }
  const auto m = static_cast<int32_t>(first.size());  // slots
  const int32_t stride = Padded(m);
  std::vector<int32_t> slot_of(n, -1);
  for (int32_t k = 0; k < m; ++k) slot_of[first[k]] = k;
  std::vector<float> blocked(static_cast<size_t>(stride) * dim, 0.0f);
  std::vector<double> sum;
  PackUnit(points, n, dim, slot_of, &blocked, &sum);
  auto at = [&](int32_t i, int32_t d) -> float& {
    return blocked[static_cast<size_t>(i / kBlock) * dim * kBlock +
                   static_cast<size_t>(d) * kBlock + i % kBlock];
  };
  constexpr float kChosen = -1.0f;
  std::vector<float> min_dist(stride, kChosen);
  float* md = min_dist.data();
  std::vector<float> v(dim, 0.0f);
  // The slots still holding an unchosen point are the first `active`; a slot whose points are
  // all chosen is swapped to the end of that range (slot order is then no longer index order:
  // `index` maps a slot to its next point, `group` to its row group), so each pass covers only
  // the points that can still be picked and the work per draw falls from count * n to about
  // count * (n - count / 2) cosines.
  std::vector<int32_t> index(stride, 0), group(stride, 0), picked(m, 0);
  for (int32_t k = 0; k < m; ++k) index[k] = first[k], group[k] = k;
  int32_t active = m;
  // The slot holding the pick: among the active slots whose distance is `far`, the one of
  // the earliest point (the tie rule). One vector compare per 16 slots finds them.
  std::vector<uint64_t> eq(stride / kBlock, 0);
  auto pick_at = [&](float far) {
    fn.equal(md, active, far, eq.data());
    int32_t best = -1;
    for (int32_t b = 0; b * kBlock < active; ++b) {
      for (uint64_t bits = eq[b]; bits != 0; bits &= bits - 1) {
        const int32_t i = b * kBlock + std::countr_zero(bits);
        if (i < active && (best < 0 || index[i] < index[best])) best = i;
      }
    }
    BKV_CHECK(best >= 0);
    return best;
  };

  // Seed: the point farthest from the direction of the mean of the unit vectors, found with
  // the same pass as a pick (min_dist starts at 2, so it becomes 1 - cos).
  double sq = 0.0;
  for (double x : sum) sq += x * x;
  if (sq > 0.0) {
    for (int32_t d = 0; d < dim; ++d) v[d] = static_cast<float>(sum[d] / std::sqrt(sq));
  }
  std::fill_n(md, m, 2.0f);
  float far = fn.update(blocked.data(), m, dim, v.data(), md);
  int32_t slot = pick_at(far);
  std::fill_n(md, m, 2.0f);

  // Each pick: emit the slot's next point; a slot with no copies left leaves the active
  // range. After a group's first pick, one fused cosine + min + max pass over the rest.
  for (;;) {
    order.push_back(index[slot]);
    const int32_t k = group[slot];
    const bool first_pick = picked[k]++ == 0;
    if (is_copy != nullptr) is_copy->push_back(first_pick ? 0 : 1);
    if (first_pick) {
      for (int32_t d = 0; d < dim; ++d) v[d] = at(slot, d);
    }
    if (picked[k] <= static_cast<int32_t>(copies[k].size())) {
      index[slot] = copies[k][picked[k] - 1];  // the next copy waits in the same slot
    } else {
      --active;
      if (slot != active) {
        for (int32_t d = 0; d < dim; ++d) std::swap(at(slot, d), at(active, d));
        std::swap(md[slot], md[active]);
        std::swap(index[slot], index[active]);
        std::swap(group[slot], group[active]);
      }
      md[active] = kChosen;  // stays inside the last block's pass: -1 never wins the max
    }
    if (static_cast<int32_t>(order.size()) == count) break;
    far = first_pick ? fn.update(blocked.data(), active, dim, v.data(), md) : MaxOf(md, active);
    slot = pick_at(far);
  }
  return order;
}

}  // namespace internal

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  return internal::FpsOrder(points, n, dim, count, internal::FpsKernel::kAuto);
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max, bool draw_on_fill)
    : head_dim_(head_dim),
      buffer_min_(buffer_min),
      buffer_max_(buffer_max),
      draw_on_fill_(draw_on_fill),
      buffer_(static_cast<size_t>(buffer_max) * head_dim) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
}

int64_t BeaconBank::CapacityBytes() const {
  return static_cast<int64_t>(buffer_max_) * head_dim_ * static_cast<int64_t>(sizeof(float));
}

void BeaconBank::Append(const float* query) {
  std::copy_n(query, head_dim_, buffer_.data() + static_cast<size_t>(size_) * head_dim_);
  ++size_;
  ++arrivals_;
  if (size_ == buffer_max_) Reduce();
}

void BeaconBank::Reduce() {
  if (size_ <= buffer_min_) return;
  const std::vector<int32_t> keep = internal::FpsOrder(
      buffer_.data(), size_, head_dim_, buffer_min_, internal::FpsKernel::kAuto, true, &copy_);
  // Survivors in FPS order, so the first n of them are the first n of the ordering.
  scratch_.resize(static_cast<size_t>(buffer_min_) * head_dim_);
  for (int32_t i = 0; i < buffer_min_; ++i) {
    std::copy_n(buffer_.data() + static_cast<size_t>(keep[i]) * head_dim_, head_dim_,
                scratch_.data() + static_cast<size_t>(i) * head_dim_);
  }
  std::copy(scratch_.begin(), scratch_.end(), buffer_.begin());
  size_ = buffer_min_;
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) {
  // Reuse the draw: the FPS that picks the beacons also reduces the buffer, so the next
  // compression starts from these survivors instead of drawing again from the same points.
  // With draw_on_fill a draw that still has n_beacons survivors is reused as it is, unless
  // as many arrivals as came since the last call would fill the buffer: then the buffer is
  // reduced here, in the compression, rather than in the middle of a later Append.
  const bool due = !draw_on_fill_ || ordered() < std::min(n_beacons, size_) ||
                   int64_t{size_} + arrivals_ >= buffer_max_;
  arrivals_ = 0;
  if (due) Reduce();
  const int32_t want = std::min(n_beacons, size_);
  out->resize(static_cast<size_t>(want) * head_dim_);
  // The first `want` points of an FPS ordering, less the copies of points already among
  // them (a copy would score every key the same).
  auto take = [&](auto&& row_of, const std::vector<uint8_t>& copy) {
    int32_t n = 0;
    for (int32_t b = 0; b < want; ++b) {
      if (copy[b] != 0) continue;
      std::copy_n(buffer_.data() + static_cast<size_t>(row_of(b)) * head_dim_, head_dim_,
                  out->data() + static_cast<size_t>(n++) * head_dim_);
    }
    return n;
  };
  int32_t n = want;
  if (ordered() >= want) {
    n = take([](int32_t b) { return b; }, copy_);
  } else if (want == size_) {
    // Every buffered query, in buffer order.
    std::copy_n(buffer_.data(), static_cast<size_t>(want) * head_dim_, out->data());
  } else {
    std::vector<uint8_t> copy;
    const std::vector<int32_t> order = internal::FpsOrder(buffer_.data(), size_, head_dim_, want,
                                                          internal::FpsKernel::kAuto, true, &copy);
    n = take([&](int32_t b) { return order[b]; }, copy);
  }
  out->resize(static_cast<size_t>(n) * head_dim_);
  rope.RotateMany(out->data(), n, position, out->data());
  return n;
}

}  // namespace beaconkv

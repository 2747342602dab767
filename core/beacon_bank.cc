#include "core/beacon_bank.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/multiversion.h"

namespace beaconkv {
namespace {

// Unit-normalised copy of `points`; zero rows stay zero.
std::vector<float> Normalised(const float* points, int32_t n, int32_t dim) {
  std::vector<float> unit(static_cast<size_t>(n) * dim);
  for (int32_t i = 0; i < n; ++i) {
    const float* p = points + static_cast<size_t>(i) * dim;
    double sq = 0.0;
    for (int32_t d = 0; d < dim; ++d) sq += static_cast<double>(p[d]) * p[d];
    const float inv = sq > 0.0 ? static_cast<float>(1.0 / std::sqrt(sq)) : 0.0f;
    for (int32_t d = 0; d < dim; ++d) unit[static_cast<size_t>(i) * dim + d] = p[d] * inv;
  }
  return unit;
}

// 16 floats: one AVX-512 register in the avx512f clone, split by the compiler elsewhere.
typedef float Vec16 __attribute__((vector_size(64)));
// Points per inner block: four independent accumulators, so the FMA chains over `dim` overlap.
constexpr int32_t kBlock = 64;

// One FPS pick's update over every point: cos = unit_t^T pick, min_dist = min(min_dist,
// 1 - cos); returns the largest min_dist. unit_t is [dim, stride] (points along a row, rows
// padded to whole blocks), so the cosines of kBlock points are `dim` FMAs per accumulator and
// no horizontal sums.
BKV_MULTIVERSION float UpdateMinDistances(const float* unit_t, int32_t n, int32_t stride,
                                          int32_t dim, const float* pick, float* min_dist) {
  float far = -1.0f;
  for (int32_t i0 = 0; i0 < n; i0 += kBlock) {
    Vec16 acc0 = {}, acc1 = {}, acc2 = {}, acc3 = {};
    for (int32_t d = 0; d < dim; ++d) {
      const float* col = unit_t + static_cast<size_t>(d) * stride + i0;
      Vec16 c0, c1, c2, c3;
      std::memcpy(&c0, col, sizeof(Vec16));
      std::memcpy(&c1, col + 16, sizeof(Vec16));
      std::memcpy(&c2, col + 32, sizeof(Vec16));
      std::memcpy(&c3, col + 48, sizeof(Vec16));
      const float pd = pick[d];
      acc0 += c0 * pd;
      acc1 += c1 * pd;
      acc2 += c2 * pd;
      acc3 += c3 * pd;
    }
    // min_dist rows are padded too (see CosineFarthestPointOrder), so whole blocks are safe;
    // padded lanes hold -1 and never win the max.
    Vec16 far_v = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f,
                   -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
    const Vec16* accs[4] = {&acc0, &acc1, &acc2, &acc3};
    for (int32_t q = 0; q < 4; ++q) {
      Vec16 md;
      std::memcpy(&md, min_dist + i0 + 16 * q, sizeof(Vec16));
      const Vec16 dist = 1.0f - *accs[q];
      md = md < dist ? md : dist;
      std::memcpy(min_dist + i0 + 16 * q, &md, sizeof(Vec16));
      far_v = far_v > md ? far_v : md;
    }
    for (int32_t l = 0; l < 16; ++l) far = std::max(far, far_v[l]);
  }
  return far;
}

}  // namespace

std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count) {
  BKV_CHECK(count >= 0 && count <= n);
  std::vector<int32_t> order;
  if (count == 0) return order;
  order.reserve(count);
  const std::vector<float> unit = Normalised(points, n, dim);  // [n, dim]
  auto row = [&](int32_t i) { return unit.data() + static_cast<size_t>(i) * dim; };

  std::vector<float> mean(dim, 0.0f);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t d = 0; d < dim; ++d) mean[d] += row(i)[d];
  }
  const std::vector<float> mean_dir = Normalised(mean.data(), 1, dim);
  std::vector<float> cos(n);
  cblas_sgemv(CblasRowMajor, CblasNoTrans, n, dim, 1.0f, unit.data(), dim, mean_dir.data(), 1, 0.0f,
              cos.data(), 1);
  int32_t seed = 0;
  float best = -1.0f;
  for (int32_t i = 0; i < n; ++i) {
    const float dist = 1.0f - cos[i];
    if (dist > best) {
      best = dist;
      seed = i;
    }
  }

  // unit transposed, each row padded to whole blocks: [dim, stride].
  const int32_t stride = (n + kBlock - 1) / kBlock * kBlock;
  std::vector<float> unit_t(static_cast<size_t>(dim) * stride, 0.0f);
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t d = 0; d < dim; ++d) unit_t[static_cast<size_t>(d) * stride + i] = row(i)[d];
  }

  // min_dist of a chosen point is -1, below every cosine distance (>= 0 up to rounding), so
  // it is never picked again. Each pick: one fused cosine + min + max pass, then the first
  // index holding the max (ties go to the earliest point).
  constexpr float kChosen = -1.0f;
  std::vector<float> min_dist(stride, kChosen);  // [stride]: padding never picked
  std::fill_n(min_dist.begin(), n, 2.0f);
  float* md = min_dist.data();
  int32_t pick = seed;
  for (;;) {
    order.push_back(pick);
    md[pick] = kChosen;
    if (static_cast<int32_t>(order.size()) == count) break;
    const float far = UpdateMinDistances(unit_t.data(), n, stride, dim, row(pick), md);
    pick = 0;
    while (md[pick] != far) ++pick;
  }
  return order;
}

BeaconBank::BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max)
    : head_dim_(head_dim),
      buffer_min_(buffer_min),
      buffer_max_(buffer_max),
      buffer_(static_cast<size_t>(buffer_max) * head_dim) {
  BKV_CHECK(head_dim >= 1 && buffer_min >= 1 && buffer_min < buffer_max);
}

int64_t BeaconBank::CapacityBytes() const {
  return static_cast<int64_t>(buffer_max_) * head_dim_ * static_cast<int64_t>(sizeof(float));
}

void BeaconBank::Append(const float* query) {
  std::copy_n(query, head_dim_, buffer_.data() + static_cast<size_t>(size_) * head_dim_);
  ++size_;
  if (size_ == buffer_max_) Reduce();
}

void BeaconBank::Reduce() {
  std::vector<int32_t> keep =
      CosineFarthestPointOrder(buffer_.data(), size_, head_dim_, buffer_min_);
  std::sort(keep.begin(), keep.end());  // survivors stay in arrival order
  for (int32_t i = 0; i < buffer_min_; ++i) {
    // keep[i] >= i, so moving forward in place never overwrites a survivor not yet moved.
    std::copy_n(buffer_.data() + static_cast<size_t>(keep[i]) * head_dim_, head_dim_,
                buffer_.data() + static_cast<size_t>(i) * head_dim_);
  }
  size_ = buffer_min_;
  ++num_reductions_;
}

int32_t BeaconBank::Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                            std::vector<float>* out) const {
  const int32_t n = std::min(n_beacons, size_);
  out->resize(static_cast<size_t>(n) * head_dim_);
  const std::vector<int32_t> order = CosineFarthestPointOrder(buffer_.data(), size_, head_dim_, n);
  for (int32_t b = 0; b < n; ++b) {
    std::copy_n(buffer_.data() + static_cast<size_t>(order[b]) * head_dim_, head_dim_,
                out->data() + static_cast<size_t>(b) * head_dim_);
  }
  rope.RotateMany(out->data(), n, position, out->data());
  return n;
}

}  // namespace beaconkv

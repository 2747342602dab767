// BeaconKV's per-(layer, kv_head) query buffer. Every decode step appends the group's
// pre-RoPE queries; when the buffer holds `buffer_max` queries, cosine farthest-point sampling
// reduces it to `buffer_min`, so geometrically rare queries (the revisiting ones) survive
// while near-duplicates of the common local queries are dropped. At compression time the
// buffer is reduced the same way (when it holds more than `buffer_min`) and the first
// `n_beacons` points of that FPS ordering, rotated to the current position, are the beacons:
// one draw serves both, instead of one FPS for the beacons and another when the buffer fills.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/rope.h"

namespace beaconkv {

// The first `count` indexes (count <= n) of the cosine farthest-point ordering of
// `points` ([n, dim]). Seed: the point with the largest cosine distance to the mean of the
// unit-normalised points; then repeatedly the point whose smallest cosine distance to the
// points already chosen is largest. Ties go to the earliest index. Zero vectors count as
// orthogonal to everything. Unit-vector components are rounded to multiples of 2^-14 first
// and cosines are exact integer dot products of the rounded vectors (int16 storage keeps the
// points in L1; the ordering is the same on every machine).
std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count);

namespace internal {

// Points stored as their norm (float) and their unit vector rounded to multiples of 2^-14
// (int16), in blocks of 64 points ([dim / 2][64][2] per block), the layout the FPS passes
// stream. Zero vectors stay zero. A point comes back as norm * rounded unit vector: each
// component within norm * 2^-15 of the original (finer than fp16 storage), in 2 bytes.
class PackedUnitVectors {
 public:
  static constexpr int32_t kMaxDim = 1024;
  void Reset(int32_t dim, int32_t capacity);  // empty, room for `capacity` points
  void Append(const float* point);            // one [dim] point
  void Keep(absl::Span<const int32_t> rows);  // keeps these rows, in this order
  int32_t size() const { return size_; }
  int32_t dim() const { return dim_; }
  int16_t At(int32_t i, int32_t d) const;    // round(2^14 * unit component d of point i)
  void Unpack(int32_t i, float* out) const;  // point i as stored: [dim]
  const int16_t* data() const { return data_.data(); }
  int64_t CapacityBytes() const;

 private:
  void Set(int32_t i, const int16_t* row);  // row: [dim]
  int32_t dim_ = 0;
  int32_t size_ = 0;
  std::vector<int16_t> data_;
  std::vector<float> norms_;  // [capacity]
};

// Which implementation of the FPS pass to run; every one gives the same ordering (integer dot
// products). kAuto: the fastest this machine supports. For tests and benchmarks.
enum class FpsKernel { kAuto, kPortable, kAvx2, kAvx512 };
bool FpsKernelSupported(FpsKernel kernel);

// CosineFarthestPointOrder over already packed points.
std::vector<int32_t> FpsOrder(const PackedUnitVectors& points, int32_t count,
                              FpsKernel kernel = FpsKernel::kAuto);

}  // namespace internal

class BeaconBank {
 public:
  BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max);

  // Appends one pre-RoPE query ([head_dim]); reduces to buffer_min on reaching buffer_max.
  void Append(const float* query);

  int32_t size() const { return packed_.size(); }
  int32_t head_dim() const { return head_dim_; }
  int64_t num_reductions() const { return num_reductions_; }
  // Buffered queries as stored (see PackedUnitVectors): survivors of the last reduction (in
  // FPS order), then arrivals since (oldest first): [size, head_dim].
  std::vector<float> Queries() const;
  // Bytes this buffer holds at capacity (buffer_max queries: int16 components + a norm).
  int64_t CapacityBytes() const;

  // Reduces the buffer to buffer_min (when larger), then writes min(n_beacons, size) beacons
  // into `out` ([n, head_dim]): the first points of the buffer's FPS ordering (every buffered
  // query, in buffer order, when n_beacons >= size), as stored, each rotated with `rope` to
  // `position`. Returns n.
  int32_t Beacons(int32_t n_beacons, const Rope& rope, int64_t position, std::vector<float>* out);

 private:
  // FPS down to buffer_min (no-op when size <= buffer_min); survivors stored in FPS order.
  void Reduce();

  int32_t head_dim_;
  int32_t buffer_min_;
  int32_t buffer_max_;
  int64_t num_reductions_ = 0;
  bool fps_ordered_ = false;  // rows are in FPS order (nothing appended since the last Reduce)
  internal::PackedUnitVectors packed_;  // the buffered queries
};

}  // namespace beaconkv

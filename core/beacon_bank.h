// BeaconKV's per-(layer, kv_head) query buffer. Every decode step appends the group's
// pre-RoPE queries; when the buffer holds `buffer_max` queries, cosine farthest-point sampling
// reduces it to `buffer_min`, so geometrically rare queries (the revisiting ones) survive
// while near-duplicates of the common local queries are dropped. At compression time the
// first `n_beacons` points of an FPS ordering are rotated to the current position.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rope.h"

namespace beaconkv {

// The first `count` indexes (count <= n) of the cosine farthest-point ordering of
// `points` ([n, dim]). Seed: the point with the largest cosine distance to the mean of the
// unit-normalised points; then repeatedly the point whose smallest cosine distance to the
// points already chosen is largest. Ties go to the earliest index. Zero vectors count as
// orthogonal to everything.
std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count);

class BeaconBank {
 public:
  BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max);

  // Appends one pre-RoPE query ([head_dim]); reduces to buffer_min on reaching buffer_max.
  void Append(const float* query);

  int32_t size() const { return size_; }
  int32_t head_dim() const { return head_dim_; }
  int64_t num_reductions() const { return num_reductions_; }
  // Buffered queries, oldest first: [size, head_dim].
  const float* data() const { return buffer_.data(); }
  // Bytes this buffer holds at capacity (buffer_max queries in float32).
  int64_t CapacityBytes() const;

  // Writes min(n_beacons, size) beacons into `out` ([n, head_dim]): the first points of the
  // FPS ordering of the buffer, each rotated with `rope` to `position`. Returns n.
  int32_t Beacons(int32_t n_beacons, const Rope& rope, int64_t position,
                  std::vector<float>* out) const;

 private:
  void Reduce();

  int32_t head_dim_;
  int32_t buffer_min_;
  int32_t buffer_max_;
  int32_t size_ = 0;
  int64_t num_reductions_ = 0;
  std::vector<float> buffer_;  // [buffer_max, head_dim]; the first size_ rows are live
};

}  // namespace beaconkv

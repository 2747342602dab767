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

#include "core/capped_growth.h"
#include "core/rope.h"

namespace beaconkv {

// The largest dim the FPS takes: its integer dot products cannot overflow below it.
inline constexpr int32_t kMaxFpsDim = 4096;
// A cosine distance of 1 (orthogonal unit vectors) in the FPS's integer units.
inline constexpr int32_t kFpsDistanceOne = 1 << 28;

// The first `count` indexes (count <= n) of the cosine farthest-point ordering of
// `points` ([n, dim], 1 <= dim <= 4096). Cosines are integer dot products of the unit vectors
// quantised to 16 bits (q = round(u * 2^14); 2^28 cos ≈ q_a . q_b, exact), so the ordering
// is the same on every machine and on the GPU. Seed: the point with the largest distance
// (2^28 - q . q_mean) to the mean of the unit-normalised points (normalised, then quantised
// the same way); then repeatedly the point whose smallest distance to the points already
// chosen is largest. Ties go to the earliest index. Zero vectors count as orthogonal to
// everything.
std::vector<int32_t> CosineFarthestPointOrder(const float* points, int32_t n, int32_t dim,
                                              int32_t count);

namespace internal {

// Which implementation of the FPS pass to run; integer dot products are exact, so every one
// gives the same ordering. kAuto: the fastest this machine supports. dedupe: exact duplicate
// rows share one slot (the same ordering, fewer dot products); off only to test that. is_copy
// (optional, needs dedupe): is_copy[j] = 1 when order[j] is bitwise equal to an earlier pick.
enum class FpsKernel { kAuto, kPortable, kAvx2, kAvx512 };  // kAvx512: with VNNI
bool FpsKernelSupported(FpsKernel kernel);
// stop_below > 0: the ordering stops early, before the first point (after the seed) whose
// distance to the points chosen is below stop_below (in the units above: 2^28 (1 - cos)).
std::vector<int32_t> FpsOrder(const float* points, int32_t n, int32_t dim, int32_t count,
                              FpsKernel kernel, bool dedupe = true,
                              std::vector<uint8_t>* is_copy = nullptr, int32_t stop_below = 0);
// What a kernel packs before the passes: the quantised unit vectors of the distinct rows of
// `points` (first occurrences, in index order; [distinct, dim]) and the sum of all n unit
// vectors (unquantised, in double). For tests: every kernel must give the same bits.
void FpsPack(const float* points, int32_t n, int32_t dim, FpsKernel kernel,
             std::vector<int16_t>* quantised, std::vector<double>* sum);

}  // namespace internal

class BeaconBank {
 public:
  // draw_on_fill: Beacons() reuses the last reduction's draw while it has n_beacons rows
  // (queries that arrived since wait in the buffer) instead of reducing and drawing at every
  // call; it reduces when the buffer would fill before the next call (as many arrivals as
  // since the last call would reach buffer_max).
  //
  // radius > 0 (a cosine distance, 1 - cos): a reduction stops drawing, before buffer_min,
  // at the first point within `radius` of the points drawn before it, so the buffer keeps
  // only queries at least that far apart (and a buffer of at most buffer_min is reduced
  // too); the beacons are the first n_beacons of those survivors. A draw cut short is reused
  // (with draw_on_fill) until as many queries arrived as would have filled the buffer after
  // a full one (buffer_max - buffer_min). 0 = every reduction draws buffer_min.
  //
  // bf16: the buffered queries are kept as bfloat16 (each rounded on arrival with
  // RoundToBf16), half the memory; draws and beacons read them widened back to float.
  BeaconBank(int32_t head_dim, int32_t buffer_min, int32_t buffer_max, bool draw_on_fill = false,
             double radius = 0.0, bool bf16 = false);

  // Appends one pre-RoPE query ([head_dim]); reduces to buffer_min on reaching buffer_max.
  // The row is written with non-temporal stores: fence them (StreamFence) before another
  // thread reads the bank.
  void Append(const float* query);

  int32_t size() const { return size_; }
  int32_t head_dim() const { return head_dim_; }
  int64_t num_reductions() const { return num_reductions_; }
  bool bf16() const { return bf16_; }
  // Buffered queries: survivors of the last reduction (in FPS order), then arrivals since
  // (oldest first): [size, head_dim], as float (bfloat16 values when bf16).
  std::vector<float> Rows() const;
  // Bytes this buffer holds at capacity (buffer_max queries of 4 bytes a value, 2 with bf16).
  int64_t CapacityBytes() const;
  // Bytes the buffer holds now (it grows with the appends, up to CapacityBytes()).
  int64_t HeldBytes() const {
    return static_cast<int64_t>(bf16_ ? buffer16_.capacity() * sizeof(uint16_t)
                                      : buffer_.capacity() * sizeof(float));
  }

  // Reduces the buffer to buffer_min (when larger), then writes the beacons into `out`
  // ([n, head_dim]): the first min(n_beacons, size) points of the buffer's FPS ordering
  // (every buffered query, in buffer order, when n_beacons >= size), each rotated with `rope`
  // to `position`. A drawn set (an FPS prefix) leaves out exact copies of a point already
  // among them (identical rows give identical scores; layer 0's queries repeat with the
  // token); the whole buffer, taken when n_beacons >= size, is returned as it is.
  // With draw_on_fill, when the survivors of the last reduction number at least n_beacons
  // and size + (queries appended since the last call) < buffer_max, the beacons are the
  // first n_beacons survivors and nothing is reduced. With a radius the beacons are always
  // the first (up to n_beacons) survivors of a draw (made now when due: see the
  // constructor). Returns n.
  int32_t Beacons(int32_t n_beacons, const Rope& rope, int64_t position, std::vector<float>* out);
  // The same beacons before RoPE (for a scorer that rotates them itself); the same draw.
  int32_t Beacons(int32_t n_beacons, std::vector<float>* out);

 private:
  // FPS down to buffer_min (no-op when size <= buffer_min), or with a radius until the
  // points left are within it (any size > 0); survivors stored in FPS order.
  void Reduce();
  // The buffer as [size, head_dim] floats: the buffer itself, or with bf16 widened into this
  // thread's working memory (valid until the thread's next call).
  const float* Points() const;
  // Rows [first, first + count) of the buffer into out ([count, head_dim] floats).
  void CopyRows(int32_t first, int32_t count, float* out) const;

  int32_t head_dim_;
  int32_t buffer_min_;
  int32_t buffer_max_;
  int32_t size_ = 0;
  bool draw_on_fill_;
  int32_t radius_;  // in kFpsDistanceOne units; 0 = off
  // Leading rows in FPS order: the last reduction's survivors stay first (arrivals are
  // appended behind them); 0 before the first reduction.
  int32_t ordered_ = 0;
  bool cut_ = false;  // the last reduction stopped at the radius
  int64_t num_reductions_ = 0;
  int64_t arrivals_ = 0;  // queries appended since the last Beacons()
  bool bf16_;
  // [size_, head_dim]; grows with the appends, up to buffer_max rows. With bf16, buffer16_
  // (bfloat16 bits) instead. (A reduction's survivors and a bf16 buffer widened for a draw
  // go through per-thread working memory, shared by every bank: a bank holds only this.)
  std::vector<float, internal::CacheAlignedRows<float>> buffer_;
  std::vector<uint16_t, internal::CacheAlignedRows<uint16_t>> buffer16_;
  std::vector<uint8_t> copy_;  // per survivor: 1 = a copy of an earlier survivor
};

}  // namespace beaconkv

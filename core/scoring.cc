#include "core/scoring.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/multiversion.h"

namespace beaconkv {
namespace {

// Cephes-style expf (relative error ~2 ulp) written so the compiler can vectorise it.
inline float ExpApprox(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kMagic) - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return e * std::bit_cast<float>(bits);
}

// Reductions keep 16 independent lanes so the compiler vectorises them without
// reassociating float math (no -ffast-math needed).
constexpr int32_t kLanes = 16;

BKV_MULTIVERSION float MaxOf(const float* x, int32_t n) {
  float lanes[kLanes];
  for (float& l : lanes) l = -std::numeric_limits<float>::infinity();
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], x[i + l]);
  }
  float m = -std::numeric_limits<float>::infinity();
  for (; i < n; ++i) m = std::max(m, x[i]);
  for (float l : lanes) m = std::max(m, l);
  return m;
}

BKV_MULTIVERSION float ExpShiftSum(float* x, int32_t n, float shift) {
  for (int32_t i = 0; i < n; ++i) x[i] = ExpApprox(x[i] - shift);
  float lanes[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += x[i];
  for (float l : lanes) sum += l;
  return sum;
}

// sum_i exp(x[i] - shift), x unchanged.
BKV_MULTIVERSION float ExpShiftSumOnly(const float* x, int32_t n, float shift) {
  float lanes[kLanes] = {};
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t l = 0; l < kLanes; ++l) lanes[l] += ExpApprox(x[i + l] - shift);
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += ExpApprox(x[i] - shift);
  for (float l : lanes) sum += l;
  return sum;
}

// acc[i] = max(acc[i], x[i] - shift).
BKV_MULTIVERSION void MaxShiftedInto(float* acc, const float* x, int32_t n, float shift) {
  for (int32_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i] - shift);
}

BKV_MULTIVERSION void ExpInPlace(float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) x[i] = ExpApprox(x[i]);
}

BKV_MULTIVERSION void Scale(float* x, int32_t n, float s) {
  for (int32_t i = 0; i < n; ++i) x[i] *= s;
}

BKV_MULTIVERSION void MaxInto(float* acc, const float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], x[i]);
}

BKV_MULTIVERSION void AddInto(float* acc, const float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) acc[i] += x[i];
}

}  // namespace

const char* GqaReductionName(GqaReduction r) {
  switch (r) {
    case GqaReduction::kMaxLogits:
      return "max of logits over the group, then softmax";
    case GqaReduction::kMaxProbs:
      return "softmax per query head, then max over the group";
    case GqaReduction::kMeanProbs:
      return "softmax per query head, then mean over the group";
  }
  return "?";
}

const char* QueryReductionName(QueryReduction r) {
  switch (r) {
    case QueryReduction::kMax:
      return "max";
    case QueryReduction::kMean:
      return "mean";
    case QueryReduction::kSum:
      return "sum";
  }
  return "?";
}

const char* PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kNone:
      return "none";
    case Pooling::kMax:
      return "maxpool";
    case Pooling::kAvg:
      return "avgpool";
  }
  return "?";
}

OrderedHead::OrderedHead(const HeadKeys& head, int32_t head_dim)
    : num_tokens_(head.num_tokens),
      head_dim_(head_dim),
      keys_(head.keys),
      positions_(head.positions) {
  BKV_CHECK(num_tokens_ >= 0);
  if (std::is_sorted(head.positions, head.positions + num_tokens_)) return;
  order_.resize(num_tokens_);
  std::iota(order_.begin(), order_.end(), 0);
  std::sort(order_.begin(), order_.end(),
            [&](int32_t a, int32_t b) { return head.positions[a] < head.positions[b]; });
  gathered_.resize(static_cast<size_t>(num_tokens_) * head_dim);
  sorted_pos_.resize(num_tokens_);
  for (int32_t i = 0; i < num_tokens_; ++i) {
    std::copy_n(head.keys + static_cast<size_t>(order_[i]) * head_dim, head_dim,
                gathered_.data() + static_cast<size_t>(i) * head_dim);
    sorted_pos_[i] = head.positions[order_[i]];
  }
  keys_ = gathered_.data();
  positions_ = sorted_pos_.data();
}

void SoftmaxInPlace(float* x, int32_t n) {
  if (n <= 0) return;
  const float m = MaxOf(x, n);
  const float sum = ExpShiftSum(x, n, m);
  Scale(x, n, 1.0f / sum);
}

void AttentionScores(const float* keys, int32_t begin, int32_t end, int32_t head_dim,
                     const float* queries, int32_t num_queries, int32_t group_size,
                     const ScoreSpec& spec, float* out, ScoreScratch* scratch) {
  const int32_t n = end - begin;
  if (n <= 0) return;
  std::fill(out, out + n, 0.0f);
  if (num_queries <= 0) return;
  BKV_CHECK(group_size >= 1 && head_dim >= 1);
  const int32_t rows = num_queries * group_size;
  scratch->logits.resize(static_cast<size_t>(rows) * n);
  scratch->row.resize(n);
  float* logits = scratch->logits.data();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, head_dim,
              1.0f / std::sqrt(static_cast<float>(head_dim)), queries, head_dim,
              keys + static_cast<size_t>(begin) * head_dim, head_dim, 0.0f, logits, n);

  if (spec.query == QueryReduction::kMax &&
      (group_size == 1 || spec.gqa == GqaReduction::kMaxProbs)) {
    // max over every row of its softmax = exp(max over rows of (logit - logsumexp of the
    // row)): one exp per element for the normaliser, none stored, and n exps at the end.
    std::fill(out, out + n, -std::numeric_limits<float>::infinity());
    for (int32_t r = 0; r < rows; ++r) {
      const float* row = logits + static_cast<size_t>(r) * n;
      const float m = MaxOf(row, n);
      const float lse = m + std::log(ExpShiftSumOnly(row, n, m));
      MaxShiftedInto(out, row, n, lse);
    }
    ExpInPlace(out, n);
    return;
  }
  float* red = scratch->row.data();
  for (int32_t q = 0; q < num_queries; ++q) {
    float* first = logits + static_cast<size_t>(q) * group_size * n;
    const float* reduced = red;
    if (group_size == 1) {
      SoftmaxInPlace(first, n);
      reduced = first;
    } else if (spec.gqa == GqaReduction::kMaxLogits) {
      std::copy_n(first, n, red);
      for (int32_t h = 1; h < group_size; ++h) MaxInto(red, first + static_cast<size_t>(h) * n, n);
      SoftmaxInPlace(red, n);
    } else {
      for (int32_t h = 0; h < group_size; ++h)
        SoftmaxInPlace(first + static_cast<size_t>(h) * n, n);
      std::copy_n(first, n, red);
      for (int32_t h = 1; h < group_size; ++h) {
        if (spec.gqa == GqaReduction::kMaxProbs) {
          MaxInto(red, first + static_cast<size_t>(h) * n, n);
        } else {
          AddInto(red, first + static_cast<size_t>(h) * n, n);
        }
      }
      if (spec.gqa == GqaReduction::kMeanProbs) Scale(red, n, 1.0f / group_size);
    }
    if (spec.query == QueryReduction::kMax) {
      MaxInto(out, reduced, n);  // probabilities are >= 0, so the zero start is neutral
    } else {
      AddInto(out, reduced, n);
    }
  }
  if (spec.query == QueryReduction::kMean) Scale(out, n, 1.0f / num_queries);
}

void Pool1d(Pooling pooling, int32_t kernel, absl::Span<float> scores) {
  if (pooling == Pooling::kNone || kernel <= 1 || scores.empty()) return;
  BKV_CHECK(kernel % 2 == 1);
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t half = kernel / 2;
  std::vector<float> src(scores.begin(), scores.end());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - half);
    const int64_t hi = std::min<int64_t>(n - 1, i + half);
    if (pooling == Pooling::kMax) {
      float m = src[lo];
      for (int64_t j = lo + 1; j <= hi; ++j) m = std::max(m, src[j]);
      scores[i] = m;
    } else {
      float s = 0.0f;
      for (int64_t j = lo; j <= hi; ++j) s += src[j];
      scores[i] = s / static_cast<float>(kernel);
    }
  }
}

absl::Status ValidatePoolKernel(int32_t kernel, const char* policy) {
  if (kernel < 1 || kernel % 2 == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pool_kernel must be odd and >= 1 (1 = no pooling), got %d", policy, kernel));
  }
  return absl::OkStatus();
}

}  // namespace beaconkv

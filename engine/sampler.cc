#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_format.h"

namespace beaconkv {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    return absl::InvalidArgumentError(absl::StrFormat("temperature=%g, must be >= 0", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return absl::InvalidArgumentError(absl::StrFormat("top_p=%g, must be in (0, 1]", top_p));
  if (max_new_tokens < 1)
    return absl::InvalidArgumentError(
        absl::StrFormat("max_new_tokens=%d, must be >= 1", max_new_tokens));
  return absl::OkStatus();
}

int32_t Argmax(absl::Span<const float> logits) {
  // The first largest logit, NaN skipped (std::max_element would keep a leading NaN); 0 when
  // every logit is NaN.
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
  }
  return std::max(best, 0);
}

int32_t Sampler::Sample(absl::Span<const float> logits) {
  if (params_.temperature == 0.0f) return Argmax(logits);
  const int32_t n = static_cast<int32_t>(logits.size());
  // The largest logit that is a number; NaN logits (a model loaded with allow_nonfinite) get
  // probability 0, so that the order below stays a strict weak order. With no finite
  // logit to weigh, or a +inf among them, the choice is the argmax's.
  float mx = -std::numeric_limits<float>::infinity();
  for (const float l : logits) mx = l > mx ? l : mx;
  if (!std::isfinite(mx)) return Argmax(logits);
  std::vector<double> p(n);
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    const double e = std::exp((logits[i] - mx) / params_.temperature);
    sum += p[i] = std::isnan(e) ? 0.0 : e;
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Descending probability, ties -> lower id: a total order, so the nucleus is well defined.
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  double kept = 0.0;
  int32_t cut = 0;
  while (cut < n && (cut == 0 || kept < params_.top_p * sum)) kept += p[order[cut++]];
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept;
  double acc = 0.0;
  for (int32_t i = 0; i < cut; ++i) {
    acc += p[order[i]];
    if (u < acc) return order[i];
  }
  return order[cut - 1];
}

}  // namespace beaconkv

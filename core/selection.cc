#include "core/selection.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace beaconkv {
namespace {

// A score as the selections rank it: NaN (a score computed from NaN queries or keys, or
// handed in by an external scorer) ranks below every number, so that the comparisons stay
// a strict weak order (std::nth_element's precondition) whatever the scores hold.
float RankKey(float score) {
  return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
}

}  // namespace

void PositionOrder(absl::Span<const int32_t> positions, std::vector<int32_t>* order) {
  const auto n = static_cast<int32_t>(positions.size());
  order->resize(n);
  if (n == 0) return;
  const auto [lo, hi] = std::minmax_element(positions.begin(), positions.end());
  const int64_t min = *lo;
  if (int64_t{*hi} - min >= (int64_t{1} << 16)) {
    // (position, index) in one integer: a plain integer sort.
    std::vector<uint64_t> packed(n);
    for (int32_t i = 0; i < n; ++i) {
      packed[i] =
          static_cast<uint64_t>(int64_t{positions[i]} - min) << 32 | static_cast<uint32_t>(i);
    }
    std::sort(packed.begin(), packed.end());
    for (int32_t i = 0; i < n; ++i) (*order)[i] = static_cast<int32_t>(packed[i] & 0xFFFFFFFFu);
    return;
  }
  // Least significant digit first; each pass is stable, so equal positions stay in index order.
  std::vector<int32_t> low_first(n);
  auto digit = [&](int32_t i, int shift) {
    return static_cast<uint32_t>(int64_t{positions[i]} - min) >> shift & 0xFFu;
  };
  auto pass = [&](const int32_t* in, int32_t* out, int shift) {
    std::array<int32_t, 257> start{};
    for (int32_t j = 0; j < n; ++j) ++start[digit(in[j], shift) + 1];
    for (int b = 0; b < 256; ++b) start[b + 1] += start[b];
    for (int32_t j = 0; j < n; ++j) out[start[digit(in[j], shift)]++] = in[j];
  };
  std::iota(order->begin(), order->end(), 0);
  pass(order->data(), low_first.data(), 0);
  pass(low_first.data(), order->data(), 8);
}

std::vector<int32_t> TopKUnprotected(const HeadCandidates& head, int64_t k) {
  const int32_t n = static_cast<int32_t>(head.positions.size());
  BKV_CHECK(head.protect.size() == head.positions.size());
  BKV_CHECK(head.scores.size() == head.positions.size());
  std::vector<int32_t> cand;
  cand.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    if (!head.protect[i]) cand.push_back(i);
  }
  if (k <= 0) return {};
  if (k >= static_cast<int64_t>(cand.size())) return cand;
  // (score, position) as one integer that orders as the pair does, so the selection compares
  // integers: RankKey's score (-0 made +0, so that the zeros tie as they compare) with its
  // bits flipped into unsigned order, then the position offset to unsigned.
  struct Keyed {
    uint64_t key;
    int32_t index;
  };
  std::vector<Keyed> keyed(cand.size());
  for (size_t c = 0; c < cand.size(); ++c) {
    const int32_t i = cand[c];
    const auto bits = std::bit_cast<uint32_t>(RankKey(head.scores[i]) + 0.0f);
    const uint32_t ordered = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
    const uint32_t position = static_cast<uint32_t>(head.positions[i]) ^ 0x80000000u;
    keyed[c] = {uint64_t{ordered} << 32 | position, i};
  }
  std::nth_element(keyed.begin(), keyed.begin() + k, keyed.end(),
                   [](const Keyed& a, const Keyed& b) { return a.key > b.key; });
  for (int64_t c = 0; c < k; ++c) cand[c] = keyed[c].index;
  cand.resize(k);
  return cand;
}

std::vector<int32_t> CoverageUnprotected(absl::Span<const int32_t> positions,
                                         absl::Span<const uint8_t> protect, int64_t k) {
  const int32_t n = static_cast<int32_t>(positions.size());
  std::vector<int32_t> free;
  for (int32_t i = 0; i < n; ++i) {
    if (!protect[i]) free.push_back(i);
  }
  if (k <= 0) return {};
  if (static_cast<int64_t>(free.size()) <= k) return free;
  const int64_t lo = positions[free.front()];
  const int64_t span = int64_t{positions[free.back()]} - lo + 1;
  std::vector<int32_t> out;
  out.reserve(k);
  int64_t last_stratum = -1;
  for (int32_t i : free) {
    const int64_t stratum = (positions[i] - lo) * k / span;
    if (stratum != last_stratum) {
      out.push_back(i);
      last_stratum = stratum;
    }
  }
  return out;
}

std::vector<int32_t> SelectUniform(const HeadCandidates& head, int64_t budget) {
  const int32_t n = static_cast<int32_t>(head.positions.size());
  int64_t num_protected = 0;
  for (int32_t i = 0; i < n; ++i) num_protected += head.protect[i] ? 1 : 0;
  std::vector<uint8_t> keep_mask(head.protect.begin(), head.protect.end());
  for (int32_t i : TopKUnprotected(head, budget - num_protected)) keep_mask[i] = 1;
  std::vector<int32_t> keep;
  keep.reserve(std::min<int64_t>(n, std::max<int64_t>(budget, num_protected)));
  for (int32_t i = 0; i < n; ++i) {
    if (keep_mask[i]) keep.push_back(i);
  }
  return keep;
}

std::vector<std::vector<int32_t>> SelectPooled(absl::Span<const HeadCandidates> heads,
                                               int64_t layer_budget) {
  struct Entry {
    float score;
    int32_t position;
    int32_t head;
    int32_t index;
  };
  std::vector<std::vector<int32_t>> keep(heads.size());
  std::vector<Entry> entries;
  int64_t num_protected = 0;
  for (size_t h = 0; h < heads.size(); ++h) {
    const HeadCandidates& c = heads[h];
    const int32_t n = static_cast<int32_t>(c.positions.size());
    double mass = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      if (c.protect[i]) {
        keep[h].push_back(i);
        ++num_protected;
      } else {
        mass += c.scores[i];
      }
    }
    const float inv = mass > 0.0 ? static_cast<float>(1.0 / mass) : 0.0f;
    for (int32_t i = 0; i < n; ++i) {
      if (!c.protect[i]) {
        entries.push_back({RankKey(c.scores[i] * inv), c.positions[i], static_cast<int32_t>(h), i});
      }
    }
  }
  const int64_t k = std::min<int64_t>(std::max<int64_t>(layer_budget - num_protected, 0),
                                      static_cast<int64_t>(entries.size()));
  auto better = [](const Entry& a, const Entry& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.position != b.position) return a.position > b.position;
    return a.head < b.head;
  };
  if (k < static_cast<int64_t>(entries.size())) {
    std::nth_element(entries.begin(), entries.begin() + k, entries.end(), better);
  }
  for (int64_t e = 0; e < k; ++e) keep[entries[e].head].push_back(entries[e].index);
  for (auto& v : keep) std::sort(v.begin(), v.end());
  return keep;
}

}  // namespace beaconkv

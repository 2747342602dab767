// Helpers for the policy tests: one head's keys and query history built in position order,
// stored in a shuffled slot order (as after compaction), run through RunPolicyOnHead, and
// the result mapped back to kept positions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "core/policy.h"
#include "gtest/gtest.h"

namespace beaconkv::testing {

struct HeadCase {
  int32_t head_dim = 2;
  int32_t group_size = 1;
  int32_t prompt_len = 0;
  int32_t current_position = -1;
  std::vector<float> keys;               // [n, head_dim], position order
  std::vector<int32_t> positions;        // [n], ascending
  std::vector<float> pre;                // [steps, group_size, head_dim]
  std::vector<float> post;               // [steps, group_size, head_dim]
  std::vector<int32_t> query_positions;  // [steps]

  int32_t num_tokens() const { return static_cast<int32_t>(positions.size()); }
  void AddKey(int32_t position, std::vector<float> k) {
    positions.push_back(position);
    keys.insert(keys.end(), k.begin(), k.end());
  }
  // One step: vectors of head_dim values are used for every query head; vectors of
  // group_size * head_dim values give each query head its own.
  void AddStep(int32_t position, const std::vector<float>& pre_q,
               const std::vector<float>& post_q) {
    query_positions.push_back(position);
    for (int32_t h = 0; h < group_size; ++h) {
      const bool full = static_cast<int32_t>(pre_q.size()) == group_size * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) {
        pre.push_back(full ? pre_q[h * head_dim + d] : pre_q[d]);
        post.push_back(full ? post_q[h * head_dim + d] : post_q[d]);
      }
    }
  }
};

// A random unit vector of dimension d.
inline std::vector<float> Unit(std::mt19937& rng, int32_t d) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(d);
  double sq = 0;
  for (float& x : v) {
    x = dist(rng);
    sq += x * x;
  }
  for (float& x : v) x /= static_cast<float>(std::sqrt(sq));
  return v;
}

// center plus normal noise, times scale.
inline std::vector<float> Near(std::mt19937& rng, const std::vector<float>& center, float noise,
                               float scale) {
  std::normal_distribution<float> dist(0.0f, noise);
  std::vector<float> v(center.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (center[i] + dist(rng));
  return v;
}

// The cosine of two vectors, in double.
inline double Cos(const float* a, const float* b, int32_t d) {
  double ab = 0, aa = 0, bb = 0;
  for (int32_t i = 0; i < d; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

inline RopeConfig TestRope(int32_t head_dim) {
  RopeConfig r;
  r.head_dim = head_dim;
  r.rope_theta = 10000.0;
  return r;
}

// Kept positions, ascending. shuffle_seed 0 keeps slot order == position order.
inline absl::StatusOr<std::vector<int32_t>> KeptPositions(const PolicyConfig& config,
                                                          const HeadCase& c,
                                                          uint32_t shuffle_seed = 0) {
  const int32_t n = c.num_tokens();
  std::vector<int32_t> slot_of(n);  // position-order index -> slot
  std::iota(slot_of.begin(), slot_of.end(), 0);
  if (shuffle_seed != 0) {
    std::mt19937 rng(shuffle_seed);
    std::shuffle(slot_of.begin(), slot_of.end(), rng);
  }
  std::vector<float> keys(c.keys.size());
  std::vector<int32_t> positions(n);
  for (int32_t i = 0; i < n; ++i) {
    std::copy_n(c.keys.begin() + static_cast<ptrdiff_t>(i) * c.head_dim, c.head_dim,
                keys.begin() + static_cast<ptrdiff_t>(slot_of[i]) * c.head_dim);
    positions[slot_of[i]] = c.positions[i];
  }
  OneHeadInput in;
  in.keys = {keys.data(), positions.data(), n};
  in.prompt_len = c.prompt_len;
  in.group_size = c.group_size;
  in.num_steps = static_cast<int32_t>(c.query_positions.size());
  in.queries_pre = c.pre.data();
  in.queries_post = c.post.data();
  in.query_positions = c.query_positions.data();
  in.current_position = c.current_position;
  absl::StatusOr<std::vector<int32_t>> slots = RunPolicyOnHead(config, TestRope(c.head_dim), in);
  if (!slots.ok()) return slots.status();
  EXPECT_TRUE(std::is_sorted(slots->begin(), slots->end()));
  std::vector<int32_t> kept;
  for (int32_t s : *slots) kept.push_back(positions[s]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace beaconkv::testing

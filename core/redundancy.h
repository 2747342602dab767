// R-KV's redundancy term for one head (rkv/utils.py cal_similarity, retain_direction="last").
#pragma once

#include <cstdint>

namespace beaconkv {

// keys: [n, head_dim] in position order. out: [n].
// S = cosine similarity of every key pair (k / (|k| + 1e-8)), diagonal set to zero. In each
// row i the most recent key j with S_ij > threshold (the newest near-duplicate) is zeroed, so
// it is protected while older duplicates look redundant. out_j = softmax_j(mean_i S_ij).
// Unlike the R-KV code, a row with no key above the threshold zeroes nothing (the code
// zeroes S_i0 in that case, an artefact of argmax over an all-zero mask).
void RedundancyScores(const float* keys, int32_t n, int32_t head_dim, float threshold, float* out);

}  // namespace beaconkv
